"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "gain": "trainperf.diagnosis.gain", "step_gain": "trainperf.diagnosis.gain",
    "fraction": "trainperf.diagnosis.gain"})

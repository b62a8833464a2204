"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "MAX_TOKENS_PER_S": "trainperf.diagnosis.screen", "MAX_STEP_TIME_S": "trainperf.diagnosis.screen",
    "MAX_TRAIN_TIME_S": "trainperf.diagnosis.screen", "MAX_BYTES": "trainperf.diagnosis.screen",
    "SUMMARY_BOUNDS": "trainperf.diagnosis.screen", "screen_run": "trainperf.diagnosis.screen",
    "no_steps": "trainperf.diagnosis.screen"})

"""Moved to :mod:`trainperf.tracegen.generate`: the generators of traces with known answers (test and benchmark
fixtures) live apart from the shipped reader. This path forwards their names, deprecated, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "KINDS": "trainperf.tracegen.generate", "A100": "trainperf.tracegen.generate",
    "H100": "trainperf.tracegen.generate", "EW": "trainperf.tracegen.generate",
    "NAMES": "trainperf.tracegen.generate", "make_trace": "trainperf.tracegen.generate"})

"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "PALETTE": "trainperf.diagnosis.charts", "PHASE_COLORS": "trainperf.diagnosis.charts",
    "W": "trainperf.diagnosis.charts", "H": "trainperf.diagnosis.charts", "LEFT": "trainperf.diagnosis.charts",
    "RIGHT": "trainperf.diagnosis.charts", "TOP": "trainperf.diagnosis.charts",
    "BOTTOM": "trainperf.diagnosis.charts", "MAX_LABELS": "trainperf.diagnosis.charts",
    "MAX_POINTS": "trainperf.diagnosis.charts", "nice_ticks": "trainperf.diagnosis.charts",
    "fmt_tick": "trainperf.diagnosis.charts", "line_chart": "trainperf.diagnosis.charts",
    "stacked_area": "trainperf.diagnosis.charts", "stacked_bars": "trainperf.diagnosis.charts",
    "CSS": "trainperf.diagnosis.charts", "figure": "trainperf.diagnosis.charts",
    "page": "trainperf.diagnosis.charts", "table": "trainperf.diagnosis.charts"})

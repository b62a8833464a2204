"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "MIN_GAIN": "trainperf.diagnosis.rules_trace", "BREAKDOWN": "trainperf.diagnosis.text",
    "rank_lines": "trainperf.diagnosis.text", "ranks_lines": "trainperf.diagnosis.text",
    "skipped_lines": "trainperf.diagnosis.text", "findings_lines": "trainperf.diagnosis.text",
    "left_lines": "trainperf.diagnosis.text", "verdict": "trainperf.diagnosis.text",
    "format_traces": "trainperf.diagnosis.text", "format_run_traces": "trainperf.diagnosis.text"})

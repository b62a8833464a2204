"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "BREAKDOWN": "trainperf.diagnosis.text", "BREAKDOWN_COLORS": "trainperf.diagnosis.trace_report",
    "TEMPORAL_COLORS": "trainperf.diagnosis.trace_report", "chart_breakdown": "trainperf.diagnosis.trace_report",
    "chart_temporal": "trainperf.diagnosis.trace_report", "chart_ranks": "trainperf.diagnosis.trace_report",
    "rank_table": "trainperf.diagnosis.trace_report", "findings_html": "trainperf.diagnosis.page",
    "trace_section": "trainperf.diagnosis.trace_report", "default_out": "trainperf.diagnosis.trace_report",
    "build_trace_report": "trainperf.diagnosis.trace_report"})

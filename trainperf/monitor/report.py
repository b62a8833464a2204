"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "COMPILE_PHASE": "trainperf.diagnosis.run_evidence", "compute_summary": "trainperf.diagnosis.run_evidence",
    "diagnose_run": "trainperf.diagnosis.engine", "known_lines": "trainperf.diagnosis.text",
    "load_screened": "trainperf.diagnosis.run_evidence", "phase_order": "trainperf.diagnosis.report",
    "CHARTS": "trainperf.diagnosis.report", "write_charts": "trainperf.diagnosis.report",
    "summary_rows": "trainperf.diagnosis.report", "findings_html": "trainperf.diagnosis.page",
    "build_report": "trainperf.diagnosis.report"})

"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "COMPILE_PHASE": "trainperf.diagnosis.run_evidence", "diagnose_run": "trainperf.diagnosis.engine",
    "load_run": "trainperf.diagnosis.rundir", "MAX_BYTES": "trainperf.diagnosis.screen",
    "MAX_STEP_TIME_S": "trainperf.diagnosis.screen", "MAX_TOKENS_PER_S": "trainperf.diagnosis.screen",
    "MAX_TRAIN_TIME_S": "trainperf.diagnosis.screen", "SUMMARY_BOUNDS": "trainperf.diagnosis.screen",
    "IGNORED_KEYS": "trainperf.diagnosis.compare", "LOSS_WINDOW": "trainperf.diagnosis.compare",
    "flatten": "trainperf.diagnosis.compare", "config_diff": "trainperf.diagnosis.compare",
    "peak_memory": "trainperf.diagnosis.compare", "tokens_per_step": "trainperf.diagnosis.compare",
    "compare_runs": "trainperf.diagnosis.compare", "labels": "trainperf.diagnosis.compare",
    "headlines": "trainperf.diagnosis.compare", "table_rows": "trainperf.diagnosis.compare",
    "findings_of": "trainperf.diagnosis.compare", "notes": "trainperf.diagnosis.compare",
    "format_compare": "trainperf.diagnosis.compare", "compare_text": "trainperf.diagnosis.compare",
    "compare_json": "trainperf.diagnosis.compare", "build_compare_report": "trainperf.diagnosis.compare"})

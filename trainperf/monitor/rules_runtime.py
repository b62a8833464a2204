"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release. Gone:
RUNTIME_RULES: the
rules' applicability is now the fields they need (``trainperf.diagnosis.rules.Rule.needs``)."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "gain": "trainperf.diagnosis.gain", "step_gain": "trainperf.diagnosis.gain",
    "straggler_by_trace": "trainperf.diagnosis.rules_trace",
    "STRAGGLER_RATIO": "trainperf.diagnosis.rules_runtime", "STRAGGLER_CRIT": "trainperf.diagnosis.rules_runtime",
    "STRAGGLER_MIN_GAP_S": "trainperf.diagnosis.rules_runtime",
    "COMPILE_PHASE": "trainperf.diagnosis.run_evidence", "COMPILE_INFO_FRAC": "trainperf.diagnosis.rules_runtime",
    "HOST_MIN_CORES": "trainperf.diagnosis.rules_runtime", "HOST_MIN_SHARE": "trainperf.diagnosis.rules_runtime",
    "MACHINE_BUSY_PCT": "trainperf.diagnosis.rules_runtime",
    "HOST_CRIT_SHARE": "trainperf.diagnosis.rules_runtime", "SPREAD_WARN": "trainperf.diagnosis.rules_runtime",
    "SPREAD_CRIT": "trainperf.diagnosis.rules_runtime", "SPREAD_MIN_STEPS": "trainperf.diagnosis.rules_runtime",
    "CLOCKS": "trainperf.diagnosis.rules_runtime", "pct": "trainperf.diagnosis.rules_step",
    "rank_compute_windows": "trainperf.diagnosis.run_evidence", "straggler": "trainperf.diagnosis.rules_runtime",
    "host_contention": "trainperf.diagnosis.rules_runtime", "compile_time": "trainperf.diagnosis.rules_runtime",
    "oom_recovered": "trainperf.diagnosis.rules_runtime"})

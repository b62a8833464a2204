"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release. Gone:
RUNTIME_RULES, NOT_FROM_TRACE, TRACE_RULES, comm_bound_trace, data_bound_trace, XLA_RECOMPILE_RULE,
GPU_ONLY_TRACE_RULES: the rules' applicability is now the fields they need (``trainperf.diagnosis.rules.Rule.needs``)."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "fraction": "trainperf.diagnosis.gain", "step_gain": "trainperf.diagnosis.gain",
    "COMPILE_PHASE": "trainperf.diagnosis.run_evidence",
    "rank_compute_windows": "trainperf.diagnosis.run_evidence", "known_state": "trainperf.diagnosis.rundir",
    "load_run": "trainperf.diagnosis.rundir", "rank_of": "trainperf.diagnosis.rundir",
    "no_steps": "trainperf.diagnosis.screen", "screen_run": "trainperf.diagnosis.screen",
    "SEVERITY_ORDER": "trainperf.diagnosis.rules", "DATA_WARN": "trainperf.diagnosis.rules_step",
    "DATA_CRIT": "trainperf.diagnosis.rules_step", "COMM_WARN": "trainperf.diagnosis.rules_step",
    "COMM_CRIT": "trainperf.diagnosis.rules_step", "IO_CPU_RATIO": "trainperf.diagnosis.rules_step",
    "LOW_MFU_CATALOG": "trainperf.diagnosis.rules_step", "LAUNCH_BUSY_PCT": "trainperf.diagnosis.rules_step",
    "MEMORY_USED_FRAC": "trainperf.diagnosis.rules_step", "TARGET_GPU_UTIL": "trainperf.diagnosis.rules_step",
    "TARGET_SM_EFF": "trainperf.diagnosis.rules_step", "TARGET_MEMCOPY": "trainperf.diagnosis.rules_step",
    "Rule": "trainperf.diagnosis.rules", "compute_summary": "trainperf.diagnosis.run_evidence",
    "RULES": "trainperf.diagnosis.rules", "apply_rules": "trainperf.diagnosis.engine",
    "load_screened": "trainperf.diagnosis.run_evidence", "diagnose": "trainperf.diagnosis.engine",
    "RUN_NOTE_KEYS": "trainperf.diagnosis.run_evidence", "diagnose_run": "trainperf.diagnosis.engine",
    "known_lines": "trainperf.diagnosis.text", "format_findings": "trainperf.diagnosis.text",
    "rules_markdown": "trainperf.diagnosis.rules"})

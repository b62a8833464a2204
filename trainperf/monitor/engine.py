"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release. Gone:
read_traces: the
rules' applicability is now the fields they need (``trainperf.diagnosis.rules.Rule.needs``)."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "read_traces": "trainperf.trace.job",
    "RULES": "trainperf.diagnosis.rules", "SEVERITY_ORDER": "trainperf.diagnosis.rules",
    "apply_rules": "trainperf.diagnosis.engine", "diagnose_run": "trainperf.diagnosis.engine",
    "load_screened": "trainperf.diagnosis.run_evidence", "fraction": "trainperf.diagnosis.gain",
    "evidence": "trainperf.diagnosis.trace_evidence", "headroom": "trainperf.diagnosis.trace_evidence",
    "public": "trainperf.diagnosis.trace_evidence", "diagnose_results": "trainperf.diagnosis.engine",
    "diagnose_path": "trainperf.diagnosis.engine", "with_traces": "trainperf.diagnosis.engine",
    "contract": "trainperf.diagnosis.engine"})

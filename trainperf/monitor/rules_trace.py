"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release. Gone:
NOT_FROM_TRACE, data_bound_trace, comm_bound_trace, TRACE_RULES: the
rules' applicability is now the fields they need (``trainperf.diagnosis.rules.Rule.needs``)."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "step_gain": "trainperf.diagnosis.gain", "MIN_GAIN": "trainperf.diagnosis.rules_trace",
    "FP32_WARN": "trainperf.diagnosis.rules_trace", "FP32_CRIT": "trainperf.diagnosis.rules_trace",
    "OCC_LOW_PCT": "trainperf.diagnosis.rules_trace", "OCC_MIN_SHARE": "trainperf.diagnosis.rules_trace",
    "OCC_MIN_BUSY": "trainperf.diagnosis.rules_trace", "TC_OVER_FP32": "trainperf.diagnosis.rules_trace",
    "NEEDS_TRACE": "trainperf.diagnosis.run_evidence", "fp32_on_tensor_cores": "trainperf.diagnosis.rules_trace",
    "pageable_copies": "trainperf.diagnosis.rules_trace", "host_syncs": "trainperf.diagnosis.rules_trace",
    "low_occupancy": "trainperf.diagnosis.rules_trace", "straggler_by_trace": "trainperf.diagnosis.rules_trace"})

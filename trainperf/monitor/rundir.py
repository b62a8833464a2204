"""Moved to :mod:`trainperf.diagnosis` (the diagnosis has a package of its own): this path is deprecated and
forwards its names, with a DeprecationWarning, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "read_jsonl": "trainperf.diagnosis.rundir", "run_files": "trainperf.diagnosis.rundir",
    "rank_of": "trainperf.diagnosis.rundir", "merge_parts": "trainperf.diagnosis.rundir",
    "known_state": "trainperf.diagnosis.rundir", "load_run": "trainperf.diagnosis.rundir"})

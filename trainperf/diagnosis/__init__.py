"""Diagnosis: where a training job's time goes, why, what to change and what it would gain.

One evidence model (:mod:`~trainperf.diagnosis.evidence`) that every reader fills: a run directory
(:mod:`~trainperf.diagnosis.run_evidence`), profiler traces and Nsight captures, one rank at a time
(:mod:`~trainperf.diagnosis.trace_evidence`, over the torch-free readers of :mod:`trainperf.trace`). One rule
table (:mod:`~trainperf.diagnosis.rules`), whose checks read fields and never where they came from. The engine
(:mod:`~trainperf.diagnosis.engine`) runs the table over each rank and gives the ``--json`` contract; the text
(:mod:`~trainperf.diagnosis.text`), the HTML reports (:mod:`~trainperf.diagnosis.report`,
:mod:`~trainperf.diagnosis.trace_report`, one findings table in :mod:`~trainperf.diagnosis.page`) and
``compare`` (:mod:`~trainperf.diagnosis.compare`) render it. Importing this package imports neither torch nor
its modules until a name is used::

    from trainperf.diagnosis import diagnose_path
    result = diagnose_path("runs/demo")          # or a trace, or a directory of traces
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

_LAZY = {
    "diagnose": ("trainperf.diagnosis.engine", "diagnose"),
    "diagnose_path": ("trainperf.diagnosis.engine", "diagnose_path"),
    "apply_rules": ("trainperf.diagnosis.engine", "apply_rules"),
    "Evidence": ("trainperf.diagnosis.evidence", "Evidence"),
    "RULES": ("trainperf.diagnosis.rules", "RULES"),
    "Rule": ("trainperf.diagnosis.rules", "Rule"),
    "build_report": ("trainperf.diagnosis.report", "build_report"),
    "build_trace_report": ("trainperf.diagnosis.trace_report", "build_trace_report"),
    "compare_runs": ("trainperf.diagnosis.compare", "compare_runs"),
    "format_findings": ("trainperf.diagnosis.text", "format_findings"),
    "format_traces": ("trainperf.diagnosis.text", "format_traces"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_names("trainperf.diagnosis", globals(), _LAZY)

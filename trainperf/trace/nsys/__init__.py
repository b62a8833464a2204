"""Nsight Systems captures, read torch-free into the same per-rank Timeline the torch.profiler reader builds, so
every figure and rule is the same code (:mod:`trainperf.trace.analyze`).

* ``analyze_capture(path, *, patterns=None, top_n=10, step=None, progress=None) -> list[dict]``: one rank's
  figures per GPU (or per process sharing a GPU, or per capture of a directory), with the nsys-only keys
  (``gpu_metrics`` measured by the GPU's counters, ``rank_hint``, ``capture``, ``allocator``,
  ``figure_sources``).
* ``read_capture(path, *, step=None, progress=None) -> list[(label, Timeline)]``.
* ``is_nsys_export(path) -> bool``; ``export_report(path.nsys-rep) -> Path`` (runs ``nsys export`` when it
  is on PATH, else a UserError that prints the command).

PATH: an export (``nsys export --type=sqlite``), a ``.nsys-rep`` report, or a directory of them. A file that
is not an export is a :class:`~trainperf.errors.UserError` naming it (exit 2 on the CLI).
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

_LAZY = {
    "analyze_capture": ("trainperf.trace.nsys.capture", "analyze_capture"),
    "read_capture": ("trainperf.trace.nsys.capture", "read_capture"),
    "iter_capture": ("trainperf.trace.nsys.capture", "iter_capture"),
    "capture_files": ("trainperf.trace.nsys.capture", "capture_files"),
    "export_report": ("trainperf.trace.nsys.capture", "export_report"),
    "is_nsys_export": ("trainperf.trace.nsys.schema", "is_nsys_export"),
}
__getattr__ = lazy_names(__name__, globals(), _LAZY)
__all__ = sorted(_LAZY)

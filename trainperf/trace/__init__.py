"""Torch-free, streaming reader of torch.profiler (Kineto / Chrome) traces and their per-rank figures.

``analyze_file(path, rank=None, patterns=None, top_n=10, progress=None) -> dict``: one rank's figures
(step-time breakdown and GPU metrics as the TensorBoard plugin defines them, temporal / idle breakdowns
and overlap as HTA does, kernels by class, launches, copies, host syncs...). ``classify_kernel(name)``:
compute / communication / memory, by the one pattern table (:mod:`trainperf.trace.patterns`).
``attribute_windows(timeline, lo, hi)``: the microseconds of each cause (GPU busy by kind, GPU idle by what
kept it waiting) in arbitrary windows of a rank (:mod:`trainperf.trace.attribution`).
Nothing here imports torch.
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

_LAZY = {
    "analyze_file": ("trainperf.trace.analyze", "analyze_file"),
    "attribute_windows": ("trainperf.trace.attribution", "attribute_windows"),
    "classify_kernel": ("trainperf.trace.patterns", "classify_kernel"),
    "is_tensor_core": ("trainperf.trace.patterns", "is_tensor_core"),
    "load_patterns": ("trainperf.trace.patterns", "load"),
    "Patterns": ("trainperf.trace.patterns", "Patterns"),
}
__getattr__ = lazy_names(__name__, globals(), _LAZY)
__all__ = sorted(_LAZY)

"""Moved to :mod:`trainperf.tracegen.synth`: the generators of traces with known answers (test and benchmark
fixtures) live apart from the shipped reader. This path forwards their names, deprecated, for one release."""

from __future__ import annotations

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "KERNEL_CATS": "trainperf.tracegen.synth", "GPU_CATS": "trainperf.tracegen.synth",
    "STEP_RE": "trainperf.tracegen.synth", "default_is_comm": "trainperf.tracegen.synth",
    "load_trace": "trainperf.tracegen.synth", "num": "trainperf.tracegen.synth",
    "write_trace": "trainperf.tracegen.synth", "multi_rank": "trainperf.tracegen.ranks",
    "repeat": "trainperf.tracegen.synth"})

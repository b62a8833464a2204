"""Generated profiler traces and captures with known answers (no torch, no GPU): test and benchmark fixtures,
kept apart from the readers they exercise.

Each module writes traces that carry one injected cause, with the truth written beside them
(``truth.json``) or returned, so that what the reader finds can be checked against what was put in.
:mod:`trainperf.tracegen.ranks`: the ranks of one job (a late rank and its cause, host clock offsets).
:mod:`trainperf.tracegen.nsys_job`: a simulated training job, written as Nsight Systems exports
(:mod:`trainperf.tracegen.nsys`: three schema generations, GPU metrics, before/after pairs, any size) and as
its torch.profiler twin (:mod:`trainperf.tracegen.kineto_twin`).
"""

"""Generated profiler traces and captures with known answers (no torch, no GPU): test and benchmark fixtures,
kept apart from the readers they exercise (:mod:`trainperf.trace`, the shipped reader, never imports them).

Each module writes traces that carry one injected cause, with the truth written beside them (``truth.json``)
or returned, so that what the reader finds can be checked against what was put in:

* :mod:`trainperf.tracegen.causes`: a real rank edited to carry a known host cause of GPU idle time
  (allocator frees, a sync drain, a late DataLoader, a Python-heavy host, an unfused optimizer step);
* :mod:`trainperf.tracegen.ranks`: the ranks of one job (a late rank and its cause, host clock offsets);
* :mod:`trainperf.tracegen.nsys_job`: a simulated training job, written as Nsight Systems exports
  (:mod:`trainperf.tracegen.nsys`: three schema generations, GPU metrics, before/after pairs, any size) and as
  its torch.profiler twin (:mod:`trainperf.tracegen.kineto_twin`);
* :mod:`trainperf.tracegen.generate` (single ranks of each kind and era) and :mod:`trainperf.tracegen.synth`
  (reading and writing traces as event streams, a longer trace).
"""

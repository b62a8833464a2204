"""Generated profiler traces with known answers, made from real ones (no torch, no GPU).

Each module writes traces that carry one injected cause, with the truth written beside them
(``truth.json``), so that what the reader finds can be checked against what was put in.
:mod:`trainperf.tracegen.ranks`: the ranks of one job (a late rank and its cause, host clock offsets).
"""

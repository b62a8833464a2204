"""How deep the HybridLoader prefetches and how many IO threads it runs, from measured rates (no torch).

Fixed defaults (8 IO threads, 3 batches per worker, 4 ready) are right for one storage and one step
time only. The loader measures instead, and this module turns the measurements into settings:

- ``read_s``: seconds one read of the source takes when it is not cached (its latency; measured by
  the probe reads at start, then by the workers' own misses). Reads wait, they do not compute, so
  they overlap on IO threads.
- ``serial_s``: seconds of a worker's own work per sample that do not overlap (decode, a cache hit's
  file read): a worker's samples/s is at most ``1 / serial_s``.
- ``step_s``: seconds the consumer (the training step) takes between two batches, its data wait left
  out. Unknown at start: then the plan assumes the step is as fast as the workers can decode
  (the most the loader can be asked for); a measured step faster than that is sized the same way.

The derivation (``headroom`` h, 2 by default, covers jitter and a step that gets faster):

1. samples/s the step consumes: ``need = batch / step_s``; per worker ``need / workers``.
2. IO threads per worker by Little's law: reads in flight = arrival rate x time each read takes,
   ``threads = ceil(h x need / workers x read_s x miss_fraction)`` (at least 1, at most ``max_threads``).
3. One worker's latency for a batch once submitted: its reads in waves of ``threads``, then its
   serial work, ``batch_s = ceil(batch x miss_fraction / threads) x read_s + batch x serial_s``.
4. Host slots (batches submitted and not yet consumed) by Little's law again: batches in production
   = ``batch_s / step_s``, so ``slots = ceil(h x batch_s / step_s) + 1`` (at least 2 per worker, so
   each worker always has one batch queued behind the one it works on).
5. Ready batches (the device ring / thread queue): a worker delivers every ``workers`` steps; when one
   is late by a batch time the ready ones cover it: ``depth = max(2, ceil(h x batch_s / (workers x step_s)))``.
6. ``utilization = need / (workers / serial_s)``: above ``1 / h`` no depth keeps the wait low for long;
   the plan says so (``cpu_bound``) and the fix is more workers or a cheaper decode.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass

HEADROOM = 2.0
MAX_THREADS = 64
MAX_SLOTS = 64


@dataclass(frozen=True)
class PrefetchPlan:
    io_threads: int        # IO threads per worker
    slots: int             # host batch slots (batches submitted and not yet consumed), all workers
    depth: int             # ready batches in the device ring / thread queue
    batch_s: float         # one worker's time for one batch once submitted (reads in waves + serial work)
    need_samples_s: float  # samples/s the step consumes
    utilization: float     # need / what the workers' serial work allows
    cpu_bound: bool        # utilization above 1 / headroom: more workers or a cheaper decode needed
    step_s: float          # the step time the plan is for
    read_s: float          # the read latency it is for
    serial_s: float        # the serial seconds per sample it is for
    measured_step: bool    # step_s measured (False: assumed as fast as the workers can decode)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_prefetch(*, batch: int, read_s: float, serial_s: float, workers: int, step_s: float | None = None,
                  miss_fraction: float = 1.0, headroom: float = HEADROOM, max_threads: int = MAX_THREADS,
                  max_slots: int = MAX_SLOTS) -> PrefetchPlan:
    """Settings for ``batch`` samples per step from the measured rates (see the module docstring)."""
    if batch < 1 or workers < 0 or read_s < 0 or serial_s < 0 or headroom < 1:
        raise ValueError(f"plan_prefetch needs batch >= 1, workers >= 0, read_s >= 0, serial_s >= 0 and headroom >= 1 "
                         f"(got {batch}, {workers}, {read_s}, {serial_s}, {headroom})")
    w = max(1, workers)  # 0 workers: one in-process thread does the same work
    miss = min(1.0, max(0.0, miss_fraction))
    serial = max(serial_s, 1e-6)
    measured = step_s is not None and step_s > 0
    # unknown step, or one faster than the workers' serial work can feed: size for what the workers can
    # deliver (the most the loader can be asked for; a deeper prefetch cannot make it go faster)
    fastest = batch * serial / w
    step = max(step_s if measured else fastest, fastest, 1e-6)
    need = batch / step
    reads_in_flight = headroom * need / w * read_s * miss
    threads = min(max_threads, max(1, math.ceil(reads_in_flight - 1e-9)))
    batch_s = math.ceil(batch * miss / threads - 1e-9) * read_s + batch * serial_s
    slots = min(max_slots, max(2 * w, math.ceil(headroom * batch_s / step - 1e-9) + 1))
    depth = min(max_slots, max(2, math.ceil(headroom * batch_s / (w * step) - 1e-9)))
    utilization = need * serial / w
    return PrefetchPlan(io_threads=threads, slots=slots, depth=depth, batch_s=batch_s, need_samples_s=need,
                        utilization=utilization, cpu_bound=utilization > 1 / headroom, step_s=step, read_s=read_s,
                        serial_s=serial_s, measured_step=measured)


class IoClock:
    """Seconds the source's reads took and the worker's serial work per sample: the prefetch plan's input
    (trainperf.data.prefetch_plan), sent with the cache counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.read_s, self.reads, self.serial_s, self.samples = 0.0, 0, 0.0, 0

    def read(self, seconds: float) -> None:
        with self.lock:  # IO threads add concurrently
            self.read_s += seconds
            self.reads += 1

    def stats(self) -> dict:
        return {"io_read_s": self.read_s, "io_reads": self.reads, "io_serial_s": self.serial_s,
                "io_samples": self.samples}

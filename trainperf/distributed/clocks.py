"""A data-parallel rank's compute clocks: the balancer's input and the straggler diagnosis's evidence.

:class:`ComputeClock` times a rank's own forward+backward (start of the step to its last gradient,
so the wait for the other ranks inside DDP's backward is not counted); :class:`ThreadCpuClock` is
the FSDP2-on-CPU variant (this thread's CPU seconds, collective waits left out).
"""

from __future__ import annotations

import time


class ComputeClock:
    """Times one rank's own compute in a step: from :meth:`start` to the last gradient accumulated.

    Under DDP the wait for the other ranks happens after the last gradient (when the reducer
    finishes its all-reduces), so it is not counted. On CPU the clock is the host clock. On
    CUDA it records events on the current stream (read at :meth:`stop`; the gradient kernels'
    completion, not their launch). Under FSDP2 the all-gathers inside forward wait for slower
    ranks, so this clock over-states a fast rank's compute there; pass your own measurement.
    """

    def __init__(self, model, device_type: str = "cpu"):
        import torch

        self.cuda = device_type == "cuda"
        self._torch = torch
        self._t0 = 0.0
        self._last: float | None = None
        self._ev0 = self._ev1 = None
        self._handles = [p.register_post_accumulate_grad_hook(self._ready)
                         for p in model.parameters() if p.requires_grad]

    def _ready(self, _param) -> None:
        self._last = time.perf_counter()
        if self.cuda:
            self._ev1.record()  # re-recorded: the last gradient's kernels are what it marks

    def start(self) -> None:
        self._last = None
        if self.cuda:
            self._ev0 = self._torch.cuda.Event(enable_timing=True)
            self._ev1 = self._torch.cuda.Event(enable_timing=True)
            self._ev0.record()
        self._t0 = time.perf_counter()

    def stop_later(self):
        """Like :meth:`stop`, without a host-device sync now: returns a function that reads the seconds
        later (once per log interval), for the straggler evidence of a run that is not balancing."""
        if self.cuda and self._last is not None:
            ev0, ev1 = self._ev0, self._ev1

            def read() -> float:
                ev1.synchronize()
                return ev0.elapsed_time(ev1) / 1e3

            return read
        value = self.stop()
        return lambda: value

    def stop(self) -> float:
        """Seconds of compute since :meth:`start` (to now if no gradient was accumulated)."""
        if self.cuda and self._last is not None:
            self._ev1.synchronize()  # host-device sync
            return self._ev0.elapsed_time(self._ev1) / 1e3
        end = self._last if self._last is not None else time.perf_counter()
        return end - self._t0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class ThreadCpuClock:
    """A compute clock for FSDP2 on CPU: this thread's CPU seconds (collective waits left out)."""

    def start(self) -> None:
        self._t0 = time.thread_time()

    def stop(self) -> float:
        return time.thread_time() - self._t0

    def stop_later(self):
        value = self.stop()
        return lambda: value

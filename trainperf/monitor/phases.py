"""Per-step phase timing: data wait, forward, backward, optimizer, exposed communication.

On CPU the wall clock is read at phase boundaries (cheap, no synchronization
needed). On CUDA, events are recorded on the current stream at each boundary
(no synchronization inside the step); ``end_step`` waits for the step's last
event, once per step, to read the phase times and make the step time the
device's (the metrics writer, :mod:`trainperf.monitor.steplog`, adds no wait).

Each boundary also reads this process's CPU time (``time.process_time``, all
threads), so ``last_cpu`` says how busy the host was in each phase: a data wait
with little CPU is waiting on storage (IO-bound); one with the CPU busy is
decoding (CPU-bound).

Exposed communication: code that waits on a collective outside the backward
pass (e.g. a data-parallel all-reduce that did not overlap) marks it with
``timer.phase("comm")`` before the wait and the next phase's name after it.

NVTX: with ``nvtx = True`` on CUDA, each phase is also an NVTX range named
``trainperf/<phase>``, so ``nsys profile -t cuda,nvtx`` shows the phases.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

PHASES = ("data", "forward", "backward", "optimizer", "comm")


class PhaseTimer:
    def __init__(self, device_type: str = "cpu", enabled: bool = True, nvtx: bool = False):
        self.cuda = device_type == "cuda" and torch.cuda.is_available()
        self.enabled = enabled
        self.nvtx = bool(nvtx) and self.cuda
        self._marks: list[tuple[str, object]] = []
        self._cpu: list[float] = []
        self._current: str | None = None
        self._nvtx_open = False
        self.totals: dict[str, float] = defaultdict(float)
        self.cpu_totals: dict[str, float] = defaultdict(float)
        self.last_cpu: dict[str, float] = {}

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start_step(self) -> None:
        self._marks = []
        self._cpu = []
        self._current = None

    @property
    def current(self) -> str | None:
        """The phase open now (the last boundary's name), None before the step's first boundary."""
        return self._marks[-1][0] if self._marks else None

    def phase(self, name: str) -> None:
        """Close the current phase and open ``name`` (a boundary costs one clock read)."""
        if self.enabled:
            self._marks.append((name, self._mark()))
            self._cpu.append(time.process_time())
            if self.nvtx:
                if self._nvtx_open:
                    torch.cuda.nvtx.range_pop()
                torch.cuda.nvtx.range_push(f"trainperf/{name}")
                self._nvtx_open = True

    def end_step(self) -> dict[str, float]:
        """Seconds per phase for this step; on CUDA this waits for the step's last event."""
        if not self.enabled or not self._marks:
            return {}
        end = self._mark()
        cpu_end = time.process_time()
        if self._nvtx_open:
            torch.cuda.nvtx.range_pop()
            self._nvtx_open = False
        marks = self._marks + [("_end", end)]
        out: dict[str, float] = defaultdict(float)
        if self.cuda:
            end.synchronize()
            for (name, a), (_, b) in zip(marks, marks[1:]):
                out[name] += a.elapsed_time(b) / 1000.0
        else:
            for (name, a), (_, b) in zip(marks, marks[1:]):
                out[name] += b - a
        cpu: dict[str, float] = defaultdict(float)
        for (name, _), a, b in zip(self._marks, self._cpu, self._cpu[1:] + [cpu_end]):
            cpu[name] += b - a
        for k, v in out.items():
            self.totals[k] += v
        for k, v in cpu.items():
            self.cpu_totals[k] += v
        self.last_cpu = dict(cpu)
        return dict(out)


def measure_overhead(n_steps: int = 2000, phases: tuple[str, ...] = ("data", "forward", "backward", "optimizer"),
                     device_type: str = "cpu") -> dict:
    """Cost of the timer itself: seconds per step of start_step + one boundary per phase + end_step,
    with nothing between the boundaries (best of 3 rounds of ``n_steps``)."""
    timer = PhaseTimer(device_type)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n_steps):
            timer.start_step()
            for p in phases:
                timer.phase(p)
            timer.end_step()
        best = min(best, (time.perf_counter() - t0) / n_steps)
    return {"timer_s_per_step": best, "boundaries_per_step": len(phases) + 1, "device": device_type,
            "method": f"best of 3 rounds of {n_steps} empty steps"}

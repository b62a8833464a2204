"""Per-step phase timing: data wait, forward, backward, optimizer, exposed communication.

On CPU the wall clock is read at phase boundaries (cheap, no synchronization
needed). On CUDA, events are recorded on the current stream at each boundary
and read only when the step's figures are collected (after the step's own
host-device sync), so timing adds no synchronization to the hot path.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

PHASES = ("data", "forward", "backward", "optimizer", "comm")


class PhaseTimer:
    def __init__(self, device_type: str = "cpu", enabled: bool = True):
        self.cuda = device_type == "cuda" and torch.cuda.is_available()
        self.enabled = enabled
        self._marks: list[tuple[str, object]] = []
        self._current: str | None = None
        self.totals: dict[str, float] = defaultdict(float)

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start_step(self) -> None:
        self._marks = []
        self._current = None

    def phase(self, name: str) -> None:
        """Close the current phase and open ``name`` (a boundary costs one clock read)."""
        if self.enabled:
            self._marks.append((name, self._mark()))

    def end_step(self) -> dict[str, float]:
        """Seconds per phase for this step; on CUDA this waits for the step's last event."""
        if not self.enabled or not self._marks:
            return {}
        end = self._mark()
        marks = self._marks + [("_end", end)]
        out: dict[str, float] = defaultdict(float)
        if self.cuda:
            end.synchronize()
            for (name, a), (_, b) in zip(marks, marks[1:]):
                out[name] += a.elapsed_time(b) / 1000.0
        else:
            for (name, a), (_, b) in zip(marks, marks[1:]):
                out[name] += b - a
        for k, v in out.items():
            self.totals[k] += v
        return dict(out)

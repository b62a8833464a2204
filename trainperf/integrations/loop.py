"""A plain loop of your own, instrumented with context managers::

    import trainperf
    tp = trainperf.track("runs/mine", model=model)     # model: for MFU (optional)
    for x, y in loader:                                 # data wait: from one step's end to the next's start
        with tp.step(x):                                # counts the batch's tokens
            with tp.phase("forward"):
                loss = loss_fn(model(x), y)
            with tp.phase("backward"):
                loss.backward()
            with tp.phase("optimizer"):
                opt.step(); opt.zero_grad()
            tp.loss(loss)
    tp.close()                                          # summary.json; then: trainperf diagnose runs/mine

Time inside a step outside any named phase is the ``other`` phase. A step whose batch is fetched
inside it can say so: ``with tp.phase("data"): x, y = next(it)``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trainperf.integrations.core import StepRecorder


class StepTracker:
    def __init__(self, run_dir: str | Path = "runs/loop", *, model: torch.nn.Module | None = None,
                 device: str | torch.device | None = None, precision: str = "fp32", log_every: int = 10,
                 monitor: dict | None = None, count_flops: bool = True):
        if device is None and model is not None:
            p = next(model.parameters(), None)
            device = p.device if p is not None else "cpu"
        self.rec = StepRecorder(run_dir, framework="loop", device=device, precision=precision,
                                monitor=monitor, count_flops=count_flops, log_every=log_every)
        self.rec.model = model
        self.summary: dict | None = None

    @contextlib.contextmanager
    def step(self, batch=None, *, tokens: int | None = None, lr: float | None = None):
        """One optimizer step. ``batch`` (or ``tokens``) gives the tokens it processes."""
        rec = self.rec
        if not rec.in_step:  # the first step: no data wait before it was seen
            rec.open_step()
        rec.mark("other")
        if batch is not None or tokens is not None:
            rec.add_batch(batch, tokens=tokens)
        yield self
        rec.close_step(lr=lr)

    @contextlib.contextmanager
    def phase(self, name: str):
        """A named phase (data, forward, backward, optimizer, comm or your own) inside a step."""
        self.rec.mark(name)
        yield
        self.rec.mark("other")

    def loss(self, value) -> None:
        """This step's loss (a tensor is read at the next flush, not now: no sync per step)."""
        self.rec.add_loss(value)

    def close(self, verbose: bool = False) -> dict:
        if self.summary is None:
            self.summary = self.rec.finish(verbose=verbose)
        return self.summary

    def __enter__(self) -> "StepTracker":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def track(run_dir: str | Path = "runs/loop", **kwargs) -> StepTracker:
    """A :class:`StepTracker` writing ``run_dir`` (see the module docstring)."""
    return StepTracker(run_dir, **kwargs)

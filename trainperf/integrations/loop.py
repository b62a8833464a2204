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


def _whole_tokens(tokens) -> int:
    import math
    import numbers

    from trainperf.errors import UserError

    ok = isinstance(tokens, numbers.Integral) and not isinstance(tokens, bool) or (
        isinstance(tokens, float) and math.isfinite(tokens) and tokens.is_integer())
    if not ok or tokens < 0:
        raise UserError(f"tp.step(tokens={tokens!r}): give the tokens this step processes, a whole number >= 0 "
                        "(or pass the batch and they are counted)")
    return int(tokens)


class StepTracker:
    def __init__(self, run_dir: str | Path = "runs/loop", *, model: torch.nn.Module | None = None,
                 device: str | torch.device | None = None, precision: str = "fp32", log_every: int = 10,
                 monitor: dict | None = None, count_flops: bool = True):
        from trainperf.errors import UserError

        if model is not None and not isinstance(model, torch.nn.Module):
            raise UserError(f"model={type(model).__name__!r} is not a torch.nn.Module; pass the module being trained "
                            "(for its FLOPs per token), or leave model out")
        if device is None and model is not None:
            p = next(model.parameters(), None)
            device = p.device if p is not None else "cpu"
        self.rec = StepRecorder(run_dir, framework="loop", device=device, precision=precision,
                                monitor=monitor, count_flops=count_flops, log_every=log_every)
        self.rec.model = model
        self.summary: dict | None = None
        self._in_step = False
        self._phases: list[str] = []

    def _open(self, what: str) -> None:
        from trainperf.errors import UserError

        if self.summary is not None:
            raise UserError(f"tp.{what}() after tp.close(): this tracker has written its run; start another with "
                            "trainperf.track(RUN_DIR)")

    @contextlib.contextmanager
    def step(self, batch=None, *, tokens: int | None = None, lr: float | None = None):
        """One optimizer step. ``batch`` (or ``tokens``) gives the tokens it processes. A step that raises is
        left out of the figures, and summary.json says what was raised."""
        from trainperf.errors import UserError

        self._open("step")
        if self._in_step:
            raise UserError("tp.step() inside another tp.step(): one tp.step() per optimizer step; for several "
                            "micro-batches in one step, pass them all (tokens=sum) or use tp.phase() inside it")
        if tokens is not None:
            tokens = _whole_tokens(tokens)
        rec = self.rec
        if not rec.in_step:  # the first step: no data wait before it was seen
            rec.open_step()
        rec.mark("other")
        if batch is not None or tokens is not None:
            rec.add_batch(batch, tokens=tokens)
        self._in_step = True
        try:
            yield self
        except BaseException as exc:
            rec.notes["raised"] = (f"{type(exc).__name__}: {exc}"[:300] + f" (in step {rec.step + 1}; that step is "
                                   "left out of the figures)")
            rec.cancel_step()
            raise
        finally:
            self._in_step = False
            self._phases = []
        rec.close_step(lr=lr)

    @contextlib.contextmanager
    def phase(self, name: str):
        """A named phase (data, forward, backward, optimizer, comm or your own) inside a step; a phase inside
        another hands the time back to the outer one when it ends."""
        from trainperf.errors import UserError

        self._open("phase")
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"tp.phase({name!r}): give the phase a name, e.g. 'forward'")
        outer = self._phases[-1] if self._phases else "other"
        self._phases.append(name)
        self.rec.mark(name)
        try:
            yield
        finally:
            if self._phases and self._phases[-1] == name:
                self._phases.pop()
            if self.summary is None:
                self.rec.mark(outer)

    def loss(self, value) -> None:
        """This step's loss (a tensor is read at the next flush, not now: no sync per step)."""
        import numbers

        from trainperf.errors import UserError

        self._open("loss")
        if value is not None and not isinstance(value, torch.Tensor) and (
                isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real)):
            raise UserError(f"tp.loss({value!r}): give the step's loss as a number or a tensor")
        self.rec.add_loss(value)

    def close(self, verbose: bool = False) -> dict:
        if self.summary is None:
            self.summary = self.rec.finish(verbose=verbose)
        return self.summary

    def __enter__(self) -> "StepTracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and "raised" not in self.rec.notes:  # raised outside a step: the loader, ...
            self.rec.notes["raised"] = f"{exc_type.__name__}: {exc}"[:300] + f" (after step {self.rec.step})"
        self.close()
        return False


def track(run_dir: str | Path = "runs/loop", **kwargs) -> StepTracker:
    """A :class:`StepTracker` writing ``run_dir`` (see the module docstring)."""
    return StepTracker(run_dir, **kwargs)

"""Make one rank slow in a real run, for tests and demos of the load balancer (diagnosis knob).

    Knobs(slow_rank=(R, F))   rank R (global rank, as torchrun's RANK) does F x the model compute
                              per sample (F >= 1; 2 = twice as slow, 1.5 = half as much again);
                              the CLI takes it from TRAINPERF_SLOW_RANK=R:F

The slowed rank holds a plain copy of the model (same config, not wrapped, not trained) and,
each step, runs it forward and backward on its own share of the batch ``F - 1`` more times
(the fractional part on that fraction of the rows), in micro-batches of the trainer's size.
That is real work proportional to the rank's samples, like a slower device; not a sleep.
The trained model, its gradients, the collectives and the losses are untouched, so a slowed
run gives the same losses as a plain one. Under FSDP2, tensor and pipeline parallelism the copy is
still the whole model (not the rank's shard, tensor slice or stage), run on the thread that trains,
so the rank's own compute grows by ``F - 1`` whole-model passes over its batch: more than ``F`` x its
share of the model (measured on 2 gloo ranks at F = 3, thread CPU per step: tensor=2 53 vs 35 ms,
pipeline=2 28 vs 7 ms, FSDP2 21 vs 12 ms), and its peers wait for it in their collectives. Unset (the default): nothing is built and the step
does not look at it. It costs one extra model copy (and its activations) on rank R.
"""

from __future__ import annotations

import torch


class SlowRank:
    """Extra model compute on this rank (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, factor: float, chunk: int, autocast=None):
        self.model, self.factor, self.chunk = model, factor, max(1, chunk)
        self.autocast = autocast

    @classmethod
    def build(cls, spec: tuple[int, float] | None, rank: int, cfg, *, data_vocab: int, device, chunk: int,
              autocast=None) -> "SlowRank | None":
        """The slow copy for ``spec = (rank, factor)`` when it names this rank; None otherwise."""
        if spec is None or spec[0] != rank or spec[1] <= 1:
            return None
        from trainperf.models.build import build_model

        devices = [device] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # build_model seeds: leave this rank's RNG streams alone
            model = build_model(cfg, data_vocab=data_vocab, device=device)
        model.train()
        return cls(model, spec[1], chunk, autocast)

    def burn(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """``F - 1`` extra forward+backward passes of the copy over ``x`` (this rank's share)."""
        import contextlib

        extra = self.factor - 1.0
        autocast = self.autocast or contextlib.nullcontext
        while extra > 1e-9:
            rows = x.shape[0] if extra >= 1 else round(extra * x.shape[0])
            for i in range(0, rows, self.chunk):
                j = min(rows, i + self.chunk)
                with autocast():
                    _, loss = self.model(x[i:j], y[i:j])
                loss.backward()
            extra -= 1.0
        self.model.zero_grad(set_to_none=True)

"""Hugging Face ``Trainer``, instrumented by one line::

    from trainperf.integrations.hf import TrainperfCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TrainperfCallback(run_dir="runs/hf")])
    trainer.train()                      # then: trainperf diagnose runs/hf

Phases per optimizer step: data (``on_step_end`` of the previous step, or the end of the
framework's logging/evaluation/saving after it -> the model's first forward of the step: the
Trainer fetches the step's batches, calls ``on_step_begin`` and moves them to the device in
between), forward (a forward pre-hook on the model -> its forward post-hook; with gradient
accumulation every micro-batch adds to it), backward (post-hook -> the next forward or
``on_pre_optimizer_step``: includes gradient clipping), optimizer (-> ``on_optimizer_step``: the
optimizer's step), other (-> ``on_step_end``: the scheduler step, zero_grad and the callbacks before
``on_step_end``, a user's own sleep among them: not optimizer time). Tokens: the ``input_ids`` the model receives. Loss: the
``loss`` the model returns (read at the next flush, not every step).

Needs only ``transformers`` (and torch).
"""

from __future__ import annotations

from pathlib import Path

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("trainperf.integrations.hf needs transformers: pip install transformers") from exc

import torch

from trainperf.integrations.core import StepRecorder, count_tokens


class TrainperfCallback(TrainerCallback):
    def __init__(self, run_dir: str | Path = "runs/hf", *, log_every: int = 10, monitor: dict | None = None,
                 count_flops: bool = True, verbose: bool = False):
        self.run_dir, self.log_every, self.monitor = Path(run_dir), log_every, monitor
        self.count_flops, self.verbose = count_flops, verbose
        self.rec: StepRecorder | None = None
        self.summary: dict | None = None
        self._hooks: list = []

    # ------------------------------------------------------------------ model hooks
    def _pre_forward(self, module, args, kwargs):
        rec = self.rec
        if rec is None or not torch.is_grad_enabled() or not module.training:
            return
        rec.mark("forward")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            rec.add_batch(ids)
        else:
            rec.add_batch(dict(kwargs))

    def _post_forward(self, module, args, kwargs, output):
        rec = self.rec
        if rec is None or not torch.is_grad_enabled() or not module.training:
            return
        rec.mark("backward")
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            rec.add_loss(loss)

    # ------------------------------------------------------------------ Trainer events
    def _drop_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # A train() that raised never reached on_train_end: its hooks would count every token twice in this one
        # and its recorder would hold the directory. Both go; its records stay, as a run that did not finish.
        self._drop_hooks()
        if self.rec is not None and not self.rec.closed:
            self.rec.abandon()
        self.summary = None  # each train() is a run of its own (the previous one's records are set aside)
        precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        device = getattr(args, "device", None) or "cpu"
        world = int(getattr(args, "world_size", 1) or 1)
        rank = int(getattr(args, "process_index", 0) or 0)
        self.rec = StepRecorder(self.run_dir, framework="transformers.Trainer", device=device,
                                precision=precision, monitor=self.monitor, count_flops=self.count_flops,
                                log_every=self.log_every, rank=rank, world=world)
        self.rec.model = model
        self.rec.notes["hf"] = (f"gradient_accumulation_steps={args.gradient_accumulation_steps}, "
                                f"per_device_train_batch_size={args.per_device_train_batch_size}")
        if model is not None:
            self._hooks = [model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
                           model.register_forward_hook(self._post_forward, with_kwargs=True)]
        self.rec.open_step()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.rec is not None:
            self.rec.mark("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        # the optimizer's step is done: the scheduler, zero_grad and the callbacks up to on_step_end (a user's
        # own sleep among them) are the "other" phase, not optimizer time (host_contention reads the phases)
        if self.rec is not None:
            self.rec.end_phase("optimizer")

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.rec is None:
            return
        lr = optimizer.param_groups[0].get("lr") if optimizer is not None else None
        self.rec.close_step(lr=lr)

    # logging, evaluation and saving run between on_step_end and the next fetch: not data wait
    def _restart(self):
        if self.rec is not None and self.rec.in_step and not self.rec._tokens:
            self.rec.open_step()

    def on_log(self, args, state, control, **kwargs):
        self._restart()

    def on_evaluate(self, args, state, control, **kwargs):
        self._restart()

    def on_save(self, args, state, control, **kwargs):
        self._restart()

    def on_train_end(self, args, state, control, **kwargs):
        self._drop_hooks()
        if self.rec is not None and self.summary is None:
            self.summary = self.rec.finish(verbose=self.verbose)


__all__ = ["TrainperfCallback", "count_tokens"]

"""Lightning, instrumented by one line::

    from trainperf.integrations.lightning import TrainperfCallback
    trainer = L.Trainer(..., callbacks=[TrainperfCallback(run_dir="runs/lit")])
    trainer.fit(module, loader)          # then: trainperf diagnose runs/lit

Phases per optimizer step, from Lightning's hooks: data (``on_train_batch_end`` of the previous
batch -> ``on_train_batch_start``: the fetch and the move to the device), forward (-> 
``on_before_backward``), backward (-> ``on_before_optimizer_step``), optimizer (-> the optimizer's ``step()``
returning: a step post-hook), other (-> ``on_train_batch_end``: Lightning's and the user's callbacks after
the optimizer step, e.g. a sleep, are neither optimizer time nor data wait). Validation and checkpoint saving between batches are not data wait: the
open step is dropped when validation starts and restarts when it ends. Tokens come from the batch
(``input_ids`` of a dict, else the first integer tensor; a float batch counts samples). With
gradient accumulation, a record covers one batch (Lightning calls the hooks per batch).

Needs only Lightning (``lightning`` or ``pytorch_lightning``) and torch.
"""

from __future__ import annotations

from pathlib import Path

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError("trainperf.integrations.lightning needs Lightning: pip install lightning") from exc

from trainperf.integrations.core import StepRecorder

_PRECISION = {"bf16": "bf16", "16": "fp16", "bf16-mixed": "bf16", "16-mixed": "fp16", "bf16-true": "bf16",
              "16-true": "fp16"}


class TrainperfCallback(Callback):
    def __init__(self, run_dir: str | Path = "runs/lightning", *, log_every: int = 10, monitor: dict | None = None,
                 count_flops: bool = True, verbose: bool = False):
        super().__init__()
        self.run_dir, self.log_every, self.monitor = Path(run_dir), log_every, monitor
        self.count_flops, self.verbose = count_flops, verbose
        self.rec: StepRecorder | None = None
        self.summary: dict | None = None

    # ------------------------------------------------------------------ run
    def on_train_start(self, trainer, pl_module):
        if self.rec is not None and not self.rec.closed:  # a fit that raised before this one
            self.rec.abandon()
        self.summary = None  # each fit is a run of its own (the previous one's records are set aside)
        precision = _PRECISION.get(str(getattr(trainer, "precision", "32")), "fp32")
        self.rec = StepRecorder(self.run_dir, framework="lightning", device=pl_module.device,
                                precision=precision, monitor=self.monitor, count_flops=self.count_flops,
                                log_every=self.log_every, rank=trainer.global_rank, world=trainer.world_size)
        self.rec.model = pl_module
        self.rec.notes["lightning"] = f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})"

    def on_train_epoch_start(self, trainer, pl_module):
        if self.rec is not None and not self.rec.in_step:
            self.rec.open_step()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.rec is not None:
            self.rec.mark("forward")
            self.rec.add_batch(batch)

    def on_before_backward(self, trainer, pl_module, loss):
        if self.rec is not None:
            self.rec.mark("backward")
            self.rec.add_loss(loss)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.rec is not None:
            self.rec.mark("optimizer")
            self.rec.watch_optimizer(optimizer)  # the phase ends when optimizer.step() returns

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.rec is None:
            return
        lr = None
        if trainer.optimizers:
            lr = trainer.optimizers[0].param_groups[0].get("lr")
        self.rec.close_step(lr=lr)

    # ------------------------------------------------------------------ not data wait
    def on_validation_start(self, trainer, pl_module):
        if self.rec is not None:
            self.rec.cancel_step()

    def on_validation_end(self, trainer, pl_module):
        if self.rec is not None and trainer.training:
            self.rec.open_step()

    def on_train_epoch_end(self, trainer, pl_module):
        if self.rec is not None:
            self.rec.cancel_step()

    def on_train_end(self, trainer, pl_module):
        if self.rec is not None and self.summary is None:
            self.summary = self.rec.finish(verbose=self.verbose)

    def on_exception(self, trainer, pl_module, exception):
        if self.rec is not None:
            self.rec.abandon()  # what is on the host is written; a crashed run stays diagnosable

"""Will this run fit? A check before ``trainperf train`` builds anything.

The reference GPT's closed-form estimate (:func:`trainperf.memory.estimate.estimate_gpt`, the one
``trainperf memory`` prints) for the config's own checkpointing mode, micro-batch and layout, against
the memory the run will have:

* on CUDA, the device's total memory (per rank: the estimate is per rank);
* on CPU, the host's available memory (``MemAvailable``), shared by the ranks on this host
  (``LOCAL_WORLD_SIZE``), so the per-rank estimate counts once per local rank.

A run whose estimate is above that is refused before the model is built (a 100,000-token context on a
24 GB host once ran for minutes with no step, on its way to the kernel's OOM killer), with the fixes
that fit: the largest micro-batch, full checkpointing, a shorter context. The estimate is of what the
autograd graph and the model states hold, a floor of the real peak, so a refused run would not have
fitted. ``memory.preflight=false`` starts it anyway. A user's model or a Hugging Face one is not
estimated here (its estimate traces the model: ``trainperf memory`` does that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainperf.errors import ConfigError

GB = 1e9


@dataclass(frozen=True)
class Preflight:
    estimate_bytes: int        # per rank, the config's mode
    states_bytes: int
    activations_bytes: int
    available_bytes: int       # what the ranks that share it have
    source: str                # where available_bytes was read
    ranks_sharing: int         # ranks on this host sharing that memory (CPU), else 1

    @property
    def fits(self) -> bool:
        return self.estimate_bytes * self.ranks_sharing <= self.available_bytes


def _available(device: str) -> tuple[int | None, str, int]:
    """(bytes, where read, ranks sharing them) for the run's device; (None, ...) when unknown."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None, "", 1
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        props = torch.cuda.get_device_properties(local % max(1, torch.cuda.device_count()))
        return int(props.total_memory), f"CUDA device {local} total memory", 1
    if device != "cpu":
        return None, "", 1
    try:
        sharing = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    except ValueError:
        sharing = 1
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory (/proc/meminfo MemAvailable)", sharing
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available), "available host memory (psutil)", sharing
    except ImportError:
        return None, "", sharing


def estimate_run(cfg):
    """(estimate function of (mode-plan, micro_batch), the config's plan, n_layer, seq) for the reference
    GPT; None for a user's or a Hugging Face model."""
    from trainperf.memory.estimate import GPTShape, Sharding, estimate_gpt
    from trainperf.memory.plan import plan_of
    from trainperf.models.build import gpt_config

    if cfg.model.entrypoint or cfg.model.hf is not None:
        return None
    shape = GPTShape.of(gpt_config(cfg))
    par = cfg.parallelism
    sharding = Sharding(tp=par.tensor, pp=par.pipeline, dp=max(1, par.data), fsdp=par.data_shard,
                        sp=par.sequence_parallel, microbatches=par.microbatches)
    ac = cfg.memory.checkpointing

    def estimate(plan, micro_batch):
        return estimate_gpt(shape, micro_batch=micro_batch, seq_len=shape.block_size, dtype=cfg.precision.dtype,
                            plan=plan, optimizer=cfg.optimizer.type, device=cfg.run.device, sharding=sharding)

    if ac.mode == "budget":  # the budget mode chooses its own plan (and refuses a budget it cannot meet)
        return None
    return estimate, plan_of(ac.mode, shape.n_layer, ratio=ac.ratio, every_k=ac.every_k), shape


def check(cfg) -> Preflight | None:
    """Raise ConfigError when the run's estimate does not fit the memory it will have; the figures
    otherwise (None when the model or the device's memory is not known here)."""
    if not getattr(cfg.memory, "preflight", True):
        return None
    run = estimate_run(cfg)
    if run is None:
        return None
    available, source, sharing = _available(cfg.run.device)
    if available is None:
        return None
    estimate, plan, shape = run
    b = cfg.train.micro_batch
    est = estimate(plan, b)
    pf = Preflight(est.total, est.states, est.activations, available, source, sharing)
    if pf.fits:
        return pf
    raise ConfigError(_refusal(cfg, pf, estimate, plan, shape))


def _refusal(cfg, pf: Preflight, estimate, plan, shape) -> str:
    from trainperf.memory.budget import max_micro_batch
    from trainperf.memory.plan import Plan

    b, mode = cfg.train.micro_batch, cfg.memory.checkpointing.mode
    per_rank = pf.available_bytes // pf.ranks_sharing
    share = f" / {pf.ranks_sharing} ranks on this host" if pf.ranks_sharing > 1 else ""
    head = (f"this run needs about {pf.estimate_bytes / GB:.2f} GB per rank (model states "
            f"{pf.states_bytes / GB:.2f} GB + activations {pf.activations_bytes / GB:.2f} GB at "
            f"train.micro_batch={b}, model.block_size={shape.block_size}, "
            f"memory.checkpointing.mode={mode}, {cfg.precision.dtype}) and has {per_rank / GB:.2f} GB "
            f"({pf.source}{share})")
    fixes = []
    mb = max_micro_batch(lambda m: estimate(plan, m), per_rank, upper=b)
    if mb >= 1:
        fixes.append(f"train.micro_batch={mb} (the largest that fits; train.global_batch stays, by accumulation)")
    full = Plan(shape.n_layer, 0)
    if plan != full and estimate(full, b).total <= per_rank:
        fixes.append(f"memory.checkpointing.mode=full ({estimate(full, b).total / GB:.2f} GB)")
    elif plan != full and max_micro_batch(lambda m: estimate(full, m), per_rank, upper=b) >= 1:
        fixes.append(f"memory.checkpointing.mode=full with train.micro_batch="
                     f"{max_micro_batch(lambda m: estimate(full, m), per_rank, upper=b)}")
    if not fixes:
        fixes.append("a smaller model.block_size, or shard the model states (parallelism.data_shard) "
                     "over more ranks")
    else:
        fixes.append("a smaller model.block_size")
    return (f"{head}: it would not fit (`trainperf memory CONFIG` shows the estimate per checkpointing mode). "
            f"Fix: {'; or '.join(fixes)}. The estimate is a floor of the peak; memory.preflight=false starts "
            "the run anyway")

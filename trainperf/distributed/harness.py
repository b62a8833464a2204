"""Small, self-contained distributed runs of a tiny GPT: used by the tests and `trainperf bench comm`.

:func:`spawn` starts ``world`` gloo processes on this machine (``OMP_NUM_THREADS=1``) that run
a list of named cases one after another in the same process group, so the cost of starting
processes is paid once. Each case is a set of config overrides; :func:`run_layout` trains it
for a few steps on fixed random batches (the same global batches whatever the layout: the
data-parallel rank takes its slice) and returns losses, bytes, step times and, on rank 0, the
gathered full parameters. :func:`run_reference` is the one-process run to compare with.
"""

from __future__ import annotations

import os
import socket
import time
import traceback

import torch

TINY = {"model.n_layer": 2, "model.n_head": 4, "model.n_embd": 64, "model.block_size": 32,
        "model.vocab_size": 64, "model.dropout": 0.0, "run.device": "cpu", "precision.dtype": "fp32",
        "optimizer.impl": "foreach", "train.global_batch": 8, "train.micro_batch": 4,
        "parallelism.microbatches": 2, "optimizer.lr": 3e-3, "parallelism.data": -1}


def make_config(overrides: dict | None = None):
    from trainperf.config.schema import Config

    cfg = Config()
    for key, val in {**TINY, **(overrides or {})}.items():
        obj = cfg
        *path, last = key.split(".")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, val)
    return cfg


def batches(cfg, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Fixed global batches (B, T + 1) of random tokens."""
    g = torch.Generator().manual_seed(seed)
    B, T, V = cfg.train.global_batch, cfg.model.block_size, cfg.model.vocab_size
    return [torch.randint(0, V, (B, T + 1), generator=g) for _ in range(steps)]


def run_reference(cfg, data: list[torch.Tensor]) -> dict:
    """One process, gradient accumulation over micro-batches: what every layout must reproduce."""
    from trainperf.models.build import build_model
    from trainperf.train.optim import build_optimizer

    model = build_model(cfg, device="cpu", materialize=True)
    model.train()
    opt = build_optimizer(model, cfg.optimizer)
    mb = cfg.train.micro_batch
    losses = []
    for batch in data:
        x, y = batch[:, :-1], batch[:, 1:]
        accum = x.shape[0] // mb
        total = 0.0
        for i in range(accum):
            _, loss = model(x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb])
            (loss / accum).backward()
            total += loss.item() / accum
        if cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def full_params(pm) -> dict | None:
    """All parameters of the full model, gathered to rank 0 (None elsewhere)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    local = {}
    for m in pm.modules:
        # Not cpu_offload: that keeps values on rank 0 only, and a later pipeline stage lives elsewhere.
        sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
        local.update({k: v.detach().cpu().clone() for k, v in sd.items()})
    if not pm.dims.distributed:
        return local
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(local, out, dst=0)
    if dist.get_rank() != 0:
        return None
    merged = {}
    for part in out:
        merged.update(part or {})
    return merged


def build_optimizers(pm, cfg):
    from trainperf.distributed.optim import MultiOptimizer, split_by_placement
    from trainperf.train.optim import build_optimizer

    return MultiOptimizer([split_by_placement(build_optimizer(m, cfg.optimizer)) for m in pm.modules])


def run_layout(cfg, data: list[torch.Tensor], *, rank: int, world: int, gather: bool = True,
               load_dir: str | None = None, save_dir: str | None = None) -> dict:
    """Train ``cfg``'s layout on ``data`` (global batches). With ``load_dir``, resume from the latest
    distributed checkpoint there (any layout) and continue at its step; with ``save_dir``, save at the end."""
    from trainperf.distributed.ddp import COMM
    from trainperf.distributed.parallel_dims import ParallelDims
    from trainperf.distributed.parallelize import parallelize
    from trainperf.models.build import build_model

    dims = ParallelDims.from_config(cfg, world)
    meta = build_model(cfg, device="cpu", materialize=False)
    pm = parallelize(meta, cfg, dims, rank=rank, device=torch.device("cpu"), seq_len=cfg.model.block_size)
    opt = build_optimizers(pm, cfg)
    dp_rank, dp = dims.dp_rank(rank), dims.dp
    losses, comm, times = [], [], []
    start = 0
    if load_dir:
        from trainperf.distributed import checkpoint as dcp_ckpt

        extra = dcp_ckpt.load(dcp_ckpt.latest(load_dir), pm.modules, opt.optimizers)
        start = extra["step"]
    COMM.take()
    for batch in data[start:]:
        t0 = time.perf_counter()
        share = batch.shape[0] // dp
        local = batch[dp_rank * share:(dp_rank + 1) * share]
        loss = pm.forward_backward(local[:, :-1], local[:, 1:], micro_batch=cfg.train.micro_batch)
        if cfg.train.grad_clip > 0:
            pm.clip_grad_norm_(cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(pm.global_loss(loss).item())
        times.append(time.perf_counter() - t0)
        comm.append(COMM.take())
    if save_dir:
        from trainperf.distributed import checkpoint as dcp_ckpt

        dcp_ckpt.save(save_dir, len(data), pm.modules, opt.optimizers, {"step": len(data)})
    out = {"losses": losses, "comm": comm, "step_s": times, "notes": pm.notes, "pm": pm, "opt": opt}
    if gather:
        out["params"] = full_params(pm)
    return out


def compare(ref: dict, got: dict) -> dict:
    """Largest absolute differences between a layout's run and the reference."""
    loss_diff = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ref["losses"], got["losses"]))
    p_ref, p_got = ref["params"], got["params"]
    missing = sorted(set(p_ref) ^ set(p_got))
    param_diff = max((p_ref[k] - p_got[k]).abs().max().item() for k in p_ref if k in p_got)
    return {"loss_rel": loss_diff, "param_abs": param_diff, "missing": missing}


# ---------------------------------------------------------------------- process spawning
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, result_path: str, timeout_s: float) -> None:
    import datetime
    import pickle

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            with open(result_path, "wb") as f:
                pickle.dump(result, f)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args, timeout_s: float = 60.0):
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; returns rank 0's (picklable) result."""
    import pickle
    import tempfile

    import torch.multiprocessing as mp

    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.pkl")
        mp.spawn(_entry, args=(world, free_port(), fn, args, path, timeout_s), nprocs=world, join=True)
        with open(path, "rb") as f:
            return pickle.load(f)

"""Small, self-contained distributed runs of a tiny GPT: used by the tests and `trainperf bench comm`.

:func:`trainperf.distributed.spawn.spawn` starts ``world`` gloo processes on this machine
(``OMP_NUM_THREADS=1``) that run a list of named cases one after another in the same process group,
so the cost of starting processes is paid once. Each case is a set of config overrides; :func:`run_trainer` trains it
with the real Trainer (``Trainer.train_step``) for a few steps on fixed random batches (the same
global batches whatever the layout: the data-parallel rank takes its slice) and returns losses,
bytes, step times and, on rank 0, the gathered full parameters. :func:`run_reference` is the
same Trainer in one process (every degree 1), to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TINY = {"model.n_layer": 2, "model.n_head": 4, "model.n_embd": 64, "model.block_size": 32,
        "model.vocab_size": 64, "model.dropout": 0.0, "run.device": "cpu", "precision.dtype": "fp32",
        "optimizer.impl": "foreach", "train.global_batch": 8, "train.micro_batch": 4,
        "parallelism.microbatches": 2, "optimizer.lr": 3e-3, "parallelism.data": -1,
        "schedule.type": "constant", "schedule.warmup_steps": 0}


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


class _FixedLoader:
    """This data rank's slice of each fixed global batch, in order; ``shares`` as the sampler takes them."""

    def __init__(self, batches: list[torch.Tensor], dp_rank: int, dp_world: int):
        self.batches, self.dp_rank, self.dp_world, self.pos = batches, dp_rank, dp_world, 0

    def next_batch(self, shares: list[int] | None = None):
        batch = self.batches[self.pos]
        self.pos += 1
        if shares is None:
            n = batch.shape[0] // self.dp_world
            shares = [n] * self.dp_world
        start = sum(shares[:self.dp_rank])
        local = batch[start:start + shares[self.dp_rank]]
        return local[:, :-1].contiguous(), local[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = int(state["pos"])


class _FixedVal:
    def __init__(self, windows):
        self.windows = windows.numpy()

    def __len__(self) -> int:
        return len(self.windows)

    def gather(self, idx):
        return self.windows[idx]


@dataclass
class FixedBatches:
    """Fixed random global batches as the trainer's data (the same global batches whatever the layout)."""

    train: _FixedLoader
    val: _FixedVal
    seq_len: int
    vocab_size: int
    meta: dict


def fixed_data(cfg, batches: list[torch.Tensor], dp_rank: int = 0, dp_world: int = 1) -> FixedBatches:
    return FixedBatches(_FixedLoader(batches, dp_rank, dp_world), _FixedVal(batches[0]), cfg.model.block_size,
                        cfg.model.vocab_size, {"tokenizer": "synthetic"})


def one_process(cfg):
    """The same config with every parallel degree 1 (the reference every layout must reproduce)."""
    cfg = cfg.model_copy(deep=True)
    p = cfg.parallelism
    p.data = p.data_shard = p.tensor = p.pipeline = 1
    p.sequence_parallel, p.balance.enabled, p.compression.type = False, False, "none"
    return cfg


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


def run_trainer(cfg, data: list[torch.Tensor], *, rank: int = 0, world: int = 1, gather: bool = True,
                load_dir: str | None = None, save_dir: str | None = None, knobs=None) -> dict:
    """Train ``cfg``'s layout on ``data`` (global batches) with the real :class:`Trainer` and its
    ``train_step``. With ``load_dir``, resume from the latest distributed checkpoint there (saved on
    any layout) and continue at its step; with ``save_dir``, save at the end. ``world=1``: one process."""
    from trainperf.train.resolve import DeviceFacts, resolve
    from trainperf.distributed.checkpoint import DcpCheckpointer
    from trainperf.models.build import build_model
    from trainperf.train.build import assemble

    resolved = resolve(cfg, facts=DeviceFacts(cpus=1), world_size=world)
    cfg, dims = resolved.cfg, resolved.dims
    model = build_model(cfg, device="cpu", materialize=False)
    trainer = assemble(cfg, dims, model, fixed_data(cfg, data, dims.dp_rank(rank), dims.dp), rank=rank, knobs=knobs,
                       checkpointer=DcpCheckpointer(load_dir or save_dir or ".unused"))
    if load_dir:
        trainer.resume("auto")
    losses, comm, times, extras, norms = [], [], [], [], []
    while trainer.step < len(data):
        res = trainer.train_step()
        losses.append(res.loss.item())
        norms.append(float(res.grad_norm) if res.grad_norm is not None else None)
        times.append(res.step_time)
        comm.append({k: v for k, v in res.extras.items() if k.startswith("comm_")})
        extras.append(res.extras)
    if save_dir:
        trainer.save_checkpoint()
    out = {"losses": losses, "grad_norms": norms, "comm": comm, "step_s": times, "extras": extras,
           "notes": trainer.pm.notes, "trainer": trainer}
    if gather:
        out["params"] = full_params(trainer.pm)
    return out


def run_reference(cfg, data: list[torch.Tensor]) -> dict:
    """One process (every degree 1), the same Trainer: what every layout must reproduce."""
    got = run_trainer(one_process(cfg), data)
    return {"losses": got["losses"], "grad_norms": got["grad_norms"], "params": got["params"]}


def compare(ref: dict, got: dict) -> dict:
    """Largest absolute differences between a layout's run and the reference."""
    loss_diff = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ref["losses"], got["losses"]))
    p_ref, p_got = ref["params"], got["params"]
    missing = sorted(set(p_ref) ^ set(p_got))
    param_diff = max((p_ref[k] - p_got[k]).abs().max().item() for k in p_ref if k in p_got)
    return {"loss_rel": loss_diff, "param_abs": param_diff, "missing": missing}

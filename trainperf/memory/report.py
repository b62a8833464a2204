"""``trainperf memory``: estimate (and measure) memory per checkpointing mode for a config."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from trainperf.train.resolve import resolve
from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.memory.ac import apply_ac
from trainperf.memory.budget import choose_plan, max_micro_batch
from trainperf.memory.estimate import GB, GPTShape, MemoryEstimate, Sharding, estimate_gpt
from trainperf.memory.plan import Plan, check_ratio, plan_kinds
from trainperf.memory.measure import cuda_peak_step, measure_activations, measure_states, time_fwd_bwd
from trainperf.models.blocks import find_blocks

# The rows every report shows: (mode, ratio)
DEFAULT_ROWS: list[tuple[str, float | None]] = [
    ("none", None), ("ratio", 0.25), ("ratio", 0.5), ("full", None), ("selective", None),
]


@dataclass
class Row:
    mode: str
    ratio: float | None
    kinds: list[str]
    estimate: MemoryEstimate
    max_micro_batch: int | None = None
    measured: dict[str, int] | None = None
    step_time_s: float | None = None
    step_cpu_s: float | None = None
    cuda_peak_bytes: int | None = None
    hook_bytes: int | None = None

    @property
    def label(self) -> str:
        if self.mode == "ratio":
            return f"ratio {self.ratio:g}"
        if self.mode == "every_k":
            return f"every_k ({self.kinds.count('full')} blk)"
        return self.mode

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "ratio": self.ratio, "label": self.label,
            "checkpointed_blocks": [i for i, k in enumerate(self.kinds) if k == "full"],
            "selective_blocks": [i for i, k in enumerate(self.kinds) if k == "selective"],
            "estimate_bytes": self.estimate.as_dict(),
            "measured_bytes": self.measured,
            "step_time_s": self.step_time_s,
            "step_cpu_s": self.step_cpu_s,
            "max_micro_batch": self.max_micro_batch,
            "cuda_peak_bytes": self.cuda_peak_bytes,
            "saved_hook_bytes": self.hook_bytes,
        }


def _autocast_factory(dtype: str, device: str):
    if dtype in ("bf16", "fp16"):
        dt = torch.bfloat16 if dtype == "bf16" else torch.float16
        return lambda: torch.autocast(device, dtype=dt)
    return None


def _optimizer(model: nn.Module, cfg: Config) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.type == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=0.9)
    cls = torch.optim.Adam if o.type == "adam" else torch.optim.AdamW
    return cls(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps)


def _vocab(model: nn.Module, cfg: Config) -> int:
    gcfg = getattr(model, "cfg", None)
    if gcfg is not None and hasattr(gcfg, "vocab_size"):
        return int(gcfg.vocab_size)
    if isinstance(cfg.model.vocab_size, int):
        return cfg.model.vocab_size
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return m.num_embeddings
    return 256


MAX_BUDGET_GB = 1e6  # GB per rank (a petabyte); the config schema's bound on memory.checkpointing.budget_gb


def _budget_bytes(budget_gb: float, name: str) -> int:
    """GB -> bytes for a budget that is a positive finite number of at most MAX_BUDGET_GB (so the int()
    cannot overflow), else a ConfigError naming ``name``."""
    import math

    if not (isinstance(budget_gb, (int, float)) and math.isfinite(budget_gb) and 0 < budget_gb <= MAX_BUDGET_GB):
        raise ConfigError(f"{name}={budget_gb} must be a positive number of GB per rank, at most "
                          f"{MAX_BUDGET_GB:g} (e.g. 80)")
    return int(budget_gb * GB)


def _budget(budget_gb: float | None, cfg: Config, device: str) -> tuple[int | None, str]:
    if budget_gb is not None:
        return _budget_bytes(budget_gb, "--budget-gb"), "--budget-gb"
    if cfg.memory.checkpointing.budget_gb is not None:
        return (_budget_bytes(cfg.memory.checkpointing.budget_gb, "memory.checkpointing.budget_gb"),
                "memory.checkpointing.budget_gb")
    return _device_budget(device)


def _device_budget(device: str) -> tuple[int | None, str]:
    """The device's memory: the GPU's total, else the host's available memory."""
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory), "CUDA device memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory (/proc/meminfo)"
    except OSError:
        pass
    return None, "none"


def _world_size(cfg: Config) -> int:
    """Resolve for the layout the config names (WORLD_SIZE, else the product of its degrees)."""
    from trainperf.config.resolve import world_size_from_env

    env = world_size_from_env()
    if env > 1:
        return env
    p = cfg.parallelism
    return max(1, p.data) * p.data_shard * p.tensor * p.pipeline


def _check_measurable(rows, estimate, n_blocks: int, cfg: Config, device: str, b: int) -> None:
    """--measure holds one copy of the model per mode and runs one micro-batch at a time: refused (ConfigError)
    when that estimate is above the device's memory (the host's available memory on CPU), whatever --budget-gb
    says, with the largest micro-batch that would fit."""
    limit, source = _device_budget(device)
    if not limit:
        return
    states = max(r.estimate.states for r in rows)
    need = states * (len(rows) - 1) + max(r.estimate.total for r in rows)
    if need <= limit:
        return
    worst = max(rows, key=lambda r: r.estimate.total)

    def need_at(mb: int) -> MemoryEstimate:
        most = max((estimate(Plan(r.kinds.count("full"), r.kinds.count("selective")), mb) for r in rows),
                   key=lambda e: e.total)
        return MemoryEstimate(most.params, most.grads, most.optimizer + states * (len(rows) - 1), most.activations)
    fits = max_micro_batch(need_at, limit, upper=max(1, b))
    fix = (f"lower train.micro_batch to {fits} (the largest whose estimate fits in every mode)" if fits
           else "the model states alone do not fit: a smaller model, or shard it (parallelism.data_shard)")
    raise ConfigError(f"--measure would run micro_batch={b} in mode {worst.label!r} with {len(rows)} copies of the "
                      f"model: about {need / GB:.2f} GB by the estimate, above {limit / GB:.2f} GB ({source}); "
                      f"{fix}, or leave out --measure (the estimate needs no memory)")


def memory_report(cfg: Config, *, measure: bool = False, budget_gb: float | None = None, reps: int = 5,
                  progress: bool = True) -> dict[str, Any]:
    """Rows per checkpointing mode: estimate, optional measurement and step time, max micro-batch."""
    from tqdm import tqdm

    from trainperf.models.build import build_model, gpt_config

    cfg = resolve(cfg, world_size=_world_size(cfg)).cfg
    if measure and _world_size(cfg) > 1:
        raise ConfigError("--measure runs one process; measure with parallelism degrees of 1 (the estimate covers the sharded layout)")
    ac = cfg.memory.checkpointing
    if ac.mode == "ratio":
        check_ratio(ac.ratio)
    device = cfg.run.device
    dtype = cfg.precision.dtype
    b = cfg.train.micro_batch
    budget_bytes, budget_source = _budget(budget_gb, cfg, device)
    rows_spec = list(DEFAULT_ROWS)
    if ac.mode == "ratio" and ac.ratio not in (0.25, 0.5):
        rows_spec.append(("ratio", ac.ratio))
    if ac.mode in ("every_k", "budget"):
        rows_spec.append((ac.mode, None))

    # --- the model: formula for the reference GPT, trace for a user's model or a Hugging Face one
    model = None
    batch = None
    if cfg.model.entrypoint or cfg.model.hf is not None:
        torch.manual_seed(cfg.run.seed)
        model = build_model(cfg, device=device)
        if cfg.model.hf is not None:
            from trainperf.models.hf import hf_seq_len

            seq = hf_seq_len(cfg)
        else:
            seq = cfg.model.block_size or getattr(getattr(model, "cfg", None), "block_size", None) or 128
        vocab = _vocab(model, cfg)
        g = torch.Generator().manual_seed(cfg.run.seed)
        batch = tuple(torch.randint(0, vocab, (b, seq), generator=g).to(device) for _ in range(2))
        path, blocks = find_blocks(model, ac.blocks)
        if not blocks:
            if ac.mode != "none":
                raise ConfigError(
                    f"memory.checkpointing.mode={ac.mode!r} needs repeated blocks, but {type(model).__name__} has "
                    "no ModuleList/ModuleDict/Sequential of children of one type; name them with "
                    "memory.checkpointing.blocks=<dotted path> or use mode=none"
                )
            rows_spec = [("none", None)]
        from trainperf.memory.trace import estimate_traced, trace_profile

        prof = trace_profile(model, batch, dtype=dtype, blocks=ac.blocks) if blocks else None
        n_blocks = len(blocks)

        def estimate(plan: Plan, mb: int = b) -> MemoryEstimate:
            if prof is None:  # no blocks: only the "none" row, traced as a profile of zero blocks
                raise ConfigError(f"{type(model).__name__} has no repeated blocks; use memory.checkpointing.mode=none")
            return estimate_traced(prof, micro_batch=mb, plan=plan, optimizer=cfg.optimizer.type,
                                   sharding=Sharding(fsdp=cfg.parallelism.data_shard))
        model_name = cfg.model.entrypoint or f"Hugging Face {type(model).__name__} (traced)"
    else:
        gcfg = gpt_config(cfg)
        shape = GPTShape.of(gcfg)
        seq = shape.block_size
        n_blocks = shape.n_layer
        path = "layers"
        if ac.blocks:  # check the path on a model built on meta (no memory)
            from trainperf.models.gpt import GPT

            with torch.device("meta"):
                path, _ = find_blocks(GPT(gcfg), ac.blocks)

        par = cfg.parallelism
        sharding = Sharding(tp=par.tensor, pp=par.pipeline, dp=max(1, par.data), fsdp=par.data_shard,
                            sp=par.sequence_parallel, microbatches=par.microbatches)

        def estimate(plan: Plan, mb: int = b) -> MemoryEstimate:
            return estimate_gpt(shape, micro_batch=mb, seq_len=seq, dtype=dtype, plan=plan,
                                optimizer=cfg.optimizer.type, device=device, sharding=sharding)
        model_name = f"GPT preset={cfg.model.preset} (l={shape.n_layer}, h={shape.n_embd}, a={shape.n_head}, V={shape.vocab_size})"

    # --- plans per row
    rows: list[Row] = []
    for mode, ratio in rows_spec:
        if mode == "budget":
            if budget_bytes is None:
                raise ConfigError("memory.checkpointing.mode=budget needs memory.checkpointing.budget_gb or --budget-gb")

            def fit_full():
                return max_micro_batch(lambda mb: estimate(Plan(n_blocks, 0), mb), budget_bytes)

            choice = choose_plan(estimate, n_blocks, budget_bytes, suggest_micro_batch=fit_full,
                                 what=f" at micro_batch={b}, seq_len={seq}, {dtype}")
            kinds = plan_kinds("budget", n_blocks, n_full=choice.n_full, n_selective=choice.n_selective)
        else:
            kinds = plan_kinds(mode, n_blocks, ratio=ratio or 0.25, every_k=ac.every_k)
        plan = Plan(kinds.count("full"), kinds.count("selective"))
        est = estimate(plan)
        row = Row(mode, ratio, kinds, est)
        if budget_bytes is not None:
            row.max_micro_batch = max_micro_batch(lambda mb, plan=plan: estimate(plan, mb), budget_bytes)
        rows.append(row)
    if budget_bytes is not None and budget_gb is not None and all(r.max_micro_batch == 0 for r in rows):
        floor = estimate(Plan(n_blocks, 0), 1)
        raise ConfigError(
            f"--budget-gb={budget_gb:g} is below the minimum possible: {floor.total / GB:.4f} GB "
            f"(mode=full at micro_batch=1: model states {floor.states / GB:.4f} GB + activations "
            f"{floor.activations / GB:.4f} GB); raise the budget to at least that, or shard the model states "
            "(parallelism.data_shard)"
        )

    # --- measurement: never one the estimate says will not fit (it once ran the kernel's OOM killer)
    if measure:
        _check_measurable(rows, estimate, n_blocks, cfg, device, b)
    if measure:
        if model is None:
            torch.manual_seed(cfg.run.seed)
            model = build_model(cfg, device=device)
            g = torch.Generator().manual_seed(cfg.run.seed)
            vocab = _vocab(model, cfg)
            batch = tuple(torch.randint(0, vocab, (b, seq), generator=g).to(device) for _ in range(2))
        factory = _autocast_factory(dtype, device if device != "xla" else "cpu")
        models: dict[str, nn.Module] = {}
        total = len(rows) * (2 + reps + 1)
        with tqdm(total=total, desc="trainperf memory", disable=not progress or None, leave=False) as bar:
            for row in rows:
                m = copy.deepcopy(model)
                apply_ac(m, kinds=row.kinds, blocks=ac.blocks)
                act = measure_activations(m, batch, autocast=factory() if factory else None)
                opt = _optimizer(m, cfg)
                opt.step()
                states = measure_states(m, opt)
                opt.zero_grad(set_to_none=True)
                row.cuda_peak_bytes = cuda_peak_step(m, batch, opt, autocast=factory() if factory else None)
                del opt
                row.measured = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
                                "activations": act.bytes}
                row.measured["total"] = sum(row.measured.values())
                row.hook_bytes = act.saved_hook_bytes
                models[row.label] = m
                bar.update(2)
            cpu: dict[str, float] = {}
            threads = torch.get_num_threads()
            if device == "cpu" and isinstance(cfg.run.threads, int):
                torch.set_num_threads(cfg.run.threads)
            try:
                times = time_fwd_bwd(models, batch, reps=reps, warmup=1, autocast_factory=factory,
                                     progress=bar, cpu_times=cpu)
            finally:
                torch.set_num_threads(threads)
        for row in rows:
            row.step_time_s = times[row.label]
            row.step_cpu_s = cpu[row.label]
        del models

    return {
        "model": model_name,
        "block_path": path,
        "n_blocks": n_blocks,
        "device": device,
        "dtype": dtype,
        "micro_batch": b,
        "seq_len": seq,
        "optimizer": cfg.optimizer.type,
        "budget_bytes": budget_bytes,
        "budget_source": budget_source,
        "measured": measure,
        "timing": {"reps": reps, "what": "median of forward+backward, modes interleaved, after 1 warm-up "
                              "(step_cpu_s: process CPU seconds, same steps)"}
        if measure else None,
        "threads": cfg.run.threads if device == "cpu" else None,
        "pid": os.getpid(),
        "modes": [r.as_dict() for r in rows],
    }

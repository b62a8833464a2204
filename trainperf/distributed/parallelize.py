"""``parallelize``: one config -> the model parts this rank runs, in the fixed order.

    build on meta -> [split into pipeline stages] -> per part:
        tensor parallel (apply_tp) -> activation checkpointing (apply_ac) -> compile (per block)
        -> FSDP2 (data_shard > 1) | FSDP2 replicate (data > 1 with tensor or pipeline > 1)
        -> materialize -> DDP + compression hook (data > 1 alone)
    -> [PipelineStage per part + schedule]

Initial parameters equal one process's: the full model is initialized on this rank's device
from ``run.seed`` (exactly as the single-process trainer does) and each part takes its slice of
that full state dict (``set_model_state_dict(full_state_dict=True)``), never a rank-dependent
random init. (This costs one full copy of the model per rank during set-up.)

:class:`ParallelModel` then runs one optimizer step's forward/backward (gradient accumulation
with sync only on the last micro-step, or the pipeline schedule), reduces the loss for logging,
and clips the gradient norm across DTensor shards and pipeline stages.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from trainperf.distributed.parallel_dims import ParallelDims
from trainperf.errors import ConfigError


@dataclass
class ParallelModel:
    dims: ParallelDims
    rank: int
    device: torch.device
    parts: list  # what runs forward on this rank (DDP/FSDP-wrapped parts)
    modules: list  # the plain modules (FQNs of the full model), for state dicts and optimizers
    kind: str  # "single" | "ddp" | "fsdp" | "replicate"
    schedule: object | None = None
    stage_ids: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    autocast: object = None  # callable returning a context manager (precision policy)
    accum_hint: int = 1  # micro-steps per optimizer step (for the FSDP traffic estimate)
    fsdp_bytes: tuple = (4, 4)  # (all-gathered parameter, reduce-scattered gradient) bytes per element

    @property
    def pp_rank(self) -> int:
        return self.dims.coords(self.rank)["pp"]

    @property
    def has_first_stage(self) -> bool:
        return not self.dims.pp_enabled or self.pp_rank == 0

    @property
    def has_last_stage(self) -> bool:
        return not self.dims.pp_enabled or self.pp_rank == self.dims.pp - 1

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()

    def train(self, mode: bool = True):
        for m in self.parts:
            m.train(mode)

    # ------------------------------------------------------------------ one step's forward/backward
    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, *, micro_batch: int, backward=None,
                         sizes: list[int] | None = None, loss_scale=None) -> torch.Tensor:
        """Run this rank's share (x, y: (local_batch, T)) of one global batch. Returns this rank's mean
        loss (detached; 0 on ranks without the last pipeline stage). Gradients are synchronized
        across data ranks only on the last micro-step.

        Load balancing: ``sizes`` (micro-batch sizes, the same count on every rank) and
        ``loss_scale(n)`` (factor for a micro-batch's mean loss, e.g. ``DynamicBalancer.loss_scale``)
        replace the equal split and ``1 / accum``; the return value is then the scaled sum."""
        if self.schedule is not None:
            return self._pipeline_step(x, y)
        model = self.parts[0]
        n = x.shape[0]
        accum = max(1, n // micro_batch)
        if sizes is None:
            sizes = [micro_batch] * accum
        total = torch.zeros((), device=self.device)
        autocast = self.autocast or contextlib.nullcontext
        start = 0
        for i, m in enumerate(sizes):
            last = i == len(sizes) - 1
            mx, my = x[start:start + m], y[start:start + m]
            start += m
            with self._sync(model, last):
                with autocast():
                    _, loss = model(mx, my)
                # mean over the local batch, or the balancer's exact global-batch factor
                loss = loss * loss_scale(m) if loss_scale is not None else loss / accum
                (backward or torch.Tensor.backward)(loss)
            total += loss.detach()
        return total

    def _sync(self, model, enabled: bool):
        if self.kind == "ddp" and not enabled:
            return model.no_sync()  # no all-reduce on this micro-step
        if self.kind in ("fsdp", "replicate"):
            model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()

    def _pipeline_step(self, x, y) -> torch.Tensor:
        losses: list = []
        # The schedule interleaves forwards and backwards; autocast only changes the forwards' dtypes
        # (backward ops run in the dtypes their forwards used).
        with (self.autocast or contextlib.nullcontext)():
            self._run_schedule(self.schedule.step, x, y, losses)
        if losses:
            return torch.stack([l.detach().float() for l in losses]).mean()
        return torch.zeros((), device=self.device)

    def _run_schedule(self, fn, x, y, losses) -> None:
        if self.has_first_stage and self.has_last_stage:
            fn(x, target=y, losses=losses)
        elif self.has_first_stage:
            fn(x)
        elif self.has_last_stage:
            fn(target=y, losses=losses)
        else:
            fn()

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of one evaluation batch (every rank calls with the same batch; 0 off the last stage)."""
        autocast = self.autocast or contextlib.nullcontext
        if self.schedule is None:
            with autocast():
                _, loss = self.parts[0](x, y)
            return loss.detach().float()
        losses: list = []
        with autocast():
            self._run_schedule(self.schedule.eval, x, y, losses)
        if losses:
            return torch.stack([l.detach().float() for l in losses]).mean()
        return torch.zeros((), device=self.device)

    def comm_estimate(self, micro_batch: int = 0, seq_len: int = 0) -> dict:
        """Per-rank wire bytes of one step for the collectives trainperf does not hook (FSDP2,
        FSDP2 replicate), from the ring formulas of REFERENCE.md; DDP's are measured (COMM)."""
        from trainperf.distributed.fsdp import fsdp_comm_bytes

        numel = sum(p.numel() for p in self.parameters()) // max(1, self.dims.tp)
        if self.kind == "fsdp":
            est = fsdp_comm_bytes(numel, self.dims.dp_shard, micro_steps=self.accum_hint,
                                  param_bytes=self.fsdp_bytes[0], reduce_bytes=self.fsdp_bytes[1],
                                  reshard_after_forward=not self.dims.pp_enabled)
            return {"comm_est_fsdp_bytes": est["total"]}
        if self.kind == "replicate":
            n = self.dims.dp_replicate
            return {"comm_est_replicate_bytes": int(2 * (n - 1) / n * numel * 4)}
        return {}

    # ------------------------------------------------------------------ loss for logging
    def global_loss(self, local: torch.Tensor) -> torch.Tensor:
        """Mean loss of the global batch on every rank (one all-reduce over the world)."""
        if not self.dims.distributed:
            return local
        c = self.dims.coords(self.rank)
        contributes = self.has_last_stage and c["tp"] == 0
        t = (local.detach().float() / self.dims.dp) if contributes else torch.zeros((), device=self.device)
        t = t.clone()
        dist.all_reduce(t)
        return t

    # ------------------------------------------------------------------ gradient clipping
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm_(list(self.parameters()), max_norm, self.dims, self.device)


def clip_grad_norm_(params, max_norm: float, dims: ParallelDims, device) -> torch.Tensor:
    """Global L2 norm of all gradients of the model (every shard counted once), clipped to ``max_norm``.

    Plain tensors are replicated over tensor/data ranks: counted locally. DTensor gradients:
    the local shard's sum of squares is summed over the mesh dims where it is sharded.
    Pipeline stages: summed over the pipeline group.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.zeros((), device=device, dtype=torch.float32)
    groups: dict = {}
    for g in grads:
        if isinstance(g, DTensor):
            key = (id(g.device_mesh), tuple(g.placements))
            groups.setdefault(key, (g.device_mesh, g.placements, []))[2].append(g._local_tensor)
        else:
            total += g.detach().float().pow(2).sum()
    for mesh, placements, locs in groups.values():
        sq = torch.stack([t.detach().float().pow(2).sum() for t in locs]).sum()
        for d, pl in enumerate(placements):
            if pl.is_shard() or pl.is_partial():
                dist.all_reduce(sq, group=mesh.get_group(d))
        total += sq
    if dims.pp_enabled:
        dist.all_reduce(total, group=dims.mesh("pp").get_group())
    norm = total.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            (g._local_tensor if isinstance(g, DTensor) else g).mul_(coef)
    return norm


# ---------------------------------------------------------------------- building
def full_init_state(meta_model: nn.Module, device, seed: int) -> dict:
    """The state dict one process would start from (init_weights under ``seed`` on ``device``)."""
    from trainperf.models.build import materialize_model

    ref = copy.deepcopy(meta_model)
    materialize_model(ref, device, seed)
    return {k: v.detach() for k, v in ref.state_dict().items()}


def _load_full(part: nn.Module, full_sd: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    keys = set(part.state_dict().keys())
    keys = {k.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "") for k in keys}
    sub = {k: v for k, v in full_sd.items() if k in keys}
    set_model_state_dict(part, sub, options=StateDictOptions(full_state_dict=True, strict=False))


def _apply_ac(part: nn.Module, cfg, seq_len: int) -> None:
    ac = cfg.memory.checkpointing
    if ac.mode == "none":
        return
    from trainperf.memory.ac import apply_ac  # the memory issue's function

    # blocks named explicitly: a pipeline stage may hold a single block (ratio/every_k count per stage)
    apply_ac(part, ac, blocks=ac.blocks or "layers", micro_batch=cfg.train.micro_batch, seq_len=seq_len,
             dtype=cfg.precision.dtype, optimizer=cfg.optimizer.type)


def _apply_compile(part: nn.Module, cfg) -> None:
    if not cfg.compile.enabled:
        return
    # Per block, so FQNs stay those of the model (checkpoints move between layouts) and FSDP wraps
    # compiled blocks; compile after AC wrapping and before FSDP. A model without repeated blocks
    # (model.entrypoint) is compiled whole, in place (Module.compile: FQNs unchanged too).
    from trainperf.models.blocks import repeated_blocks

    for block in repeated_blocks(part) or [part]:
        block.compile(mode=cfg.compile.mode, fullgraph=cfg.compile.fullgraph, backend=cfg.compile.backend)


def parallelize_data_parallel(model: nn.Module, cfg, dims: ParallelDims, *, rank: int, device: torch.device,
                              seq_len: int) -> ParallelModel:
    """Data parallelism (DDP, FSDP2, or both: HSDP) for a user's model (``model.entrypoint``),
    built and initialized on ``device``. Tensor and pipeline parallelism need the reference GPT's
    structure and are rejected before this (see :func:`check_entrypoint_layout`). Collective."""
    from trainperf.distributed.ddp import apply_ddp
    from trainperf.distributed.fsdp import DTYPES, apply_fsdp

    check_entrypoint_layout(dims)
    p = cfg.parallelism
    dims.build_mesh(device.type)
    # Every rank built the model with the same seed; rank 0's values are made everyone's anyway
    # (the user's function may draw from other generators): FSDP2 shards what each rank holds.
    if dims.distributed:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
    kind = "fsdp" if dims.fsdp_enabled else "ddp" if dims.dp_replicate_enabled else "single"
    _apply_ac(model, cfg, seq_len)
    _apply_compile(model, cfg)
    if kind == "fsdp":
        param_dtype = torch.bfloat16 if cfg.precision.dtype == "bf16" else None
        apply_fsdp(model, dims.fsdp_mesh(), param_dtype=param_dtype, reduce_dtype=DTYPES[p.fsdp_reduce_dtype])
        part = model
    elif kind == "ddp":
        part = apply_ddp(model, dims.mesh("dp_replicate"), compression=p.compression.type,
                         powersgd_rank=p.compression.rank, powersgd_warmup=p.compression.warmup_steps, device=device)
    else:
        part = model
    part.train()
    fsdp_bytes = (2 if cfg.precision.dtype == "bf16" else 4, DTYPES[p.fsdp_reduce_dtype].itemsize)
    return ParallelModel(dims=dims, rank=rank, device=device, parts=[part], modules=[model], kind=kind,
                         schedule=None, stage_ids=[0], notes={"layout": dims.describe(), "model": "model.entrypoint"},
                         fsdp_bytes=fsdp_bytes)


def check_entrypoint_layout(dims: ParallelDims) -> None:
    """A ``model.entrypoint`` model trains with data parallelism only; say so before any work."""
    if dims.tp_enabled or dims.pp_enabled:
        raise ConfigError(
            f"model.entrypoint models train with data parallelism only (DDP: parallelism.data, FSDP2: "
            f"parallelism.data_shard); got parallelism.tensor={dims.tp}, parallelism.pipeline={dims.pp}, which need "
            "the reference GPT's blocks and attention projections; set both to 1 or use the reference model"
        )


def parallelize(meta_model: nn.Module, cfg, dims: ParallelDims, *, rank: int, device: torch.device,
                seq_len: int) -> ParallelModel:
    """Apply the configured layout to ``meta_model`` (a reference GPT on meta). Collective: every rank calls."""
    from trainperf.distributed.ddp import apply_ddp, check_compression
    from trainperf.distributed.fsdp import DTYPES, apply_fsdp, apply_replicate
    from trainperf.distributed.pipeline import (block_costs, build_schedule, make_stage_module,
                                                split_layers, stage_ids)
    from trainperf.distributed.tensor_parallel import apply_tp

    p = cfg.parallelism
    gc = meta_model.cfg
    dims.validate_model(n_head=gc.n_head, n_layer=gc.n_layer, interleave=p.interleave if dims.pp_enabled else 1,
                        n_embd=gc.n_embd)
    check_compression(p.compression.type, dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp,
                      pp=dims.pp)
    dims.build_mesh(device.type)
    full_sd = full_init_state(meta_model, device, cfg.run.seed)
    notes: dict = {"layout": dims.describe()}

    # ---- pipeline split
    if dims.pp_enabled:
        n_stages = dims.pp * (p.interleave if p.pipeline_schedule == "interleaved_1f1b" else 1)
        costs, first_extra, last_extra = block_costs(gc.n_layer, gc.n_embd, seq_len, gc.vocab_size)
        split = split_layers(costs, n_stages, first_extra=first_extra, last_extra=last_extra)
        ids = stage_ids(dims.coords(rank)["pp"], dims.pp, n_stages // dims.pp)
        modules = [make_stage_module(meta_model, split[s], first=s == 0, last=s == n_stages - 1) for s in ids]
        notes["pipeline_split"] = [len(s) for s in split]
    else:
        n_stages, ids, modules = 1, [0], [meta_model]

    # ---- the fixed order, per part
    if dims.fsdp_enabled:
        kind = "fsdp"
    elif dims.dp_replicate_enabled and (dims.tp_enabled or dims.pp_enabled):
        # DDP's reducer breaks under several pipeline forwards before a backward, and DDP cannot bucket
        # DTensors: replicas of tensor/pipeline-parallel parts use FSDP2's replicate.
        kind = "replicate"
    elif dims.dp_replicate_enabled:
        kind = "ddp"
    else:
        kind = "single"
    parts = []
    for m in modules:
        if dims.tp_enabled:
            apply_tp(m, dims.mesh("tp"), sequence_parallel=p.sequence_parallel)
        _apply_ac(m, cfg, seq_len)
        _apply_compile(m, cfg)
        if kind == "fsdp":
            param_dtype = torch.bfloat16 if cfg.precision.dtype == "bf16" else None
            apply_fsdp(m, dims.fsdp_mesh(), param_dtype=param_dtype, reduce_dtype=DTYPES[p.fsdp_reduce_dtype],
                       reshard_after_forward=not dims.pp_enabled)
        elif kind == "replicate":
            apply_replicate(m, dims.mesh("dp_replicate"))
        m.to_empty(device=device)
        _load_full(m, full_sd)
        if kind == "ddp":
            parts.append(apply_ddp(m, dims.mesh("dp_replicate"), compression=p.compression.type,
                                   powersgd_rank=p.compression.rank, powersgd_warmup=p.compression.warmup_steps,
                                   device=device))
        else:
            parts.append(m)
    del full_sd
    for m in parts:
        m.train()

    schedule = None
    if dims.pp_enabled:
        from torch.distributed.pipelining import PipelineStage

        pp_group = dims.mesh("pp").get_group()
        stages = [PipelineStage(part, s, n_stages, device, group=pp_group) for part, s in zip(parts, ids)]
        schedule = build_schedule(stages, schedule=p.pipeline_schedule, microbatches=p.microbatches)
    fsdp_bytes = (2 if cfg.precision.dtype == "bf16" else 4, DTYPES[p.fsdp_reduce_dtype].itemsize)
    return ParallelModel(dims=dims, rank=rank, device=device, parts=parts, modules=modules, kind=kind,
                         schedule=schedule, stage_ids=ids, notes=notes, fsdp_bytes=fsdp_bytes)

"""``parallelize``: one model-preparation path for every world size, one process included.

    model (the reference GPT built on meta, or a user's materialized model)
      -> [split into pipeline stages]              pipeline > 1 (reference GPT)
      -> per part, in this fixed order:
           tensor parallel (apply_tp)               tensor > 1 (reference GPT)
           activation checkpointing (apply_ac)      memory.checkpointing
           compile                                  compile.enabled: per block (regional) or the
                                                    whole part in place; after AC wrapping, before FSDP
           FSDP2 (data_shard > 1) | FSDP2 replicate (data > 1 with tensor or pipeline > 1)
           materialize on the device                a model built on meta
           DDP + compression hook                   data > 1 alone
      -> [PipelineStage per part + schedule]

One process is the layout where every degree is 1: the same function, with nothing to shard.
Every step names the repeated blocks through :func:`trainperf.models.blocks.find_blocks`.

Initial parameters equal one process's: a model built on meta is initialized from ``run.seed``
exactly as in one process and each part takes its slice of that full state dict
(``set_model_state_dict(full_state_dict=True)``), never a rank-dependent random init (this costs
one full copy of the model per rank during set-up). A user's model, already materialized, is
broadcast from rank 0 (its builder may draw from other generators).

:class:`ParallelModel` runs one optimizer step's forward/backward (gradient accumulation with
sync only on the last micro-step, or the pipeline schedule), reduces the loss for logging and
clips the gradient norm across DTensor shards and pipeline stages.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from trainperf.distributed.ddp import CommCounter
from trainperf.distributed.parallel_dims import ParallelDims
from trainperf.errors import ConfigError
from trainperf.models.blocks import find_blocks


class StepOOM(Exception):
    """A micro-step ran out of device memory on this rank or, agreed through ``oom_agree``, on another."""


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error: torch's (CUDA and other accelerators) or the CPU allocator's."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@contextlib.contextmanager
def explain_materialize_oom(n_params: int, device: torch.device, cfg):
    """Turn an allocator failure while a model's weights are created into an error that says what to do:
    a model too large for the device (a typo in model.n_embd, a preset meant for a cluster) otherwise ends
    the run with a traceback from deep inside ``Module.to_empty``."""
    try:
        yield
    except Exception as exc:
        if not is_oom(exc):
            raise
        from trainperf.errors import UserError

        p = cfg.parallelism
        gb = n_params * 4 / 1e9
        raise UserError(
            f"the model's weights do not fit on {device}: the model has {n_params / 1e9:,.2f}B parameters "
            f"({gb:,.1f} GB in fp32 before gradients, optimizer state and activations; layout: data_shard="
            f"{p.data_shard}, tensor={p.tensor}, pipeline={p.pipeline}; allocator: {str(exc).splitlines()[0][:160]}); "
            "use a smaller model (model.preset, model.n_layer, model.n_embd), shard it over more ranks "
            "(parallelism.data_shard, tensor or pipeline), and check the fit first with `trainperf memory CONFIG`"
        ) from None


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
    counter: CommCounter = field(default_factory=CommCounter)  # DDP gradient bytes handed to collectives
    oom_agree: object = None  # callable(local_failed: bool) -> any rank failed (collective); None: do not catch
    oom_above: int | None = None  # test knob: a micro-batch above this many samples raises OutOfMemoryError

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
                         sizes: list[int] | None = None, loss_scale=None, phase=None) -> torch.Tensor:
        """Run this rank's share (x, y: (local_batch, T)) of one global batch. Returns this rank's mean
        loss (detached; 0 on ranks without the last pipeline stage). Gradients are synchronized
        across data ranks only on the last micro-step.

        ``backward(loss)`` replaces ``loss.backward()`` (loss scaling); ``phase(name)`` is told when
        each micro-step's forward and backward begin (the phase timer).
        Load balancing: ``sizes`` (micro-batch sizes, the same count on every rank) and
        ``loss_scale(n)`` (factor for a micro-batch's mean loss, e.g. ``DynamicBalancer.loss_scale``)
        replace the equal split and ``1 / accum``; the return value is then the scaled sum."""
        if self.schedule is not None:
            if phase:
                phase("forward_backward")  # the schedule interleaves forwards and backwards
            return self._pipeline_step(x, y)
        model = self.parts[0]
        if sizes is None:
            sizes = [micro_batch] * max(1, x.shape[0] // micro_batch)
        accum = len(sizes)
        total = torch.zeros((), device=self.device)
        start = 0
        for i, m in enumerate(sizes):
            last = i == len(sizes) - 1
            mx, my = x[start:start + m], y[start:start + m]
            start += m
            if self.oom_agree is None:  # one process: the trainer catches an OOM itself
                total += self._micro_step(model, mx, my, m, last, accum, loss_scale, backward, phase)
                continue
            if last:
                # the synchronized micro-step: DDP's gradient all-reduce runs inside its backward, so the ranks
                # agree between its forward and its backward (an OOM inside the backward's collectives cannot be
                # agreed on: there the collective timeout ends the job with the fail-fast report). Under FSDP2
                # every forward gathers parameters block by block: an OOM partway through it leaves the other
                # ranks in a gather, and the same timeout ends the job; one before the first gather is agreed on.
                total += self._micro_step(model, mx, my, m, last, accum, loss_scale, backward, phase,
                                          agree=self.oom_agree)
                continue
            # OOM recovery: every rank agrees at the boundary after each earlier micro-step (no gradient
            # collective runs before the last one), so all abandon the step together or none does.
            failed = None
            try:
                total += self._micro_step(model, mx, my, m, last, accum, loss_scale, backward, phase)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are agreed on
                if not is_oom(exc):
                    raise
                failed = exc
            if self.oom_agree(failed is not None):  # collective: one flag per micro-step boundary
                raise StepOOM(str(failed) if failed else "another rank ran out of memory") from failed
        return total

    def _micro_step(self, model, mx, my, m, last, accum, loss_scale, backward, phase, agree=None) -> torch.Tensor:
        with self._sync(model, last):
            if phase:
                phase("forward")
            failed = None
            try:
                if self.oom_above is not None and m > self.oom_above:
                    raise torch.OutOfMemoryError(f"injected: micro-batch of {m} > {self.oom_above} samples (test knob)")
                with (self.autocast or contextlib.nullcontext)():
                    _, loss = model(mx, my)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are agreed on
                if agree is None or not is_oom(exc):
                    raise
                failed = exc
            if agree is not None and agree(failed is not None):  # collective, before any gradient collective
                reason = str(failed) if failed else "another rank ran out of memory"
                failed = loss = None  # the failed forward's activations (its traceback holds them)
                if self.kind == "ddp":
                    self._complete_ddp_round(model, mx[:1], my[:1])
                raise StepOOM(reason)
            # mean over the local batch, or the balancer's exact global-batch factor
            loss = loss * loss_scale(m) if loss_scale is not None else loss / accum
            if phase:
                phase("backward")
            (backward or torch.Tensor.backward)(loss)
        return loss.detach()

    def _complete_ddp_round(self, model, x1, y1) -> None:
        """After an agreed OOM in DDP's synchronized micro-step: a rank whose forward finished expects
        that forward's backward (DDP prepared its gradient reduction), a rank that failed in it does
        not, and the next backward would all-reduce on some ranks only. One zero-weighted forward and
        backward of one sample on every rank runs the same all-reduce on all of them (the trainer then
        zeroes the gradients before the retry)."""
        with (self.autocast or contextlib.nullcontext)():
            _, loss = model(x1, y1)
        (loss * 0.0).backward()

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

    def comm_figures(self) -> dict:
        """Gradient bytes of the step just run: DDP's counted by its hooks (then reset); FSDP2 and
        FSDP2-replicate estimated from the ring formulas of REFERENCE.md (not hooked)."""
        from trainperf.distributed.fsdp import fsdp_comm_bytes

        if self.kind == "ddp":
            return self.counter.take()
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

    def uncompile(self) -> None:
        """Undo ``Module.compile`` on every module (compile failed: continue eagerly). ``Module.compile``
        keeps the compiled callable in ``_compiled_call_impl``; clearing it restores eager calls."""
        for part in self.modules:
            for m in part.modules():
                if getattr(m, "_compiled_call_impl", None) is not None:
                    m._compiled_call_impl = None


def clip_grad_norm_(params, max_norm: float, dims: ParallelDims, device) -> torch.Tensor:
    """Global L2 norm of all gradients of the model (every shard counted once), clipped to ``max_norm``.

    Plain tensors are replicated over tensor/data ranks: counted locally. DTensor gradients: partial ones
    are summed first; the local shard's sum of squares is summed over the mesh dims where it is sharded
    (``Shard`` or FSDP2-over-TP's ``_StridedShard``: every placement but ``Replicate``).
    Pipeline stages: summed over the pipeline group.
    """
    from torch.distributed.tensor import DTensor, Replicate

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.zeros((), device=device, dtype=torch.float32)
    groups: dict = {}
    for g in grads:
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                # partial sums (sequence-parallel norms): the squared norm is of their sum, not the sum of theirs
                g = g.detach().redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl
                                                             for pl in g.placements])
            key = (id(g.device_mesh), tuple(g.placements))
            groups.setdefault(key, (g.device_mesh, g.placements, []))[2].append(g._local_tensor)
        else:
            total += g.detach().float().pow(2).sum()
    for mesh, placements, locs in groups.values():
        sq = torch.stack([t.detach().float().pow(2).sum() for t in locs]).sum()
        for d, pl in enumerate(placements):
            if not pl.is_replicate():  # Shard and _StridedShard (FSDP2 x TP: its is_shard() is False)
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


# ---------------------------------------------------------------------- the steps of the fixed order
def _on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


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


def _apply_ac(part: nn.Module, cfg, seq_len: int, block_path: str | None) -> str | None:
    ac = cfg.memory.checkpointing
    if ac.mode == "none":
        return None
    from trainperf.memory.budget import apply_checkpointing

    # blocks named explicitly: a pipeline stage may hold a single block (ratio/every_k count per stage)
    plan = apply_checkpointing(part, ac.model_copy(update={"blocks": block_path}), micro_batch=cfg.train.micro_batch,
                               seq_len=seq_len, dtype=cfg.precision.dtype, optimizer=cfg.optimizer.type)
    return f"{ac.mode}: {len(plan.full)} full, {len(plan.selective)} selective of {plan.n_blocks} blocks at {plan.block_path!r}"


def _apply_compile(part: nn.Module, cfg, blocks: list) -> str | None:
    """``Module.compile`` in place (FQNs and state_dict keys unchanged): each repeated block when
    ``compile.regional`` (resolved: always under FSDP2, tensor or pipeline parallelism), else the
    whole part. Compile after AC wrapping and before FSDP/DDP."""
    c = cfg.compile
    if not c.enabled:
        return None
    targets = blocks if (c.regional is True and blocks) else [part]
    for m in targets:
        m.compile(mode=c.mode, fullgraph=c.fullgraph, backend=c.backend)
    return f"{c.backend}, {'per block' if targets is blocks else 'whole model'} ({len(targets)} region(s))"


def tensor_parallel_plan(model: nn.Module):
    """The tensor-parallel function for ``model``'s architecture, or a ConfigError naming what is supported."""
    from trainperf.models.gpt import GPT

    if isinstance(model, GPT):
        from trainperf.distributed.tensor_parallel import apply_tp

        return apply_tp
    # Hugging Face Llama-style decoders and GPT-2 (a ConfigError names what it needs for anything else)
    from trainperf.distributed.hf_tp import apply_hf_tp

    return apply_hf_tp


def _kind(dims: ParallelDims) -> str:
    if dims.fsdp_enabled:
        return "fsdp"
    if dims.dp_replicate_enabled and (dims.tp_enabled or dims.pp_enabled):
        # DDP's reducer breaks under several pipeline forwards before a backward, and DDP cannot bucket
        # DTensors: replicas of tensor/pipeline-parallel parts use FSDP2's replicate.
        return "replicate"
    return "ddp" if dims.dp_replicate_enabled else "single"


def _split_stages(model: nn.Module, dims: ParallelDims, cfg, rank: int, seq_len: int, notes: dict):
    from trainperf.distributed.pipeline import block_costs, make_stage_module, split_layers, stage_ids
    from trainperf.models.gpt import GPT

    p = cfg.parallelism
    if not isinstance(model, GPT):
        raise ConfigError(f"parallelism.pipeline > 1 needs the reference GPT's blocks; {type(model).__name__} "
                          "trains with data parallelism (parallelism.data / data_shard)")
    gc = model.cfg
    n_stages = dims.pp * (p.interleave if p.pipeline_schedule == "interleaved_1f1b" else 1)
    costs, first_extra, last_extra = block_costs(gc.n_layer, gc.n_embd, seq_len, gc.vocab_size)
    split = split_layers(costs, n_stages, first_extra=first_extra, last_extra=last_extra)
    ids = stage_ids(dims.coords(rank)["pp"], dims.pp, n_stages // dims.pp)
    notes["pipeline_split"] = [len(s) for s in split]
    return n_stages, ids, [make_stage_module(model, split[s], first=s == 0, last=s == n_stages - 1) for s in ids]


def parallelize(model: nn.Module, dims: ParallelDims, cfg, *, rank: int = 0, device: torch.device | None = None,
                seq_len: int, bf16_gather: bool = False) -> ParallelModel:
    """Apply the configured layout to ``model`` (see the module docstring). Collective when
    ``dims.distributed``: every rank calls. ``bf16_gather``: a test knob (see :mod:`trainperf.train.knobs`)."""
    from trainperf.distributed.ddp import apply_ddp
    from trainperf.distributed.fsdp import DTYPES, apply_fsdp, apply_replicate

    device = torch.device(device or "cpu")
    p = cfg.parallelism
    from trainperf.models.gpt import GPT

    # the reference GPT names its blocks (a pipeline stage may hold one); other models: model.blocks (recorded
    # on the model by the builder) or the largest list of identical blocks
    block_path = cfg.memory.checkpointing.blocks or ("layers" if isinstance(model, GPT) else None)
    notes: dict = {"layout": dims.describe()}
    if dims.distributed:
        dims.build_mesh(device.type)
    meta = _on_meta(model)
    seed = cfg.run.seed
    n_params = sum(t.numel() for t in model.parameters())
    with explain_materialize_oom(n_params, device, cfg):
        full_sd = full_init_state(model, device, seed) if (meta and dims.distributed) else None
    if not meta and dims.distributed:
        # a user's model: every rank built it, rank 0's values are made everyone's before sharding
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
    tp_apply = tensor_parallel_plan(model) if dims.tp_enabled else None

    if dims.pp_enabled:
        n_stages, ids, modules = _split_stages(model, dims, cfg, rank, seq_len, notes)
    else:
        n_stages, ids, modules = 1, [0], [model]

    kind = _kind(dims)
    counter = CommCounter()
    parts = []
    for m in modules:
        path, blocks = find_blocks(m, block_path)
        if tp_apply is not None:
            tp_apply(m, dims.mesh("tp"), sequence_parallel=p.sequence_parallel)
        ac_note = _apply_ac(m, cfg, seq_len, path)
        compile_note = _apply_compile(m, cfg, blocks)
        if kind == "fsdp":
            param_dtype = torch.bfloat16 if cfg.precision.dtype == "bf16" else None
            apply_fsdp(m, dims.fsdp_mesh(), param_dtype=param_dtype, reduce_dtype=DTYPES[p.fsdp_reduce_dtype],
                       reshard_after_forward=not dims.pp_enabled, blocks=blocks)
        elif kind == "replicate":
            apply_replicate(m, dims.mesh("dp_replicate"), blocks=blocks)
        with explain_materialize_oom(n_params, device, cfg):
            if meta and full_sd is not None:
                m.to_empty(device=device)
                _load_full(m, full_sd)
            elif meta:  # one process: initialize in place, exactly as full_init_state would
                from trainperf.models.build import materialize_model

                materialize_model(m, device, seed)
        if kind == "ddp":
            parts.append(apply_ddp(m, dims.mesh("dp_replicate"), counter=counter, compression=p.compression.type,
                                   powersgd_rank=p.compression.rank, powersgd_warmup=p.compression.warmup_steps,
                                   device=device, bf16_gather=bf16_gather))
        else:
            parts.append(m)
        wrap = {"fsdp": "FSDP2 fully_shard", "replicate": "FSDP2 replicate", "ddp": "DDP"}.get(kind)
        if wrap:
            notes["wrapping"] = (f"{wrap} per block at {path!r} ({len(blocks)} blocks) + root" if blocks and kind != "ddp"
                                 else f"{wrap} of the whole model" + ("" if blocks else " (no repeated blocks found)"))
        if ac_note:
            notes["checkpointing"] = ac_note
        if compile_note:
            notes["compile"] = compile_note
    del full_sd
    for m in parts:
        m.train()

    schedule = None
    if dims.pp_enabled:
        from torch.distributed.pipelining import PipelineStage

        from trainperf.distributed.pipeline import build_schedule

        pp_group = dims.mesh("pp").get_group()
        stages = [PipelineStage(part, s, n_stages, device, group=pp_group) for part, s in zip(parts, ids)]
        schedule = build_schedule(stages, schedule=p.pipeline_schedule, microbatches=p.microbatches)
    fsdp_bytes = (2 if cfg.precision.dtype == "bf16" else 4, DTYPES[p.fsdp_reduce_dtype].itemsize)
    return ParallelModel(dims=dims, rank=rank, device=device, parts=parts, modules=modules, kind=kind,
                         schedule=schedule, stage_ids=ids, notes=notes, fsdp_bytes=fsdp_bytes, counter=counter)


def optimize(model: nn.Module, cfg) -> nn.Module:
    """For a user's own loop, in one process: activation checkpointing then compile, in place, in the
    order ``trainer`` uses (``tp.optimize``). Returns ``model`` (parameter names unchanged)."""
    seq_len = getattr(getattr(model, "cfg", None), "block_size", None) or cfg.model.block_size or 128
    return parallelize(model, ParallelDims.single(), cfg, seq_len=seq_len).parts[0]

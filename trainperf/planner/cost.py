"""Analytical cost model of one training step for a layout (no torch).

FLOPs and bytes come from :mod:`trainperf.analytic` (the one account shared with the memory
estimate and MFU); this module times them on one GPU type and adds the parallelism.

Compute (per layer and micro-batch): every GEMM by a soft roofline, ``FLOPs / rate + w x operand
bytes / HBM bandwidth``, at ``rate = dense peak x gemm_fraction (catalog, per GPU) x
stack_efficiency``; FlashAttention's causal blocks at ``attention_efficiency`` of that rate plus
its softmax at the FP32 vector peak; eager attention as batched GEMMs with a memory-bound softmax;
norms, activations and residual adds at HBM bandwidth; recompute per the layout.
Communication: tensor-parallel all-reduces (or SP reduce-scatter + all-gather) on the critical
path; FSDP/ZeRO-3 per-layer all-gather (forward, and again in backward) and reduce-scatter, each
overlapped with the neighbouring layer's compute (``max`` of the two, plus ``comm_contention``
of the overlap); DDP / ZeRO-1/2 reduction once per step against the last backward; context
parallel K/V exchange against the attention; pipeline 1F1B / interleaved with its bubble and
point-to-point transfers. Bandwidth: NVLink inside a node; across nodes, the NICs of the group's
members in a node (rail-optimized). Memory: :func:`memory_terms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from trainperf.analytic.activations import BF16, layer_terms, outside_terms, per_layer_bytes
from trainperf.analytic.spec import TransformerSpec
from trainperf.analytic.states import StateBytes
from trainperf.hardware.catalog import GPUSpec
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.kernels import Kernels, elementwise_bytes, rope_bytes, softmax_bytes
from trainperf.planner.stack import DEFAULT as DEFAULT_STACK
from trainperf.planner.stack import Stack

GIB = 2**30
RECOMPUTE = ("none", "selective", "full", "partial")
"""Planner recompute: ``selective`` is Megatron's (the attention core re-run: no s x s kept;
with FlashAttention it costs nothing and saves nothing more); ``full`` recomputes every layer of
every stage (Megatron's ``--recompute-granularity full --recompute-method uniform
--recompute-num-layers 1``); ``partial`` recomputes ``recompute_layers`` whole layers per stage and
keeps the rest (Megatron's ``--recompute-method block``)."""


@dataclass(frozen=True)
class Layout:
    """One way to run the model: degrees, micro-batch and memory savers."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    interleave: int = 1
    recompute: str = "selective"
    sequence_parallel: bool = False
    zero: int = 0
    """0: replicated states (DDP); 1: optimizer sharded over DP (distributed optimizer);
    2: + gradients; 3: + parameters (FSDP full shard)."""
    cp: int = 1
    """Context parallel degree (the sequence split over cp ranks; K/V exchanged)."""
    shard: int = 0
    """HSDP: ZeRO shards within groups of this many data-parallel ranks and replicates across
    groups (0: over all of dp)."""
    recompute_layers: int = 0
    """With recompute="partial": how many whole layers per stage are recomputed (Megatron's
    --recompute-method block); the others keep their activations. 0 with any other mode."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def shard_group(self) -> int:
        """Ranks one copy of the model states is sharded over (dp x cp, or the HSDP group x cp)."""
        return (self.shard if 0 < self.shard < self.dp else self.dp) * self.cp

    def as_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "micro_batch": self.micro_batch,
            "interleave": self.interleave, "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel, "zero": self.zero, "hsdp_shard": self.shard or None,
            "recompute_layers_per_stage": self.recompute_layers if self.recompute == "partial" else None,
        }

    def short(self) -> str:
        sp = "+SP" if self.sequence_parallel else ""
        z = f" zero{self.zero}" if self.zero else ""
        v = f" v{self.interleave}" if self.interleave > 1 else ""
        cp = f" CP{self.cp}" if self.cp > 1 else ""
        hs = f" hsdp{self.shard}" if 0 < self.shard < self.dp else ""
        rc = self.recompute + (f"({self.recompute_layers}/stage)" if self.recompute == "partial" else "")
        return f"TP{self.tp}{sp}{cp} PP{self.pp}{v} DP{self.dp} mb{self.micro_batch} {rc}{z}{hs}"


@dataclass
class Estimate:
    layout: Layout
    microbatches: int
    memory: dict = field(default_factory=dict)   # bytes, per GPU, by component
    time: dict = field(default_factory=dict)     # seconds per step, by component
    composition_inputs: tuple = field(default=(), repr=False, compare=False)
    """What :attr:`composition` is computed from, on first use (a search times thousands of layouts and shows a few)."""
    _composition: dict | None = field(default=None, init=False, repr=False, compare=False)
    step_time_s: float = 0.0
    model_flops: float = 0.0                     # per step, all GPUs
    peak_flops: float = 0.0                      # dense, per GPU
    gpu_memory_bytes: float = 0.0
    layers_per_stage: int = 0

    @property
    def composition(self) -> dict:
        """Seconds per step by what they are made of (:data:`COMPOSITION`), summing to the step time: ``time`` with its
        compute split by kind and the vocabulary-parallel heads' all-reduces counted with the tensor-parallel ones
        (what the interval's width follows: :mod:`trainperf.planner.composition`)."""
        if self._composition is None:
            self._composition = _composition(*self.composition_inputs) if self.composition_inputs else {}
        return self._composition

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.gpu_memory_bytes

    @property
    def binding(self) -> str:
        """The largest memory term: the one to shrink first when the layout does not fit."""
        return max(self.memory, key=self.memory.get) if self.memory else ""

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.layout.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_flops / self.step_time_s / self.layout.gpus / self.peak_flops

    def as_dict(self) -> dict:
        d = self.layout.as_dict()
        L = self.layout
        d.update(
            layers_per_stage=self.layers_per_stage,
            # every layer of every stage under full; the block count under partial
            recompute_layers_per_stage=(self.layers_per_stage if L.recompute == "full" else
                                        L.recompute_layers if L.recompute == "partial" else 0),
            microbatches=self.microbatches,
            step_time_s=round(self.step_time_s, 4),
            tflops_per_gpu=round(self.tflops_per_gpu, 1),
            mfu=round(self.mfu, 4),
            fits=self.fits,
            binding_memory_term=self.binding,
            memory_per_gpu_gib=round(self.memory_bytes / GIB, 2),
            memory_headroom_gib=round((self.gpu_memory_bytes - self.memory_bytes) / GIB, 2),
            memory_gib={k: round(v / GIB, 2) for k, v in self.memory.items()},
            time_s={k: round(v, 4) for k, v in self.time.items()},
            composition_s={k: round(v, 4) for k, v in self.composition.items()},
        )
        return d


# ---------------------------------------------------------------------------------- one layer
@lru_cache(maxsize=8192)
def layer_cost(model: TransformerSpec, gpu: GPUSpec, c: Constants, tp: int, b: int, sp: bool, recompute: str,
               cp: int = 1, stack: Stack = DEFAULT_STACK) -> dict:
    """Per-micro-batch times (s) of one transformer layer on one GPU, and its activation bytes.
    ``recompute`` is a per-layer kind: none, selective or full (partial mixes them per stage)."""
    k = Kernels(gpu, c, nvls=stack.nvls)
    s, h, f, d = model.seq, model.hidden, model.ffn, model.head_dim
    sp = sp and tp > 1
    sl = s // cp                          # tokens of one sequence on this rank
    M = b * sl
    X = M * h
    Xs = X / tp if sp else X              # what the replicated (norm / residual) region touches
    fp8 = stack.float8
    cached = fp8 and stack.fp8_weight_cache
    decomposed = stack.async_tp and tp > 1 and stack.tp_overlap == "decomposed"
    fwd = bwd = 0.0
    q = model.q_dim
    gemm_rate = 0.0
    for m_, n_, k_ in ((M, (q + 2 * model.kv_dim) / tp, h), (M, h, q / tp), (M, model.ffn_in / tp, h), (M, h, f / tp)):
        tf, tb = k.gemm_fwd_bwd(m_, n_, k_, fp8=fp8, fused=stack.fused, weight_cached=cached)
        fwd += tf
        bwd += tb
        gemm_rate += 6.0 * m_ * n_ * k_ / (k.rate8 if fp8 else k.rate)
    gemm_fwd, gemm_bwd = fwd, bwd
    heads = model.heads / tp
    # Megatron 2022 (eager attention) trains with dropout; FlashAttention stacks without.
    dropout = model.attention == "eager"
    if model.attention == "flash":
        # Causal: each rank's share of the s x s blocks (load-balanced under context parallel).
        core_fwd, core_bwd = k.flash(b, heads, sl, s, d, model.causal_fraction, stack.attention_kernel)
        core_recompute = 0.0
    else:
        A = b * heads * sl * s            # score elements per GPU
        mm = k.gemm(sl, s, d, batch=b * heads) + k.gemm(sl, d, s, batch=b * heads)
        sm_f, sm_b = softmax_bytes(stack.fused, dropout)
        core_fwd = mm + k.memory_bound(sm_f * A, 2 if stack.fused else 4)
        core_bwd = 2 * mm + k.memory_bound(sm_b * A, 2 if stack.fused else 4)
        core_recompute = core_fwd
    # Norms, residual adds, dropout, biases and the activation, bytes read + written; backward twice.
    stream, act, kernels = elementwise_bytes(model, stack.fused, dropout)
    elem = k.memory_bound(stream * Xs + act * M * f / tp, kernels)
    rb, rk = rope_bytes(model, stack.fused)
    rope = k.memory_bound(rb * M * (q + model.kv_dim) / tp, rk) if rk else 0.0
    fwd += core_fwd + elem + rope
    bwd += core_bwd + 2 * elem + rope

    # Tensor-parallel collectives: 2 per layer forward, 2 backward (SP: reduce-scatter + all-gather).
    comm_fwd = 0.0
    if tp > 1:  # all-reduces (NVLink SHARP where the node has it), or SP's reduce-scatter + all-gather (ring)
        comm_fwd = 2 * (2 * k.gather_group(2 * X, tp, 1) if sp else k.all_reduce_group(2 * X, tp, 1))
    cp_comm = 0.0
    if cp > 1:  # all-gather K and V forward, reduce-scatter their gradients backward
        kv_bytes = 2 * 2 * b * s * model.kv_dim / tp
        cp_comm = 2 * k.gather_group(kv_bytes, cp, tp)
        cp_comm = max(0.0, cp_comm - (core_fwd + core_bwd))  # overlapped with the attention
    if recompute == "full":
        re_compute, re_comm = fwd, comm_fwd
    elif recompute == "selective":
        re_compute, re_comm = core_recompute, 0.0
    else:
        re_compute, re_comm = 0.0, 0.0
    tp_comm = 2 * comm_fwd + re_comm
    if decomposed and tp_comm > 0:  # decomposed collectives beside the matmuls they feed (recomputed ones too)
        tp_comm = k.decomposed(gemm_fwd + gemm_bwd + (gemm_fwd if recompute == "full" else 0.0), tp_comm, tp)
    elif stack.async_tp and tp_comm > 0:  # concurrent: beside the layer's other, independent work
        tp_comm = k.overlapped(fwd + bwd + re_compute, tp_comm) - (fwd + bwd + re_compute)

    # Under CP the eager scores would span every key: layer_terms counts the local ones (CP runs flash).
    terms = layer_terms(model, b, sl, BF16, dropout=dropout)
    kind = {"none": "none", "selective": "attention", "full": "full"}[recompute]
    return {
        "compute": fwd + bwd + re_compute,
        # the compute by kind (summing to it): GEMMs (and of them, their FLOPs at the GEMM rate), the attention core,
        # memory-bound elementwise work, recompute
        "gemm": gemm_fwd + gemm_bwd, "gemm_at_rate": gemm_rate, "attention": core_fwd + core_bwd,
        "elementwise": 3 * elem + 2 * rope, "recompute": re_compute,
        "fwd": fwd,
        "bwd": bwd + re_compute,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm,
        "act_bytes": per_layer_bytes(terms, kind, tp=tp, sp=sp),
        "full_layer_act_bytes": per_layer_bytes(terms, "none", tp=tp, sp=sp),
    }


@lru_cache(maxsize=2048)
def _head_cost(model: TransformerSpec, gpu: GPUSpec, c: Constants, tp: int, b: int, cp: int = 1,
               nvls: bool = True) -> dict:
    """Per-micro-batch time of the embedding (first stage) and logits + loss (last stage)."""
    k = Kernels(gpu, c, nvls=nvls)
    sl, h, V = model.seq // cp, model.hidden, model.vocab
    M, X = b * sl, b * sl * h
    tf, tb = k.gemm_fwd_bwd(M, V / tp, h)
    logits = M * V / tp
    loss = k.memory_bound(28 * logits, 4)  # fp32 softmax cross-entropy, forward + backward
    embed = k.memory_bound(2 * 2 * X + 2 * 2 * X, 2)
    comm = 0.0
    if tp > 1:
        comm = k.all_reduce_group(2 * X, tp, 1) * 2  # vocab-parallel embedding, logits grad
    return {"first": embed + comm, "last": tf + tb + loss + comm, "gemm": tf + tb, "comm": comm,
            "gemm_at_rate": 6.0 * M * V / tp * h / k.rate, "first_elementwise": embed, "last_elementwise": loss}


# ---------------------------------------------------------------------------------- memory
def state_bytes(c: Constants, zero: int, stack: Stack = DEFAULT_STACK) -> StateBytes:
    """Megatron mixed precision (bf16 weights, fp32 grads, fp32 master + Adam: 18 B/param) or,
    under ZeRO-3/FSDP, the sharded fp32 parameter as the master (4 + 4 + 8 = 16 B/param). A stack
    with 16-bit gradients (``stack.grad_bytes``) keeps its fp32 gradient copy with the optimizer."""
    if zero >= 3:
        return StateBytes(4.0, c.grad_bytes, c.optimizer_bytes - 4.0)
    if stack.grad_bytes is not None:
        return StateBytes(c.param_bytes, stack.grad_bytes, c.optimizer_bytes + c.grad_bytes)
    return StateBytes(c.param_bytes, c.grad_bytes, c.optimizer_bytes)


def memory_terms(model: TransformerSpec, layout: Layout, microbatches: int, c: Constants,
                 lc: dict, stack: Stack = DEFAULT_STACK) -> dict[str, float]:
    """Bytes per GPU of the busiest pipeline stage, by term."""
    L = layout
    t, p, v, b = L.tp, L.pp, L.interleave, L.micro_batch
    layers_dev = math.ceil(model.layers / p)
    emb = model.embedding_params() / t
    head = (0 if model.tied and p == 1 else model.vocab * model.hidden) / t
    layer_params = layers_dev * model.layer_params() / t
    sb = state_bytes(c, L.zero, stack)
    per_param = sb.per_param(L.zero, L.shard_group)
    if p > 1:
        in_flight = min(microbatches, p) * (1 + (p - 1) / (p * v) if v > 1 else 1)
    else:
        in_flight = 1
    out = outside_terms(model, b, model.seq // L.cp, BF16)
    sp_div = t if L.sequence_parallel and t > 1 else 1
    tokens = b * model.seq // L.cp
    logit_bytes = 4 * tokens * model.vocab  # the fp32 log-softmax outside_terms counts
    loss_peak = (out["last"] - logit_bytes) / sp_div + c.loss_bytes_per_logit * tokens * model.vocab / t
    recompute_working = lc["full_layer_act_bytes"] if L.recompute in ("full", "partial") else 0.0
    first = {
        "model_states": (layer_params + emb + (head if p == 1 else 0)) * per_param,
        "activations": lc["act_bytes"] * layers_dev * in_flight + recompute_working + out["first"] * in_flight,
        "logits_loss": loss_peak if p == 1 else 0.0,
    }
    if p > 1:
        last = {
            "model_states": (layer_params + head) * per_param,
            "activations": lc["act_bytes"] * layers_dev + recompute_working,
            "logits_loss": loss_peak,
        }
        if sum(last.values()) > sum(first.values()):
            first = last
    if L.zero >= 3 and p > 1:  # under a pipeline the stage's parameters and gradients stay unsharded
        first["fsdp_unsharded"] = (c.param_bytes + (stack.fsdp_reduce_bytes or c.fsdp_reduce_bytes)) * layers_dev * model.layer_params() / t
    elif L.zero >= 3:  # gathered bf16 parameters of the current and the prefetched layer, one layer's grads
        first["fsdp_unsharded"] = (2 * c.param_bytes + (stack.fsdp_reduce_bytes or c.fsdp_reduce_bytes)) * model.layer_params() / t
    first["reserved"] = c.memory_reserved_gib * GIB
    return first


# ---------------------------------------------------------------------------------- a step
DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default ``bucket_cap_mb=25`` (torch.nn.parallel.DistributedDataParallel)."""
MEGATRON_BUCKET_PARAMS = (40_000_000, 1_000_000)
"""Megatron-Core's default bucket: ``max(40000000, 1000000 * dp_size)`` parameters
(megatron/core/distributed/distributed_data_parallel.py, when ``ddp_config.bucket_size`` is None)."""


def _bucket_params(stack: Stack, dp: int, c: Constants) -> float:
    """Parameters per data-parallel reduction bucket of the stack (0: ``ideal``, nothing left exposed)."""
    if stack.dp_bucket == "ideal":
        return 0.0
    if stack.dp_bucket == "megatron":
        return max(MEGATRON_BUCKET_PARAMS[0], MEGATRON_BUCKET_PARAMS[1] * dp)
    return DDP_BUCKET_BYTES / c.dp_grad_comm_bytes


def _gemm_weights(model: TransformerSpec) -> float:
    """Elements of one layer's four GEMM weights (QKV, output, MLP in, MLP out)."""
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    return h * (q + 2 * kv) + q * h + h * model.ffn_in + model.ffn * h


COMPOSITION = ("gemm", "gemm_shape", "attention", "elementwise", "recompute", "tp_comm", "cp_comm", "fsdp_comm",
               "pp_bubble", "pp_p2p", "dp_comm", "optimizer")
"""What a step is made of (:attr:`Estimate.composition`): ``gemm``, the GEMMs' FLOPs at the GEMM rate (the published
ceiling: parts.py); ``gemm_shape``, what the GEMMs take beyond that (wave quantization, the memory roofline, launches,
FP8 casts); ``attention``, the attention core; ``elementwise``, memory-bound work (norms, activations, residuals,
rotary, the loss, the embedding, FP8 weight casts); ``recompute``, the recomputed forward; then :attr:`Estimate.time`'s
exposed communication, pipeline bubble and point-to-point, and the optimizer step."""


def _composition(time: dict, lc: dict, hc: dict, layer_runs: int, m: int, p: int, fp8_cast: float) -> dict:
    """``time`` with its compute split by kind (:data:`COMPOSITION`): ``layer_runs`` layers run per step on the busiest
    stage, and the heads of that stage ``m`` times (both heads on one stage when ``p`` is 1)."""
    first = p == 1 or hc["first"] > hc["last"]
    last = p == 1 or not first
    out = {k: layer_runs * lc[k] for k in ("gemm", "attention", "elementwise", "recompute")}
    at_rate = layer_runs * lc["gemm_at_rate"] + m * hc["gemm_at_rate"] * last
    out["gemm_shape"] = out["gemm"] + m * hc["gemm"] * last - at_rate
    out["gemm"] = at_rate
    out["elementwise"] += m * (hc["first_elementwise"] * first + hc["last_elementwise"] * last) + fp8_cast
    out.update({k: time[k] for k in COMPOSITION if k in time})
    out["tp_comm"] += m * hc["comm"] * (first + last)  # the vocabulary-parallel heads' all-reduces
    return {k: out[k] for k in COMPOSITION}


def estimate(model: TransformerSpec, gpu: GPUSpec, layout: Layout, global_batch: int, c: Constants = DEFAULTS,
             dtype: str = "bf16", stack: Stack = DEFAULT_STACK) -> Estimate:
    """Memory per GPU and step time of `layout` (assumed valid: see search.check_layout) on the
    training stack `stack` (its mechanisms: :mod:`trainperf.planner.stack`)."""
    L = layout
    t, p, dp, b, v, cp = L.tp, L.pp, L.dp, L.micro_batch, L.interleave, L.cp
    m = global_batch // (dp * b)
    k = Kernels(gpu, c, dtype, nvls=stack.nvls)
    layers_dev = math.ceil(model.layers / p)
    if L.recompute == "partial":  # block recompute: recompute_layers whole layers per stage, the rest kept
        lc = layer_cost(model, gpu, c, t, b, L.sequence_parallel, "full", cp, stack)
        kept = layer_cost(model, gpu, c, t, b, L.sequence_parallel, "none", cp, stack)
        w = min(1.0, L.recompute_layers / layers_dev)
        lc = {key: w * lc[key] + (1 - w) * kept[key] for key in lc}
        lc["full_layer_act_bytes"] = kept["full_layer_act_bytes"]
    else:
        lc = layer_cost(model, gpu, c, t, b, L.sequence_parallel, L.recompute, cp, stack)
    hc = _head_cost(model, gpu, c, t, b, cp, stack.nvls)
    memory = memory_terms(model, L, m, c, lc, stack)

    # ---- per micro-batch, one stage: layers (with FSDP's per-layer traffic overlapped), p2p
    exposed_tp = lc["tp_comm"]
    n_shard = L.shard_group
    red_bytes = stack.fsdp_reduce_bytes or c.fsdp_reduce_bytes
    layer_bytes = model.layer_params() / t
    fsdp = L.zero >= 3 and n_shard > 1
    fsdp_once = 0.0
    # ZeRO-3's copies around its collectives (stack.fsdp_copy_bytes per parameter element): per layer and
    # micro-batch when it gathers per micro-batch, once per step under a pipeline (gathered across them)
    fsdp_copy = k.memory_bound(stack.fsdp_copy_bytes * layer_bytes, 3) if fsdp and stack.fsdp_copy_bytes else 0.0
    if fsdp and p > 1:
        # FSDP under a pipeline schedule (torchtitan, torch.distributed.pipelining): parameters stay
        # gathered across the step's micro-batches and gradients are reduced at the last backward,
        # so each layer's all-gather and reduce-scatter run once per step, beside the first
        # forward and the last backward.
        ag = k.gather_group(c.param_bytes * layer_bytes, n_shard, t)
        rs = k.gather_group(red_bytes * layer_bytes, n_shard, t)
        fsdp_once = layers_dev * (k.overlapped(lc["fwd"], ag) - lc["fwd"] + k.overlapped(lc["bwd"], rs) - lc["bwd"]
                                  + fsdp_copy) + ag
        t_layer = lc["compute"] + exposed_tp + lc["cp_comm"]
        fsdp_exposed = first_gather = 0.0
    elif fsdp:
        ag = k.gather_group(c.param_bytes * layer_bytes, n_shard, t)
        rs = k.gather_group(red_bytes * layer_bytes, n_shard, t)
        t_fwd = k.overlapped(lc["fwd"], ag)
        t_bwd = k.overlapped(lc["bwd"], ag + rs)
        t_layer = t_fwd + t_bwd + exposed_tp + lc["cp_comm"] + fsdp_copy
        fsdp_exposed = t_layer - (lc["compute"] + exposed_tp + lc["cp_comm"])
        first_gather = ag  # the first layer's all-gather has nothing to hide behind
    else:
        t_layer = lc["compute"] + exposed_tp + lc["cp_comm"]
        fsdp_exposed = first_gather = 0.0
    p2p = 0.0
    if p > 1:
        bw = k.bandwidth(2, t * cp)
        p2p = 2 * v * k.p2p(2 * b * (model.seq // cp) * model.hidden / t, bw) * (1 - c.p2p_overlap)
    t_mid = layers_dev * t_layer + p2p + first_gather
    t_first = t_mid + hc["first"] + (hc["last"] if p == 1 else 0.0)
    t_last = t_mid + (hc["last"] if p > 1 else 0.0)
    t_max = max(t_first, t_last)
    t_avg = (t_first + t_last + (p - 2) * t_mid) / p if p > 1 else t_first
    pipeline = m * t_max + (p - 1) / v * t_avg
    bubble = pipeline - m * t_max

    # ---- DDP / ZeRO-1/2: one reduction per step against the last micro-batch's backward
    dev_params = (layers_dev * model.layer_params() + model.embedding_params()) / t
    dp_time = 0.0
    if dp * cp > 1 and not fsdp:
        n = dp * cp
        gbytes = dev_params * c.dp_grad_comm_bytes
        ag = 0.0
        if L.zero == 0:
            rs = k.all_reduce_group(gbytes, n, t)
        else:
            ag = k.gather_group(dev_params * c.param_bytes, n_shard, t)
            if stack.grad_reduce_op == "all-reduce":  # the whole gradient on every rank, each steps its shard
                rs = k.all_reduce_group(gbytes, n, t)
            else:
                rs = k.gather_group(gbytes, n_shard, t)
                if n_shard < n:  # HSDP-style replicas: all-reduce the shards across groups
                    rs += k.all_reduce_group(gbytes / n_shard, n // n_shard, t * n_shard)
        # overlapped: in buckets beside the last micro-batch's backward; the last bucket (the first layers' and the
        # embedding's gradients) is ready only when the backward ends, so its share stays exposed. The part hidden
        # still costs comm_contention of it (NCCL takes SMs and HBM while it runs beside the backward).
        last = min(1.0, _bucket_params(stack, n, c) / max(dev_params, 1.0))
        bwd_all, fwd_all = lc["bwd"] * layers_dev, lc["fwd"] * layers_dev
        if stack.dp_reduce == "after":  # reduced once the backward is done: all of it exposed
            dp_time = rs
        else:
            dp_time = last * rs + k.overlapped(bwd_all, (1 - last) * rs) - bwd_all
        if ag and stack.param_gather_mode == "after":  # gathered before the next forward starts
            dp_time += ag
        elif ag:  # the distributed optimizer's all-gather beside the next forward, its first bucket exposed
            dp_time += last * ag + k.overlapped(fwd_all, (1 - last) * ag) - fwd_all
    elif fsdp and n_shard < dp * cp:  # HSDP: all-reduce the gradient shard across replica groups
        reps = dp * cp // n_shard
        dp_time = k.all_reduce_group(dev_params * red_bytes / n_shard, reps, t * n_shard)
    emb_sync = k.all_reduce(model.embedding_params() / t * c.dp_grad_comm_bytes, 2, k.nic) if p > 1 and model.tied else 0.0

    opt_params = dev_params / n_shard if L.zero >= 1 else dev_params
    optimizer = k.memory_bound(opt_params * c.optimizer_traffic_bytes, 10)
    # Transformer Engine's FP8 weights: cast (and transposed) once per step, on the first micro-batch
    fp8_cast = layers_dev * k.weight_cast_once(_gemm_weights(model) / t) if stack.float8 and stack.fp8_weight_cache else 0.0

    step = pipeline + dp_time + emb_sync + optimizer + fsdp_once + fp8_cast
    heads_time = hc["first"] + hc["last"] if p == 1 else max(hc["first"], hc["last"])
    time = {
        "compute": m * (layers_dev * lc["compute"] + heads_time) + fp8_cast,
        "tp_comm": m * layers_dev * exposed_tp,
        "cp_comm": m * layers_dev * lc["cp_comm"],
        "fsdp_comm": m * (layers_dev * fsdp_exposed + first_gather) + fsdp_once,
        "pp_bubble": bubble,
        "pp_p2p": m * p2p,
        "dp_comm": dp_time + emb_sync,
        "optimizer": optimizer,
    }
    return Estimate(
        layout=L, microbatches=m, memory=memory, time=time, step_time_s=step,
        composition_inputs=(time, lc, hc, m * layers_dev, m, p, fp8_cast),
        model_flops=model.model_flops_per_token() * model.seq * global_batch,
        peak_flops=k.peak, gpu_memory_bytes=gpu.hbm_bytes, layers_per_stage=layers_dev,
    )

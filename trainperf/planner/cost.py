"""Analytical cost model of one training step for a 3D-parallel layout (no torch).

Memory per GPU: model states (ZeRO-aware), activations of the layers in flight on the first
pipeline stage (Korthikanti et al. 2022, Table 2, generalized to any MLP width), the last
stage's logits, and a reserve. Step time: every GEMM, attention batched-matmul and
memory-bound kernel of a Megatron-style layer timed by a roofline with a size-dependent GEMM
efficiency; tensor-parallel collectives on NVLink (or the network when TP spans nodes);
1F1B / interleaved pipeline with its bubble and point-to-point transfers; data-parallel
gradient reduction with its overlap; the optimizer step. Constants: :mod:`.constants`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from trainperf.hardware.catalog import GPUSpec
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.model import ModelSpec

GIB = 2**30
RECOMPUTE = ("none", "selective", "full")


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

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def as_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batch": self.micro_batch,
            "interleave": self.interleave, "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel, "zero": self.zero,
        }

    def short(self) -> str:
        sp = "+SP" if self.sequence_parallel else ""
        z = f" zero{self.zero}" if self.zero else ""
        v = f" v{self.interleave}" if self.interleave > 1 else ""
        return f"TP{self.tp}{sp} PP{self.pp}{v} DP{self.dp} mb{self.micro_batch} {self.recompute}{z}"


@dataclass
class Estimate:
    layout: Layout
    microbatches: int
    memory: dict = field(default_factory=dict)   # bytes, per GPU, by component
    time: dict = field(default_factory=dict)     # seconds per step, by component
    step_time_s: float = 0.0
    model_flops: float = 0.0                     # per step, all GPUs
    peak_flops: float = 0.0                      # dense, per GPU
    gpu_memory_bytes: float = 0.0

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.gpu_memory_bytes

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.layout.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.model_flops / self.step_time_s / self.layout.gpus / self.peak_flops

    def as_dict(self) -> dict:
        d = self.layout.as_dict()
        d.update(
            microbatches=self.microbatches,
            step_time_s=round(self.step_time_s, 4),
            tflops_per_gpu=round(self.tflops_per_gpu, 1),
            mfu=round(self.mfu, 4),
            memory_per_gpu_gib=round(self.memory_bytes / GIB, 2),
            memory_gib={k: round(v / GIB, 2) for k, v in self.memory.items()},
            time_s={k: round(v, 4) for k, v in self.time.items()},
        )
        return d


# ---------------------------------------------------------------------------------- kernels
class _Kernels:
    """Roofline timing of single kernels and collectives on one GPU type."""

    def __init__(self, gpu: GPUSpec, c: Constants, dtype: str = "bf16"):
        self.c = c
        self.peak = gpu.peak_tflops(dtype) * 1e12
        self.hbm = gpu.hbm_tbps * 1e12 * c.hbm_fraction
        self.nvlink = gpu.nvlink_gbps / 2 * 1e9 * c.nvlink_fraction
        self.net = gpu.internode_gbps * 1e9 * c.internode_fraction
        self.per_node = gpu.gpus_per_node

    def gemm(self, m: float, n: float, k: float, batch: float = 1.0, bytes_per=2) -> float:
        c = self.c
        h = c.matmul_dim_half
        eff = c.matmul_peak_fraction * (m / (m + h)) * (n / (n + h)) * (k / (k + h))
        t_compute = 2.0 * m * n * k * batch / (self.peak * eff)
        t_memory = bytes_per * (m * k + k * n + m * n) * batch / self.hbm
        return max(t_compute, t_memory) + c.kernel_overhead_s

    def gemm_fwd_bwd(self, m: float, n: float, k: float) -> tuple[float, float]:
        """(forward, backward = data grad + weight grad) for Y[m,n] = X[m,k] W[k,n]."""
        return self.gemm(m, n, k), self.gemm(m, k, n) + self.gemm(k, n, m)

    def memory_bound(self, nbytes: float, kernels: int = 1) -> float:
        return nbytes / self.hbm + kernels * self.c.kernel_overhead_s

    def bandwidth(self, group: int, span: int) -> float:
        """Bus bandwidth of a collective among `group` ranks spread over `span` consecutive
        ranks: NVLink when they share a node, else the per-GPU network."""
        return self.nvlink if span <= self.per_node else self.net

    def _latency(self, n: int) -> float:
        return self.c.collective_latency_s * max(1, math.ceil(math.log2(n)))

    def all_reduce(self, nbytes: float, n: int, bw: float) -> float:
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n * nbytes / bw + 2 * self._latency(n)

    def half_collective(self, nbytes: float, n: int, bw: float) -> float:
        """Reduce-scatter or all-gather of a buffer of `nbytes` (full size)."""
        if n <= 1:
            return 0.0
        return (n - 1) / n * nbytes / bw + self._latency(n)

    def p2p(self, nbytes: float, bw: float) -> float:
        return nbytes / bw + self.c.collective_latency_s


# ---------------------------------------------------------------------------------- one layer
@lru_cache(maxsize=4096)
def layer_cost(model: ModelSpec, gpu: GPUSpec, c: Constants, tp: int, b: int, sp: bool, recompute: str) -> dict:
    """Per-micro-batch times (s) of one transformer layer on one GPU, and its activation bytes."""
    k = _Kernels(gpu, c)
    s, h, a, f = model.seq, model.hidden, model.heads, model.ffn
    d = model.head_dim
    sp = sp and tp > 1
    M = b * s
    X = b * s * h                        # elements of one (b, s, h) activation
    Xs = X / tp if sp else X             # what the replicated (norm/dropout) region touches
    A = b * (a / tp) * s * s             # attention score elements per GPU
    inter = b * s * f / tp               # MLP intermediate elements per GPU
    f1 = (2 if model.gated else 1) * f   # FC1 output width (SwiGLU: gate and up)

    fwd = bwd = 0.0
    for m_, n_, k_ in ((M, 3 * h / tp, h), (M, h, h / tp), (M, f1 / tp, h), (M, h, f / tp)):
        tf, tb = k.gemm_fwd_bwd(m_, n_, k_)
        fwd += tf
        bwd += tb
    # Attention core: Q·K^T and P·V as batched GEMMs (b·a/t of them), softmax and dropout.
    nb = b * a / tp
    core_fwd = k.gemm(s, s, d, batch=nb) + k.gemm(s, d, s, batch=nb) + k.memory_bound(4 * A + 5 * A, 2)
    core_bwd = 2 * k.gemm(s, s, d, batch=nb) + 2 * k.gemm(s, d, s, batch=nb) + k.memory_bound(6 * A + 5 * A, 2)
    # Norms, bias-dropout-adds and the activation: bytes read + written (16-bit), backward twice.
    act_bytes = (6 if model.gated else 4) * inter
    elem_fwd = k.memory_bound(2 * 11 * Xs + act_bytes, 6)
    elem_bwd = k.memory_bound(2 * (2 * 11 * Xs + act_bytes), 6)
    fwd += core_fwd + elem_fwd
    bwd += core_bwd + elem_bwd

    # Tensor-parallel collectives: 2 per layer forward, 2 backward (SP: each all-reduce becomes
    # a reduce-scatter + all-gather of the same volume).
    comm_fwd = 0.0
    if tp > 1:
        bw = k.bandwidth(tp, tp)
        if sp:
            comm_fwd = 2 * (k.half_collective(2 * X, tp, bw) * 2)
        else:
            comm_fwd = 2 * k.all_reduce(2 * X, tp, bw)
    comm_bwd = comm_fwd

    if recompute == "full":
        re_compute, re_comm = fwd, comm_fwd
    elif recompute == "selective":
        re_compute, re_comm = core_fwd, 0.0
    else:
        re_compute, re_comm = 0.0, 0.0

    # Activation bytes kept per layer and micro-batch (Korthikanti Table 2, any MLP width).
    replicated = 10 * s * b * h
    parallel = 8 * s * b * h + (6 if model.gated else 4) * s * b * f
    core = 5 * a * s * s * b
    if sp:
        replicated /= tp
    full_layer = replicated + (parallel + core) / tp
    if recompute == "none":
        act = full_layer
    elif recompute == "selective":
        act = replicated + parallel / tp
    else:
        act = 2 * s * b * h / (tp if sp else 1)
    return {
        "compute": fwd + bwd + re_compute,
        "fwd": fwd,
        "bwd": bwd + re_compute,
        "tp_comm": comm_fwd + comm_bwd + re_comm,
        "act_bytes": act,
        "full_layer_act_bytes": full_layer,
    }


@lru_cache(maxsize=1024)
def _head_cost(model: ModelSpec, gpu: GPUSpec, c: Constants, tp: int, b: int, sp: bool) -> dict:
    """Per-micro-batch time of the embedding (first stage) and logits + loss (last stage)."""
    k = _Kernels(gpu, c)
    s, h, V = model.seq, model.hidden, model.vocab
    M, X = b * s, b * s * h
    tf, tb = k.gemm_fwd_bwd(M, V / tp, h)
    logits_elems = M * V / tp
    loss = k.memory_bound(28 * logits_elems, 4)  # fp32 softmax cross-entropy, forward + backward
    embed = k.memory_bound(2 * 2 * X + 2 * 2 * X, 2)
    comm = 0.0
    if tp > 1:
        bw = k.bandwidth(tp, tp)
        comm = k.all_reduce(2 * X, tp, bw) * 2  # vocab-parallel embedding out + logits input grad
    return {"first": embed + comm, "last": tf + tb + loss + comm, "logits_bytes": 4 * logits_elems * 2}


# ---------------------------------------------------------------------------------- a step
def estimate(
    model: ModelSpec,
    gpu: GPUSpec,
    layout: Layout,
    global_batch: int,
    c: Constants = DEFAULTS,
    dtype: str = "bf16",
) -> Estimate:
    """Memory per GPU and step time of `layout` (assumed valid: see search.check_layout)."""
    L = layout
    t, p, dp, b, v = L.tp, L.pp, L.dp, L.micro_batch, L.interleave
    m = global_batch // (dp * b)
    k = _Kernels(gpu, c, dtype)
    lc = layer_cost(model, gpu, c, t, b, L.sequence_parallel, L.recompute)
    hc = _head_cost(model, gpu, c, t, b, L.sequence_parallel)
    layers_dev = model.layers // p

    # ---- memory (first stage; the last stage is checked too and the larger one kept)
    emb_params = model.embedding_params() / t
    layer_params = layers_dev * model.layer_params() / t
    first_params = layer_params + emb_params
    last_params = layer_params + (emb_params if p > 1 else 0.0)
    per_param = _state_bytes_per_param(c, L.zero, dp)
    if p > 1:
        in_flight = layers_dev * min(m, p) * (1 + (p - 1) / (p * v) if v > 1 else 1)
    else:
        in_flight = layers_dev
    act = lc["act_bytes"] * in_flight
    if L.recompute == "full":
        act += lc["full_layer_act_bytes"]  # the layer being recomputed during backward
    first = {
        "model_states_layers": layer_params * per_param,
        "model_states_embedding": emb_params * per_param,
        "activations": act,
        "logits": hc["logits_bytes"] if p == 1 else 0.0,
    }
    # The last stage holds one micro-batch in flight (1F1B) but the fp32 logits.
    last = {
        "model_states_layers": layer_params * per_param,
        "model_states_embedding": (last_params - layer_params) * per_param,
        "activations": lc["act_bytes"] * layers_dev + (lc["full_layer_act_bytes"] if L.recompute == "full" else 0.0),
        "logits": hc["logits_bytes"],
    }
    memory = first if p == 1 or sum(first.values()) >= sum(last.values()) else last
    memory["reserved"] = c.memory_reserved_gib * GIB
    if L.zero == 3:  # gathered parameters of the current and the prefetched layer
        memory["zero3_gather"] = 2 * c.param_bytes * 2 * model.layer_params() / t

    # ---- time: pipeline of m micro-batches
    exposed_tp = lc["tp_comm"] * (1 - c.tp_overlap)
    t_layer = lc["compute"] + exposed_tp
    p2p = 0.0
    if p > 1:
        # Scatter-gather: each TP rank sends its 1/t slice of the (b, s, h) activation.
        span = t * p  # ranks covered by one pipeline (TP innermost, then PP)
        bw = k.bandwidth(2, span)
        p2p = 2 * v * k.p2p(2 * b * s_h(model) / t, bw) * (1 - c.p2p_overlap)
    t_mid = layers_dev * t_layer + p2p
    t_first = t_mid + hc["first"] + (hc["last"] if p == 1 else 0.0)
    t_last = t_mid + (hc["last"] if p > 1 else 0.0)
    t_max = max(t_first, t_last)
    t_avg = (t_first + t_last + (p - 2) * t_mid) / p if p > 1 else t_first
    pipeline = m * t_max + (p - 1) / v * t_avg
    bubble = pipeline - m * t_max

    # ---- data parallel gradient reduction (or FSDP traffic), with its overlap
    dev_params = max(first_params, last_params)
    dp_time = 0.0
    if dp > 1:
        span = t * p * dp
        bw = k.bandwidth(dp, span if span > gpu.gpus_per_node else dp * t * p)
        gbytes = dev_params * c.dp_grad_comm_bytes
        if L.zero == 0:
            comm = k.all_reduce(gbytes, dp, bw)
        elif L.zero in (1, 2):
            comm = k.half_collective(gbytes, dp, bw) + k.half_collective(dev_params * c.param_bytes, dp, bw)
        else:
            comm = 0.0
        window = c.dp_overlap * (lc["bwd"] * layers_dev)
        dp_time = max(0.0, comm - window)
        if L.zero == 3:
            per_mb = 2 * k.half_collective(dev_params * c.param_bytes, dp, bw) + k.half_collective(gbytes, dp, bw)
            dp_time = m * max(0.0, per_mb - c.dp_overlap * t_max)
    # Tied word embedding: first and last stage all-reduce its gradient once per step.
    emb_sync = k.all_reduce(emb_params * c.dp_grad_comm_bytes, 2, k.net) if p > 1 else 0.0

    opt_params = dev_params / dp if L.zero >= 1 else dev_params
    optimizer = k.memory_bound(opt_params * c.optimizer_traffic_bytes, 10)

    step = pipeline + dp_time + emb_sync + optimizer
    time = {
        "compute": m * layers_dev * lc["compute"] + m * (hc["first"] + hc["last"] if p == 1 else max(hc["first"], hc["last"])),
        "tp_comm": m * layers_dev * exposed_tp,
        "pp_bubble": bubble,
        "pp_p2p": m * p2p,
        "dp_comm": dp_time + emb_sync,
        "optimizer": optimizer,
    }
    return Estimate(
        layout=L,
        microbatches=m,
        memory=memory,
        time=time,
        step_time_s=step,
        model_flops=model.model_flops_per_sequence() * global_batch,
        peak_flops=k.peak,
        gpu_memory_bytes=gpu.hbm_bytes,
    )


def s_h(model: ModelSpec) -> int:
    return model.seq * model.hidden


def _state_bytes_per_param(c: Constants, zero: int, dp: int) -> float:
    pb, gb, ob = c.param_bytes, c.grad_bytes, c.optimizer_bytes
    if zero == 0:
        return pb + gb + ob
    if zero == 1:
        return pb + gb + ob / dp
    if zero == 2:
        return pb + (gb + ob) / dp
    return (pb + gb + ob) / dp

"""Timing of single kernels and collectives on one GPU type (no torch).

GEMMs by a soft roofline: ``FLOPs / (rate x wave efficiency) + w x operand bytes / HBM``, where
``rate = dense peak x gemm_fraction (catalog) x stack_efficiency`` and the wave efficiency is
counted, not fitted: the output is cut into 256 x 128 tiles (either orientation, whichever wastes
less), one tile per SM at a time, so a GEMM whose tiles fill 2.1 waves of SMs runs 3 waves
(``tiles / (ceil(tiles / SMs) x SMs)``; tiles that overhang the matrix edge are padded). This is
what makes small hidden sizes, small micro-batches and wide tensor parallelism lose efficiency.
FP8 GEMMs (``float8``) run at the FP8 peak and pay the dynamic-scaling casts of both operands
(read BF16 for the amax, read again and write FP8: 5 bytes per element; 3 for an activation whose
amax a fused producer computed) at HBM bandwidth.
Elementwise traffic (:func:`elementwise_bytes`) is counted per op, fused or unfused.
"""

from __future__ import annotations

import math

from trainperf.hardware.catalog import GPUSpec
from trainperf.planner import parts
from trainperf.planner.constants import Constants

TILE = (256, 128)
NCCL_TUNING = ("NVIDIA/nccl src/graph/tuning.cc @ b6475625 (NCCL 2.19): baseLat and hwLat, the latency NCCL's own "
               "algorithm selection charges per collective and per ring or tree step")
_RING = (("LL", 6.6, 0.6, 1.0, 2.7), ("LL128", 14.0, 1.9, None, 4.0), ("Simple", 8.4, 3.4, 5.7, 14.0))
"""Ring (protocol, base, hop on NVLink, on PCIe (None: not enabled there), on the network), microseconds."""
_TREE = (("LL", 6.8, 0.6, 1.0, 5.0), ("LL128", 14.0, 1.25, None, 8.5), ("Simple", 0.0, 28.0, 28.0, 28.0))
"""Tree (all-reduce across nodes), the same columns."""
_PROTO_BW = {"LL": 0.25, "LL128": 0.92, "Simple": 1.0}
"""Bus bandwidth each protocol reaches, as a fraction of the link's (tuning.cc: LL a quarter, a third on one node
for reduce-scatter / all-gather; LL128 0.92; tree x0.92 and LL / 3.8, LL128 x120/128)."""
_TREE_BW = {"LL": 1 / 3.8, "LL128": 120 / 128, "Simple": 0.92}
NVLS_LATENCY_US = 23.0
"""NVLink SHARP's latency in tuning.cc (hwLat NVLINK NVLS Simple)."""
CAST_EAGER = 5.0
"""HBM bytes per element of a dynamic-scaling FP8 cast done apart (torchao eager, any weight): read the
BF16 tensor for its amax (2), read it again and write FP8 (2 + 1)."""
CAST_FUSED = 3.0
"""The same for an activation whose amax the producing kernel computed as it wrote it (torchao under
``torch.compile``, which torchao names a requirement for FP8 speed; Transformer Engine's fused
norm-cast): only the scaling cast's read and write remain."""


def wave_efficiency(m: float, n: float, batch: float, sms: int) -> float:
    """Fraction of SM-time doing useful tiles for an (m x n) output, ``batch`` times."""
    if sms <= 0:
        return 1.0
    best = 0.0
    for tm, tn in (TILE, TILE[::-1]):
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tiles = tiles_m * tiles_n * max(1.0, batch)
        pad = (m * n) / (tiles_m * tm * tiles_n * tn)
        waves = math.ceil(tiles / sms)
        best = max(best, pad * tiles / (waves * sms))
    return best


class Kernels:
    """Timing of single kernels and collectives on one GPU type. ``nvls``: the stack's NCCL reduces all-reduces
    in an NVSwitch 3 node in the switch (NVLink SHARP) where the part has it."""

    def __init__(self, gpu: GPUSpec, c: Constants, dtype: str = "bf16", nvls: bool = True):
        self.c = c
        self.gpu = gpu
        if dtype == "bf16" and not gpu.bf16_tflops:
            dtype = gpu.half_dtype  # no BF16 tensor cores (V100): mixed precision runs in FP16
        self.dtype = dtype
        self.peak = gpu.peak_tflops(dtype) * 1e12
        # the GEMM ceiling by generation: the published maximum achievable matmul FLOPS (parts.py), else the catalog's
        self.fraction = parts.sustained_fraction(gpu) if c.published_gemm else gpu.gemm_fraction
        self.rate = self.peak * self.fraction * c.stack_efficiency
        fp8 = getattr(gpu, "fp8_tflops", 0.0) or 0.0
        self.rate8 = fp8 * 1e12 * self.fraction * c.stack_efficiency if fp8 else self.rate
        self.vector = gpu.fp32_tflops * 1e12 * self.fraction * c.stack_efficiency
        self.hbm = gpu.hbm_tbps * 1e12 * c.hbm_fraction
        nvlink = gpu.nvlink_gbps / 2 * 1e9 * c.nvlink_fraction
        nic = gpu.internode_gbps * 1e9 * c.internode_fraction
        # what NCCL reaches on the node's fabric and per NIC, as published for the part (parts.py)
        self.nvlink = parts.ring_busbw(gpu, nvlink) if c.published_fabric else nvlink
        self.nic = parts.nic_busbw(gpu, nic) if c.published_fabric else nic
        self.nvls = bool(nvls)
        self.per_node = max(1, gpu.gpus_per_node)
        self.sms = gpu.sms if c.wave_quantization else 0

    def gemm(self, m: float, n: float, k: float, batch: float = 1.0, fp8: bool = False,
             cast_bytes: tuple[float, float] = (CAST_EAGER, CAST_EAGER)) -> float:
        """Y[m,n] = X[m,k] W[k,n] (x batch): soft roofline with wave quantization (module doc). FP8:
        each operand's dynamic-scaling cast at ``cast_bytes`` HBM bytes per element (X's, W's)."""
        flops = 2.0 * m * n * k * batch
        eff = wave_efficiency(m, n, batch, self.sms)
        if fp8:
            nbytes = (m * k + k * n + 2 * m * n) * batch
            cast = (cast_bytes[0] * m * k + cast_bytes[1] * k * n) * batch / self.hbm + 2 * self.c.kernel_overhead_s
            return flops / (self.rate8 * eff) + self.c.gemm_memory_weight * nbytes / self.hbm + cast + self.c.kernel_overhead_s
        nbytes = 2.0 * (m * k + k * n + m * n) * batch
        return flops / (self.rate * eff) + self.c.gemm_memory_weight * nbytes / self.hbm + self.c.kernel_overhead_s

    def gemm_fwd_bwd(self, m: float, n: float, k: float, fp8: bool = False,
                     fused: bool = False, weight_cached: bool = False) -> tuple[float, float]:
        """(forward, backward = data grad + weight grad) for Y[m,n] = X[m,k] W[k,n]. Under FP8 the
        activations (X, and the output gradient in both backward GEMMs) cost :data:`CAST_FUSED` bytes
        per element when the stack fuses their amax into the kernel that produced them
        (``torch.compile`` / Transformer Engine), the weight :data:`CAST_EAGER`, or nothing per micro-batch
        when ``weight_cached`` (its FP8 copy made once per step: :meth:`weight_cast_once`)."""
        act = CAST_FUSED if fused else CAST_EAGER
        w = 0.0 if weight_cached else CAST_EAGER
        fwd = self.gemm(m, n, k, fp8=fp8, cast_bytes=(act, w))
        dgrad = self.gemm(m, k, n, fp8=fp8, cast_bytes=(act, w))
        wgrad = self.gemm(k, n, m, fp8=fp8, cast_bytes=(act, act))
        return fwd, dgrad + wgrad

    def weight_cast_once(self, elements: float) -> float:
        """A cached FP8 weight's cast per step (Transformer Engine, first micro-batch): read the BF16 weight for its
        amax, read it again and write the FP8 copy and its transpose (2 + 2 + 1 + 1 bytes per element)."""
        return self.memory_bound((CAST_EAGER + 1.0) * elements, 2)

    def flash(self, b: float, heads: float, sq: float, skv: float, d: int, causal: float,
              kernel: str = "fa2") -> tuple[float, float]:
        """FlashAttention forward and backward: matmul FLOPs of the executed (causal) blocks at
        attention_efficiency of the GEMM rate, plus the softmax at the vector peak. Backward runs
        5 matmuls to the forward's 2 (it recomputes the scores) and twice the softmax work. An
        ``fa2`` kernel (Ampere's mma.sync) gets the GPU's ``mma_sync_fraction`` of that rate."""
        scores = b * heads * sq * skv * causal
        rate = self.rate * self.c.attention_efficiency
        if kernel == "fa2":
            rate *= getattr(self.gpu, "mma_sync_fraction", 1.0)
        mm = 4.0 * scores * d / rate
        sm = self.c.softmax_ops_per_score * scores / self.vector
        return mm + sm + self.c.kernel_overhead_s, 2.5 * mm + 2 * sm + 2 * self.c.kernel_overhead_s

    def memory_bound(self, nbytes: float, kernels: int = 1) -> float:
        return nbytes / self.hbm + kernels * self.c.kernel_overhead_s

    def bandwidth(self, group: int, stride: int) -> float:
        """Bus bandwidth of a collective among ``group`` ranks placed ``stride`` apart: NVLink when
        they share a node; across nodes, one NIC per member in a node (capped by NVLink)."""
        if group * stride <= self.per_node:
            return self.nvlink
        local = max(1, min(group, self.per_node // max(1, stride)))
        return min(self.nvlink, local * self.nic)

    def all_reduce_group(self, nbytes: float, group: int, stride: int) -> float:
        """All-reduce of ``nbytes`` among ``group`` ranks placed ``stride`` apart: NCCL's ring or tree on the fabric,
        or, within one NVSwitch 3 node, NVLink SHARP at its published bus bandwidth for the group's size."""
        nodes = self.nodes(group, stride)
        nvls = parts.nvls_busbw(self.gpu, group) if self.nvls and nodes == 1 else 0.0
        return self.all_reduce(nbytes, group, self.bandwidth(group, stride), nodes, nvls)

    def decomposed(self, gemm: float, comm: float, tp: int) -> float:
        """Exposed time of tensor-parallel communication ``comm`` overlapped by decomposition with the GEMMs
        beside it (``gemm``): each collective travels in ``tp`` chunks, one beside the GEMM of the chunk before
        (the GEMM is timed whole: a library picks tiles for each slice, which the one-tile wave count would
        overstate); the last chunk of every reduce-scatter (half of the traffic: each all-reduce
        is a reduce-scatter and an all-gather) has no GEMM left to hide behind; what the GEMMs cannot hide
        stays exposed, and the part hidden slows the GEMMs by ``comm_contention``."""
        if comm <= 0 or tp <= 1:
            return comm
        tail = comm / (2 * tp)
        rest = comm - tail
        return tail + self.overlapped(gemm, rest) - gemm

    def nodes(self, group: int, stride: int) -> int:
        """Nodes a group of ``group`` ranks placed ``stride`` apart spans."""
        if group * stride <= self.per_node:
            return 1
        local = max(1, min(group, self.per_node // max(1, stride)))
        return math.ceil(group / local)

    def _latency(self, n: int) -> float:
        return self.c.collective_latency_s * max(1, math.ceil(math.log2(n)))

    def _ring(self, traffic: float, steps: int, inter: int, bw: float, nodes: int, one_node_gather: bool) -> float:
        """NCCL's ring, the fastest protocol for these bytes: its latency (tuning.cc) plus ``traffic`` (bytes each rank
        moves) at the protocol's share of the bus bandwidth."""
        best = math.inf
        nvlink = self.gpu.fabric == "NVLink"
        for name, base, hop_nvl, hop_pci, hop_net in _RING:
            hop = hop_nvl if nvlink else hop_pci
            if hop is None:
                continue
            if nodes > 1:  # each step posts to the network: NCCL's net overhead, 1 us (x3 for Simple)
                hop = max(hop, 3.0 if name == "Simple" else 1.0)
            share = 1 / 3 if name == "LL" and one_node_gather else _PROTO_BW[name]
            best = min(best, (base + (steps - inter) * hop + inter * hop_net) * 1e-6 + traffic / (bw * share))
        return best

    def all_reduce(self, nbytes: float, n: int, bw: float, nodes: int = 1, nvls_bw: float = 0.0) -> float:
        """All-reduce of a buffer of ``nbytes`` among ``n`` ranks on ``nodes`` nodes at bus bandwidth ``bw``: the fastest
        of NCCL's ring, its tree (across nodes) and NVLink SHARP (``nvls_bw``, one node), each with NCCL's own latency
        (:data:`NCCL_TUNING`; ``nccl_tuning`` 0: ``collective_latency_s`` per log2 of the ranks instead)."""
        if n <= 1:
            return 0.0
        traffic = 2 * (n - 1) / n * nbytes
        if not self.c.nccl_tuning:
            return traffic / max(bw, nvls_bw) + 2 * self._latency(n)
        best = self._ring(traffic, 2 * (n - 1), 2 * nodes if nodes > 1 else 0, bw, nodes, False)
        if nodes > 1:
            ppn = n / nodes
            nvlink = self.gpu.fabric == "NVLink"
            for name, base, hop_nvl, hop_pci, hop_net in _TREE:
                hop = hop_nvl if nvlink else hop_pci
                if hop is None:
                    continue
                lat = base + 2 * ((ppn - 1) * hop + math.log2(nodes) * hop_net)
                best = min(best, lat * 1e-6 + 2 * nbytes / (bw * _TREE_BW[name]))
        if nvls_bw and nodes == 1:
            best = min(best, NVLS_LATENCY_US * 1e-6 + traffic / nvls_bw)
        return best

    def half_collective(self, nbytes: float, n: int, bw: float, nodes: int = 1) -> float:
        """Reduce-scatter or all-gather of a buffer of `nbytes` (full size) among ``n`` ranks on ``nodes`` nodes: NCCL's
        ring, ``n - 1`` steps (``nodes - 1`` of them across the network), the fastest protocol."""
        if n <= 1:
            return 0.0
        traffic = (n - 1) / n * nbytes
        if not self.c.nccl_tuning:
            return traffic / bw + self._latency(n)
        return self._ring(traffic, n - 1, nodes - 1, bw, nodes, nodes == 1)

    def gather_group(self, nbytes: float, group: int, stride: int) -> float:
        """Reduce-scatter or all-gather among ``group`` ranks placed ``stride`` apart."""
        return self.half_collective(nbytes, group, self.bandwidth(group, stride), self.nodes(group, stride))

    def p2p(self, nbytes: float, bw: float) -> float:
        return nbytes / bw + self.c.collective_latency_s

    def overlapped(self, compute: float, comm: float) -> float:
        """Two streams side by side: the longer one, plus contention over the overlap."""
        hidden = min(compute, comm)
        return compute + comm - hidden + self.c.comm_contention * hidden


# Bytes per element of the replicated (b x s x h) stream, forward, per layer.
_FUSED_STREAM = 20.0       # two norms (read + write) with the residual adds folded in: 10 passes of 2 bytes
_LAYERNORM = 4.0           # one native/fused kernel: read + write
_RMSNORM_EAGER = 36.0      # x.float(), pow, mean, x * rsqrt, .to(bf16), * weight: each reads and writes
_RESIDUAL_ADD = 6.0        # read two, write one
_DROPOUT = 5.0             # read, write, 1-byte mask


def elementwise_bytes(model, fused: bool, dropout: bool) -> tuple[float, float, int]:
    """Forward HBM bytes per token of one layer's elementwise ops, split (per h-wide stream
    element count factor, per ffn-wide element factor, kernels): the caller multiplies the first by
    tokens x h (divided by TP under sequence parallel) and the second by tokens x ffn / TP."""
    act_fused = 6.0 if model.gated else 4.0          # act(gate) * up in one kernel, or GeLU: read + write
    if fused:
        return _FUSED_STREAM, act_fused, 5  # two norms, two (bias-dropout-)residual adds, the activation
    norm = _LAYERNORM if model.norm == "layernorm" else _RMSNORM_EAGER
    stream = 2 * norm + 2 * _RESIDUAL_ADD + (2 * _DROPOUT if dropout else 0.0)
    kernels = 2 * (1 if model.norm == "layernorm" else 6) + 2 + (2 if dropout else 0)
    act = 10.0 if model.gated else 4.0               # silu (read, write) then mul (read 2, write)
    kernels += 2 if model.gated else 1
    if model.bias:  # bias adds on QKV, O, fc1, fc2 as their own kernels: read + write each output
        stream += 4.0 * (3 + 1 + 1)                  # QKV (3h), O (h), fc2 (h)
        act += 4.0                                   # fc1 (ffn)
        kernels += 4
    return stream, act, kernels


_ROPE_EAGER = 20.0         # q/k to fp32 (read 2, write 4), complex multiply (read 4, write 4), back to bf16 (read 4, write 2)
_ROPE_FUSED = 4.0          # one kernel: read + write


def rope_bytes(model, fused: bool) -> tuple[float, int]:
    """Rotary embeddings on the queries and keys, forward HBM bytes per element of q and k (``tokens x
    (h + kv_dim)``, split over TP by heads) and kernels; the backward applies the same rotation to the
    gradients (the same traffic). Eager PyTorch (torchtitan's complex-number form, Hugging Face's
    rotate-half form alike) makes several passes; a fused kernel (Transformer Engine, Apex,
    ``torch.compile``) one. No cost for learned or no position embeddings."""
    if model.position != "rope":
        return 0.0, 0
    return (_ROPE_FUSED, 2) if fused else (_ROPE_EAGER, 6)


def softmax_bytes(fused: bool, dropout: bool) -> tuple[float, float]:
    """Eager attention's softmax, bytes per score element (forward, backward): Megatron's fused
    scale-mask-softmax reads and writes once; unfused, scale, mask, softmax and dropout each do."""
    mask = 1.0 if dropout else 0.0
    if fused:
        return 4.0 + mask, 6.0 + mask
    fwd = 4.0 * 3 + (4.0 + mask if dropout else 0.0)
    return fwd, 2 * fwd

"""Published per-part figures the planner times kernels and collectives with (no torch).

The hardware catalog (:mod:`trainperf.hardware.catalog`) holds datasheet figures: peaks, memory,
link rates. What a part *reaches* is a measurement of the software on it, and differs by
generation; each figure here is a published one, cited beside it, never fitted:

* **GEMM ceiling** (``mamf``): the Maximum Achievable Matmul FLOPS, the best BF16 ``matmul``
  throughput a brute-force search over shapes finds (Bekman, *Machine Learning Engineering*,
  ``compute/accelerator/README.md``, "Maximum Achievable Matmul FLOPS comparison table", CUDA 12.1):
  A100 SXM 267.9 of 312 TFLOP/s (85.9%), H100 SXM 792.1 of 989 (80.1%). An H100 does not reach the
  fraction of its dense peak an A100 does. The shape of a layer's GEMMs then costs more on top, by
  generation: wave quantization over the part's SMs and the memory roofline, whose ridge point is
  295 FLOP/B on an H100 against 153 on an A100 (:mod:`trainperf.planner.kernels`).
* **NCCL on the node's fabric** (``ring_busbw_gbps``): what NCCL's ring reaches, as nccl-tests'
  bus bandwidth, for reduce-scatter, all-gather and an all-reduce without NVLink SHARP. On NVLink 4 /
  NVSwitch (DGX/HGX H100, H200): 370 GB/s of the 450 GB/s line rate ("with the protocol overhead (~20%)
  NCCL can get an effective NVLink bandwidth of 370GB/s", S. Jeaugey, NCCL, NVIDIA/nccl-tests#212).
* **NVLink SHARP all-reduce** (``nvls_busbw_gbps``): NVSwitch 3 reduces in the switch, and NCCL >= 2.17
  uses it for all-reduce by default: bus bandwidth by GPUs in the group 365-370 GB/s for 2-4, 420,
  440, 460 and 480 GB/s for 5, 6, 7 and 8 (NVIDIA/nccl#1455, 8 x H100 SXM, 2-4 GB messages; "on 8
  GPUs, you should reach a peak busBw of ~480GB/s ... 256M is too small to reach peak bandwidth",
  NVIDIA/nccl-tests#212; "476GB/s looks to be in the expected range for H100", NVIDIA/nccl-tests#290).
  Smaller messages pay the collective's start-up latency (:class:`trainperf.planner.kernels.Kernels`).
* **InfiniBand NDR between nodes** (``nic_busbw_gbps``): "for NDR @ 400Gbps you should see 46-48GB/s
  per NIC" (A. Laddy, NCCL, NVIDIA/nccl-tests#290): 47 GB/s per GPU on a DGX H100 (one NDR NIC per GPU).

A part without an entry (or a ``--catalog`` part whose fabric differs from the entry's, such as a
cluster with fewer NVLink links) keeps the catalog's ``gemm_fraction`` and the constants'
``nvlink_fraction`` / ``internode_fraction`` of its link rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAMF_SOURCE = ("S. Bekman, Machine Learning Engineering (stas00/ml-engineering), compute/accelerator/README.md, "
               "'Maximum Achievable Matmul FLOPS comparison table' (BF16, CUDA 12.1)")
RING_SOURCE = "NVIDIA/nccl-tests#212 (S. Jeaugey, NCCL): ~370 GB/s effective NVLink 4 bandwidth (~20% protocol overhead)"
NVLS_SOURCE = ("NVIDIA/nccl#1455 (8 x H100 SXM, NCCL_ALGO=NVLS, 2-4 GB: busbw 365-370 GB/s for 2-4 GPUs, 420 / 440 / "
               "460 / 480 for 5 / 6 / 7 / 8); NVIDIA/nccl-tests#212 and #290 (peak ~480 GB/s on 8 GPUs)")
NDR_SOURCE = "NVIDIA/nccl-tests#290 (A. Laddy, NCCL): 46-48 GB/s per NDR 400 Gb/s NIC"


@dataclass(frozen=True)
class PartFacts:
    """What one part reaches with its software, each figure published (module doc)."""

    mamf_tflops: float = 0.0
    """Maximum achievable BF16 matmul TFLOP/s (0: not published for this part)."""
    peak_tflops: float = 0.0
    """The dense peak the MAMF was measured against."""
    nvlink_gbps: float = 0.0
    """The catalog's NVLink figure (both directions) the fabric figures below hold for: a part described with
    another (a cluster with fewer links) does not get them."""
    ring_busbw_gbps: float = 0.0
    """NCCL ring bus bandwidth on the node's fabric (0: the constants' nvlink_fraction of one direction)."""
    nvls_busbw_gbps: dict = field(default_factory=dict)
    """All-reduce bus bandwidth with NVLink SHARP by GPUs in the group (empty: no NVLink SHARP)."""
    internode_gbps: float = 0.0
    """The catalog's per-GPU network figure the NIC figure holds for."""
    nic_busbw_gbps: float = 0.0
    """NCCL bus bandwidth one NIC reaches between nodes (0: the constants' internode_fraction of its rate)."""
    sources: tuple[str, ...] = ()

    @property
    def mamf_fraction(self) -> float:
        return self.mamf_tflops / self.peak_tflops if self.mamf_tflops and self.peak_tflops else 0.0


_A100 = PartFacts(mamf_tflops=267.9, peak_tflops=312.0, sources=(MAMF_SOURCE,))
_NVSWITCH3 = dict(nvlink_gbps=900.0, ring_busbw_gbps=370.0,
                  nvls_busbw_gbps={2: 370.0, 3: 370.0, 4: 370.0, 5: 420.0, 6: 440.0, 7: 460.0, 8: 480.0},
                  internode_gbps=50.0, nic_busbw_gbps=47.0)
FACTS: dict[str, PartFacts] = {
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA H100 80GB HBM3": PartFacts(mamf_tflops=792.1, peak_tflops=989.0, **_NVSWITCH3,
                                       sources=(MAMF_SOURCE, RING_SOURCE, NVLS_SOURCE, NDR_SOURCE)),
    # HGX H200: the H100's die and clocks with HBM3e, the same NVLink 4 / NVSwitch 3 fabric and NDR NICs; its
    # GEMM ceiling is not in the MAMF table (the catalog's gemm_fraction stays)
    "NVIDIA H200": PartFacts(**_NVSWITCH3, sources=(RING_SOURCE, NVLS_SOURCE, NDR_SOURCE)),
}
"""Keyed by the catalog's ``name`` (the NVML name), so a development-set variant of a part (another key, the same
name) finds them; the fabric figures hold only where its link rates are the entry's."""


def facts(gpu) -> PartFacts:
    return FACTS.get(getattr(gpu, "name", ""), PartFacts())


def sustained_fraction(gpu) -> float:
    """The fraction of the dense peak a large, well-shaped BF16 GEMM sustains on ``gpu``: the published MAMF where
    there is one, else the catalog's ``gemm_fraction``."""
    return facts(gpu).mamf_fraction or gpu.gemm_fraction


def ring_busbw(gpu, default: float) -> float:
    """Bytes/s NCCL's ring reaches on ``gpu``'s intra-node fabric (``default`` where nothing is published)."""
    f = facts(gpu)
    return f.ring_busbw_gbps * 1e9 if f.ring_busbw_gbps and f.nvlink_gbps == gpu.nvlink_gbps else default


def nvls_busbw(gpu, n: int) -> float:
    """All-reduce bus bandwidth (bytes/s) with NVLink SHARP for ``n`` GPUs of one node (0: none)."""
    f = facts(gpu)
    if not f.nvls_busbw_gbps or f.nvlink_gbps != gpu.nvlink_gbps or n < 2:
        return 0.0
    return f.nvls_busbw_gbps.get(min(n, max(f.nvls_busbw_gbps)), 0.0) * 1e9


def nic_busbw(gpu, default: float) -> float:
    """Bytes/s one NIC reaches between nodes (``default`` where nothing is published)."""
    f = facts(gpu)
    return f.nic_busbw_gbps * 1e9 if f.nic_busbw_gbps and f.internode_gbps == gpu.internode_gbps else default

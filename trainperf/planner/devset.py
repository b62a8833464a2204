"""The planner's development set: published runs it is fitted and cross-validated on (no torch).

Sources (the TSV tables shipped in ``trainperf/planner/devdata/``, with their citations in its README;
``--data DIR`` or ``$TRAINPERF_PLANNER_DEV`` reads another copy; Table 5 from REFERENCE.md is built in):

* ``korthikanti``: Korthikanti et al. 2022 Table 5, Megatron-LM on A100 80GB, TP/PP, eager
  attention with dropout, full recompute / sequence parallel + selective recompute (8 rows).
* ``mpt-a100-80gb`` / ``mpt-a100-40gb``: MosaicML llm-foundry throughput tables, FSDP FULL_SHARD,
  FlashAttention, full activation checkpointing or none.
* ``llama3-405b``: Llama 3 405B (Dubey et al. 2024, Table 4), H100 80GB, TP/CP/PP/DP. Approximate
  (read from secondary copies).
* ``bloom``, ``opt-175b``, ``llama1``, ``llama2``, ``torchtitan``, ``olmo``: built in, from
  :mod:`trainperf.planner.devset_sources` (each table with its citation and how its figure became a
  step time).

Each row carries the training stack it ran on (:mod:`trainperf.planner.stack`): the mechanisms
differ between sources (Megatron-DeepSpeed reduces gradients after the backward, torchtitan runs
eager elementwise ops unless compiled, FP8 linears...), and the model times each.

Every published figure becomes a step time in seconds: as given (Korthikanti, MPT's global batch
tokens / tokens per s) or model FLOPs per step / (GPUs x published TFLOP/s per GPU) with the
planner's model-FLOPs convention (Llama 3). Parts of a layout a source does not state (Llama 3's
interleaving and recompute) are searched: the prediction is the fastest variant that fits.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, replace
from functools import lru_cache

from trainperf.analytic.spec import TransformerSpec
from trainperf.errors import UserError
from trainperf.hardware.catalog import GPUSpec, get_gpu
from trainperf.planner import devset_sources as src
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import Estimate, Layout, estimate
from trainperf.planner.stack import DEFAULT as DEFAULT_STACK
from trainperf.planner.stack import Stack, get_stack

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "devdata")
"""The development tables shipped with the package (package data: pyproject.toml's
``[tool.setuptools.package-data]``); ``devdata/README.md`` cites each one."""
TABLES = (("mpt_a100_80gb.tsv", "mpt-a100-80gb"), ("mpt_a100_40gb.tsv", "mpt-a100-40gb"), ("llama3_405b.tsv", "llama3-405b"))

# name, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, interleave,
# full-recompute s/iter, SP+selective s/iter  (REFERENCE.md, Korthikanti et al. 2022 Table 5)
KORTHIKANTI = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]
MPT_SHAPES = {  # d_model, layers, heads (devdata/README.md)
    "125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16),
    "3b": (2560, 32, 20), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 56),
    "70b": (8192, 80, 64),
}
MPT_VOCAB = 50368
LLAMA3_405B = dict(hidden=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248, gated=True, vocab=128256,
                   tied=False, position="rope", norm="rmsnorm", attention="flash", bias=False)
SOURCES = ("korthikanti", "mpt-a100-80gb", "mpt-a100-40gb", "llama3-405b", "bloom", "opt-175b", "llama1", "llama2",
           "torchtitan", "olmo")
CITATIONS = {
    "korthikanti": "Korthikanti et al. 2022 (arXiv 2205.05198) Table 5, as in REFERENCE.md",
    "mpt-a100-80gb": "mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB table (devdata/mpt_a100_80gb.tsv)",
    "mpt-a100-40gb": "mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB table (devdata/mpt_a100_40gb.tsv)",
    "llama3-405b": "Dubey et al. 2024 (arXiv 2407.21783) Table 4, read from secondary copies (devdata/llama3_405b.tsv)",
    "bloom": src.BLOOM_CITE, "opt-175b": src.OPT_CITE, "llama1": src.LLAMA1_CITE, "llama2": src.LLAMA2_CITE,
    "torchtitan": src.TORCHTITAN_CITE, "olmo": src.OLMO_CITE,
}
# Jean Zay's A100 80GB nodes (BLOOM paper sect. 3.4.1 / model card: "8 GPUs per node using NVLink 4
# inter-gpu connects, 4 OmniPath links"): 4 NVLink3 links per GPU (4 x 50 GB/s both directions, a third
# of a DGX A100's 12) and 4 x 100 Gb/s Omni-Path per 8 GPUs (6.25 GB/s per GPU). Approximate.
JEAN_ZAY = replace(get_gpu("a100-80gb"), key="a100-80gb-jean-zay", internode_gbps=6.25, nvlink_gbps=200,
                   note="Jean Zay gpu_p5: 4 NVLink links per GPU, 4 Omni-Path 100 Gb/s links per 8-GPU node")
# torchtitan's Grand Teton hosts: H100 96GB HBM2e, 2.4 TB/s, 500 W. Its footnote: "the actual peak TFLOPs
# number is between SXM and NVL": the midpoint of H100 SXM (989 BF16 / 1979 FP8) and H100 NVL (835 / 1670)
# is used. Approximate.
GRAND_TETON = replace(get_gpu("h100-sxm"), key="h100-96gb-hbm2e", hbm_gib=94.0, hbm_tbps=2.4, bf16_tflops=912.0,
                      fp16_tflops=912.0, fp8_tflops=1824.0,
                      note="Grand Teton H100 96GB HBM2e at 500 W (peak between SXM and NVL), 400 Gb/s RDMA per GPU")
MEGATRON_DS = Stack("megatron-deepspeed", dp_reduce="after", fused=True, attention="eager",
                    distributed_optimizer=True, grad_reduce_op="all-reduce", fsdp=False, grad_bytes=2.0)
"""BLOOM's Megatron-DeepSpeed (bf16): DeepSpeed's pipeline engine reduces after the backward; its BF16_Optimizer
keeps bf16 gradients, shards the fp32 master copy with the optimizer states (ZeRO-1 equivalent), and all-reduces
the whole FP32 gradient buffer (``PipelineEngine._bf16_reduce_grads`` on ``get_grads_for_reduction``), then
all-gathers the bf16 parameters after each rank's step."""
MEGATRON_DS_FP16 = replace(MEGATRON_DS, name="megatron-deepspeed-fp16", grad_reduce_op="reduce-scatter")
"""BigScience's 2021 V100 runs: fp16, so DeepSpeed's ZeRO stage-1 optimizer instead of the BF16_Optimizer; it
reduces each rank's gradient partition (``reduce_scatter``, on by default) rather than all-reducing the whole."""
# Jean Zay's V100 SXM2 nodes (BigScience's 2021 runs): 4 GPUs per node, two NVLink2 links between each pair
# (2 x 25 GB/s each way = 100 GB/s both directions: what a 2- or 4-GPU ring gets), Omni-Path 100 Gb/s taken as
# 2 links per node (6.25 GB/s per GPU). Approximate.
JEAN_ZAY_V100 = {size: replace(get_gpu(f"v100-{size}"), key=f"v100-{size}-jean-zay", nvlink_gbps=100, internode_gbps=6.25,
                               gpus_per_node=4, note="Jean Zay V100 SXM2: 4 GPUs per node, 2 NVLink2 links per pair, "
                               "Omni-Path 100 Gb/s (2 links per node assumed)")
                 for size in ("16gb", "32gb")}
META_XFORMERS = Stack("meta-xformers", dp_reduce="overlap", fused=False, attention="flash", async_tp=True,
                      tp_overlap="concurrent")
"""LLaMA's training code: eager PyTorch layers with a hand-written backward and xformers' attention; the
tensor-parallel all-reduces overlapped with the activations' computation (LLaMA sect. 2.4: "we also overlap
the computation of activations and the communication between GPUs over the network (due to all_reduce
operations) as much as possible"), which the model's ``async_tp`` mechanism is, with the collectives beside
independent work (``tp_overlap="concurrent"``), not decomposed."""
METASEQ = Stack("metaseq", dp_reduce="overlap", fused=True, attention="eager", distributed_optimizer=False, fsdp=True)


@dataclass(frozen=True)
class Row:
    source: str
    label: str
    model: TransformerSpec
    gpu: str
    gpus: int
    global_batch: int
    published_s: float
    fixed: tuple  # (tp, pp, dp, cp, micro_batch, interleave, recompute, sp, zero); None: not published
    approximate: bool = False
    stack: Stack = DEFAULT_STACK
    recompute_layers: int = 0
    gpu_spec: GPUSpec | None = None
    note: str = ""

    @property
    def citation(self) -> str:
        return CITATIONS.get(self.source, "")

    def spec(self) -> GPUSpec:
        return self.gpu_spec or get_gpu(self.gpu)


def _korthikanti_rows() -> list[Row]:
    rows = []
    for name, a, h, l, t, p, n, B, b, v, full_s, sel_s in KORTHIKANTI:
        model = TransformerSpec(hidden=h, layers=l, heads=a, seq=2048, vocab=51200, bias=True, tied=True,
                                position="learned", attention="eager", name=f"gpt-{name}")
        dp = n // (t * p)
        rows.append(Row("korthikanti", f"{name} full", model, "a100-80gb", n, B, full_s,
                        (t, p, dp, 1, b, v, "full", False, 0)))
        rows.append(Row("korthikanti", f"{name} sp+sel", model, "a100-80gb", n, B, sel_s,
                        (t, p, dp, 1, b, v, "selective", True, 0)))
    return rows


MPT_COLUMNS = ("model", "seq", "gpus", "gpu", "micro_batch", "global_batch", "act_ckpt", "step_time_s")
LLAMA_COLUMNS = ("gpus", "tp", "cp", "pp", "dp", "seq", "global_batch_seqs", "tflops_per_gpu")


def _read_tsv(path: str, columns: tuple[str, ...]) -> list[dict]:
    """The rows of a tab-separated table (``#`` lines are comments), read line by line; a missing column or an
    unreadable file is an error naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            rows = list(csv.DictReader((ln for ln in f if ln.strip() and not ln.startswith("#")), delimiter="\t"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"development data {path!r} cannot be read: {exc}") from None
    have = set(rows[0]) if rows else set()
    lacking = [c for c in columns if c not in have]
    if lacking:
        raise UserError(f"development data {path!r} has no {', '.join(lacking)} column(s)"
                        + ("" if rows else " (no data rows)") + f"; compare it with the copy in {DATA_DIR}")
    return rows


def _mpt_rows(path: str, source: str) -> list[Row]:
    rows = []
    for r in _read_tsv(path, MPT_COLUMNS):
        h, l, a = MPT_SHAPES[r["model"]]
        s = int(r["seq"])
        model = TransformerSpec(hidden=h, layers=l, heads=a, seq=s, vocab=MPT_VOCAB, tied=True, position="learned",
                                bias=False, attention="flash", name=f"mpt-{r['model']}")
        gpus, mb = int(r["gpus"]), int(r["micro_batch"])
        rc = "full" if r["act_ckpt"] == "True" else "none"
        gpu = r["gpu"].replace("_", "-")
        label = f"{r['model']} s{s} {gpus}g mb{mb}{' ckpt' if rc == 'full' else ''}"
        rows.append(Row(source, label, model, gpu, gpus, int(r["global_batch"]), float(r["step_time_s"]),
                        (1, 1, gpus, 1, mb, 1, rc, False, 3)))
    return rows


def _llama_rows(path: str) -> list[Row]:
    rows = []
    for r in _read_tsv(path, LLAMA_COLUMNS):
        s = int(r["seq"])
        model = TransformerSpec(seq=s, name="llama3-405b", **LLAMA3_405B)
        gpus, tp, cp, pp, dp = (int(r[k]) for k in ("gpus", "tp", "cp", "pp", "dp"))
        B = int(r["global_batch_seqs"])
        flops = model.model_flops_per_token() * s * B
        published = flops / (gpus * float(r["tflops_per_gpu"]) * 1e12)
        label = f"{gpus}g TP{tp} CP{cp} PP{pp} DP{dp} s{s}"
        rows.append(Row("llama3-405b", label, model, "h100-sxm", gpus, B, published,
                        (tp, pp, dp, cp, 1, None, None, True, 1), approximate=True))
    return rows


def _bloom_rows() -> list[Row]:
    rows = []
    for label, l, h, a, dp, tp, pp, mb, B, sec, line in src.BLOOM:
        model = TransformerSpec(hidden=h, layers=l, heads=a, seq=2048, vocab=250880, bias=True, tied=True,
                                position="none", attention="eager", name=f"bloom-{label.split()[0]}")
        rows.append(Row("bloom", label, model, JEAN_ZAY.key, dp * tp * pp, B, sec, (tp, pp, dp, 1, mb, 1, "full", False, 1),
                        stack=MEGATRON_DS, gpu_spec=JEAN_ZAY, note=f"{line}; {src.BLOOM_NOTE}"))
    return rows


def _opt_rows() -> list[Row]:
    model = TransformerSpec(hidden=12288, layers=96, heads=96, seq=2048, vocab=50272, bias=True, tied=True,
                            position="learned", attention="eager", name="opt-175b")
    B, gpus = 992, 992
    s, l, h, V = model.seq, model.layers, model.hidden, model.vocab
    # Megatron-2's FLOPs per iteration (Narayanan et al. 2021 eq. 3), which count the recomputed forward
    # of full activation checkpointing: the convention of Meta's 2022 FSDP/Megatron runs (src.OPT_NOTE)
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    published = flops / (gpus * 147e12)
    return [Row("opt-175b", "OPT-175B 992g TP8 FSDP124", model, "a100-80gb", gpus, B, published,
                (8, 1, 124, 1, 8, 1, "full", False, 3), approximate=True, stack=METASEQ, note=src.OPT_NOTE)]


def _meta_llama_rows(table, source: str, citation_note: str) -> list[Row]:
    rows = []
    gpus = 2048
    for label, h, l, a, kv, f, s, tokens, gpu_hours in table:
        model = TransformerSpec(hidden=h, layers=l, heads=a, kv_heads=kv, ffn_hidden=f, gated=True, seq=s, vocab=32000,
                                tied=False, position="rope", norm="rmsnorm", attention="flash", bias=False, name=label)
        tps = tokens / (gpu_hours * 3600.0)
        B = 2**22 // s
        rows.append(Row(source, f"{label} {tps:.0f} tok/s/GPU", model, "a100-80gb", gpus, B, B * s / (tps * gpus),
                        (None, 1, None, 1, None, 1, "selective", True, None), approximate=True, stack=META_XFORMERS,
                        note=citation_note))
    return rows


def _torchtitan_rows() -> list[Row]:
    rows = []
    for (label, size, s, gpus, fsdp, tp, pp, cp, local, rc, compiled, fp8, async_tp, v, tps, line) in src.TORCHTITAN:
        model = TransformerSpec(seq=s, vocab=128256, gated=True, tied=False, position="rope", norm="rmsnorm",
                                attention="flash", bias=False, name=f"llama3.1-{size}", **src.LLAMA31[size])
        B = fsdp * local
        # the --stack torchtitan preset itself, with the run's compile / Float8 / AsyncTP: what these rows
        # validate is what a user planning with the preset gets
        stack = get_stack("torchtitan", fused=compiled, float8=fp8, async_tp=async_tp)
        layers_stage = model.layers // pp if model.layers % pp == 0 else -(-model.layers // pp)
        recompute, k = ("partial", layers_stage // 2) if rc == "selective" else ("full", 0)
        rows.append(Row("torchtitan", label, model, GRAND_TETON.key, gpus, B, B * s / (tps * gpus),
                        (tp, pp, fsdp, cp, local // pp if pp > 1 else local, v, recompute, tp > 1, 3), approximate=True,
                        stack=stack, recompute_layers=k, gpu_spec=GRAND_TETON,
                        note=f"benchmarks/llama3_h100_202412_torchtitan.md:{line}; {src.TORCHTITAN_NOTE}"))
    return rows


def _olmo_rows() -> list[Row]:
    rows = []
    gpus, s = 8, 4096
    for label, name, mb, B, fp8, tps, line in src.OLMO:
        h, l, a, kv, f = src.OLMO_SHAPES[name]
        model = TransformerSpec(hidden=h, layers=l, heads=a, kv_heads=kv, ffn_hidden=f, gated=True, seq=s,
                                vocab=100352, tied=False, position="rope", norm="rmsnorm", attention="flash",
                                bias=False, name=name.lower())
        # torch 2.6 (OLMo-core's Makefile @ 7e58d128), SDPA (use_flash defaults to False): PyTorch's
        # FlashAttention-2 code on H100, cuDNN attention being opt-in since pytorch#138522 (Oct 2024)
        stack = Stack("olmo-core", dp_reduce="overlap", fused=True, attention="flash", attention_kernel="fa2",
                      distributed_optimizer=False, fsdp=True, float8=fp8, fsdp_reduce_bytes=4.0, fsdp_copy_bytes=16.0)
        rows.append(Row("olmo", label, model, "h100-sxm", gpus, B, B * s / (tps * gpus),
                        (1, 1, gpus, 1, mb, 1, "none", False, 3), approximate=True, stack=stack,
                        note=f"README.md:{line}; {src.OLMO_NOTE}"))
    return rows


GENERATION_CHECKS = ("bigscience-v100",)
"""Held-out checks of GPU generations no development row is on: predicted with the shipped constants, never
fitted on, outside leave-one-source-out (``trainperf.planner.loso`` reports them apart)."""
CITATIONS["bigscience-v100"] = src.BIGSCIENCE_V100_CITE


def _padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (``--make-vocab-size-divisible-by``)."""
    m = multiple * tp
    return -(-vocab // m) * m


def generation_rows() -> list[Row]:
    """Published runs on V100 (BigScience's 2021 Megatron-DeepSpeed runs on Jean Zay): the held-out check of
    a generation the development set does not hold. Same stack as BLOOM's (fp16 instead of bf16: a V100
    has no BF16 tensor cores, which the kernels pick from the part)."""
    rows = []
    for label, l, h, a, gpu, tp, pp, dp, mb, B, sec, rc, approx, line in src.BIGSCIENCE_V100:
        model = TransformerSpec(hidden=h, layers=l, heads=a, seq=2048, vocab=_padded_vocab(50257, tp), bias=True,
                                tied=True, position="learned", attention="eager", name=f"bigscience-{label.split()[0]}")
        spec = JEAN_ZAY_V100[gpu.removeprefix("v100-")]
        rows.append(Row("bigscience-v100", label, model, spec.key, tp * pp * dp, B, float(sec),
                        (tp, pp, dp, 1, mb, 1, rc, False, 1), approximate=approx, stack=MEGATRON_DS_FP16, gpu_spec=spec,
                        note=f"{line}; {src.BIGSCIENCE_V100_NOTE}"))
    return rows


def data_dir(given: str | None = None) -> str:
    """Where the development tables are read: ``given`` (``--data``), else ``$TRAINPERF_PLANNER_DEV``, else the
    tables shipped in the package (:data:`DATA_DIR`)."""
    return given or os.environ.get("TRAINPERF_PLANNER_DEV") or DATA_DIR


def load(data_dir_: str | None = None) -> list[Row]:
    """Every development row: Table 5 and the tables of :mod:`devset_sources` built in, the TSV tables read from
    :func:`data_dir`. A missing table is an error (it would silently drop a source from the fit and its
    cross-validation), naming the file and where it was looked for."""
    d = data_dir(data_dir_)
    if not os.path.isdir(d):
        raise UserError(f"development data directory {d!r} does not exist; drop --data / $TRAINPERF_PLANNER_DEV to use "
                        f"the tables shipped with trainperf ({DATA_DIR})")
    missing = [f for f, _ in TABLES if not os.path.isfile(os.path.join(d, f))]
    if missing:
        raise UserError(f"development data directory {d!r} lacks {', '.join(missing)} (it needs "
                        f"{', '.join(f for f, _ in TABLES)}); point --data / $TRAINPERF_PLANNER_DEV at a copy of "
                        f"{DATA_DIR}, or drop it to use that one")
    rows = _korthikanti_rows()
    for fname, source in TABLES[:2]:
        rows += _mpt_rows(os.path.join(d, fname), source)
    rows += _llama_rows(os.path.join(d, TABLES[2][0]))
    rows += _bloom_rows() + _opt_rows()
    rows += _meta_llama_rows(src.LLAMA1, "llama1", src.LLAMA_NOTE)
    rows += _meta_llama_rows(src.LLAMA2, "llama2", src.LLAMA_NOTE)
    rows += _torchtitan_rows() + _olmo_rows()
    return rows


@lru_cache(maxsize=256)
def _open_layout(row: Row) -> tuple:
    """The parts a source does not publish (degrees, micro-batch, ZeRO), chosen once by the
    planner's own search under the shipped constants and the row's stack, then held fixed."""
    from trainperf.planner.search import Fixed, search

    tp, pp, dp, cp, mb, v, rc, sp, zero = row.fixed
    fx = Fixed(tp=tp, pp=pp, dp=dp, micro_batch=mb, interleave=v, recompute=rc, sequence_parallel=sp, zero=zero, cp=cp)
    best = search(row.model, row.spec(), row.gpus, row.global_batch, fx, DEFAULTS, explain_failure=False,
                  stack=row.stack).best.layout
    return (best.tp, best.pp, best.dp, best.cp, best.micro_batch, best.interleave, best.recompute,
            best.sequence_parallel, best.zero)


def predict(row: Row, c: Constants = DEFAULTS) -> Estimate | None:
    """The model's estimate for a row: the fixed layout, or the fastest variant that fits when the
    source leaves the interleave or the recompute open; None when nothing fits."""
    fixed = row.fixed
    if any(x is None for i, x in enumerate(fixed) if i not in (5, 6)):
        fixed = _open_layout(row)
    tp, pp, dp, cp, mb, v, rc, sp, zero = fixed
    gpu = row.spec()
    layers_stage = -(-row.model.layers // pp)
    m = row.global_batch // (dp * mb)
    vs = [v] if v else [x for x in range(1, 9) if layers_stage % x == 0 and (x == 1 or m % pp == 0)]
    # open recompute: none, selective, then the fewest whole layers per stage that fit, then all
    if rc:
        rcs = [(rc, row.recompute_layers if rc == "partial" else 0)]
    else:
        rcs = [("none", 0), ("selective", 0)] + [("partial", k) for k in range(1, layers_stage)] + [("full", 0)]
    best = None
    for vv in vs:
        for r, k in rcs:
            layout = Layout(tp, pp, dp, mb, vv, r, bool(sp), zero, cp, recompute_layers=k)
            est = estimate(row.model, gpu, layout, row.global_batch, c, stack=row.stack)
            if not est.fits:
                continue
            if best is None or est.step_time_s < best.step_time_s:
                best = est
            if not rc:
                break  # the least recompute that fits is the fastest for this interleave
    return best


def errors(rows: list[Row], c: Constants = DEFAULTS) -> list[float | None]:
    """Signed relative error of the predicted step time per row (None: predicted not to fit)."""
    out = []
    for row in rows:
        est = predict(row, c)
        out.append(None if est is None else est.step_time_s / row.published_s - 1)
    return out

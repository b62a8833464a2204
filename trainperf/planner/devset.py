"""The planner's development set: published runs it is fitted and cross-validated on (no torch).

Sources (``/work/shared/planner-dev`` style TSVs, path given by ``--data`` or
``TRAINPERF_PLANNER_DEV``; Table 5 from REFERENCE.md is built in):

* ``korthikanti``: Korthikanti et al. 2022 Table 5, Megatron-LM on A100 80GB, TP/PP, eager
  attention with dropout, full recompute / sequence parallel + selective recompute (8 rows).
* ``mpt-a100-80gb`` / ``mpt-a100-40gb``: MosaicML llm-foundry throughput tables, FSDP FULL_SHARD,
  FlashAttention, full activation checkpointing or none.
* ``llama3-405b``: Llama 3 405B (Dubey et al. 2024, Table 4), H100 80GB, TP/CP/PP/DP. Approximate
  (read from secondary copies).

Every published figure becomes a step time in seconds: as given (Korthikanti, MPT's global batch
tokens / tokens per s) or model FLOPs per step / (GPUs x published TFLOP/s per GPU) with the
planner's model-FLOPs convention (Llama 3). Parts of a layout a source does not state (Llama 3's
interleaving and recompute) are searched: the prediction is the fastest variant that fits.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

from trainperf.analytic.spec import TransformerSpec
from trainperf.errors import UserError
from trainperf.hardware.catalog import get_gpu
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import Estimate, Layout, estimate

DEFAULT_DIR = "/work/shared/planner-dev"

# name, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, interleave,
# full-recompute s/iter, SP+selective s/iter  (REFERENCE.md, Korthikanti et al. 2022 Table 5)
KORTHIKANTI = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]
MPT_SHAPES = {  # d_model, layers, heads (planner-dev README)
    "125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16),
    "3b": (2560, 32, 20), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 48, 56),
    "70b": (8192, 80, 64),
}
MPT_VOCAB = 50368
LLAMA3_405B = dict(hidden=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248, gated=True, vocab=128256,
                   tied=False, position="rope", norm="rmsnorm", attention="flash", bias=False)
SOURCES = ("korthikanti", "mpt-a100-80gb", "mpt-a100-40gb", "llama3-405b")


@dataclass(frozen=True)
class Row:
    source: str
    label: str
    model: TransformerSpec
    gpu: str
    gpus: int
    global_batch: int
    published_s: float
    fixed: tuple  # (tp, pp, dp, cp, micro_batch, interleave|None, recompute|None, sp|None, zero)
    approximate: bool = False


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


def _read_tsv(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f if not ln.startswith("#") and ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"development data {path!r} cannot be read: {exc}") from None
    return list(csv.DictReader(lines, delimiter="\t"))


def _mpt_rows(path: str, source: str) -> list[Row]:
    rows = []
    for r in _read_tsv(path):
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
    for r in _read_tsv(path):
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


def load(data_dir: str | None = None) -> list[Row]:
    """Every development row (Table 5 built in, the rest from ``data_dir``)."""
    d = data_dir or os.environ.get("TRAINPERF_PLANNER_DEV") or DEFAULT_DIR
    rows = _korthikanti_rows()
    files = (("mpt_a100_80gb.tsv", "mpt-a100-80gb"), ("mpt_a100_40gb.tsv", "mpt-a100-40gb"))
    for fname, source in files:
        path = os.path.join(d, fname)
        if os.path.isfile(path):
            rows += _mpt_rows(path, source)
    path = os.path.join(d, "llama3_405b.tsv")
    if os.path.isfile(path):
        rows += _llama_rows(path)
    return rows


def predict(row: Row, c: Constants = DEFAULTS) -> Estimate | None:
    """The model's estimate for a row: the fixed layout, or the fastest variant that fits when the
    source leaves a part open; None when nothing fits."""
    tp, pp, dp, cp, mb, v, rc, sp, zero = row.fixed
    gpu = get_gpu(row.gpu)
    layers_stage = -(-row.model.layers // pp)
    m = row.global_batch // (dp * mb)
    vs = [v] if v else [x for x in range(1, 9) if layers_stage % x == 0 and (x == 1 or m % pp == 0)]
    # open recompute: none, selective, then the fewest fully recomputed layers per stage that fit
    rcs = [(rc, 0)] if rc else [("none", 0), ("selective", 0)] + [("full", k) for k in range(1, layers_stage + 1)]
    best = None
    for vv in vs:
        for r, k in rcs:
            layout = Layout(tp, pp, dp, mb, vv, r, bool(sp), zero, cp, recompute_layers=k)
            est = estimate(row.model, gpu, layout, row.global_batch, c)
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

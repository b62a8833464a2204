"""Validation of the planner against published runs: ``python -m trainperf.planner.validate``.

Development set (REFERENCE.md): Korthikanti et al. 2022, Table 5 iteration times (full
recompute; sequence parallel + selective recompute) and Figure 1 per-GPU memory, A100 80 GB.

Held-out sanity check (not in REFERENCE.md, never used to choose constants): Narayanan et al.
2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"),
Table 1: achieved TFLOP/s per A100 80 GB GPU with full recompute, counted as hardware FLOPs
96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). The paper gives degrees and batch but not the
micro-batch or interleaving of each row; those are searched (the planner's best) and also shown
at micro-batch 1 without interleaving. Megatron 2021 reduced data-parallel gradients after the
pipeline flush, so that check runs with dp_overlap=0.
"""

from __future__ import annotations

from trainperf.hardware.catalog import get_gpu
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import GIB, Layout, estimate
from trainperf.planner.model import ModelSpec

# name, heads, hidden, layers, tp, pp, gpus, batch, micro-batch, interleave,
# full-recompute s/iter, SP+selective s/iter, Fig.1 params+optimizer GiB, act none GiB, act SP+sel GiB
KORTHIKANTI = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10, 45.56, 59.25, 9.56),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75, 45.56, 66.84, 12.35),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83, 31.64, 114.02, 23.08),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49, 32.96, 131.25, 26.56),
]
KORTHIKANTI_MFU = (0.415, 0.514, 0.560, 0.563)

# params (B), heads, hidden, layers, tp, pp, gpus, batch, published TFLOP/s per GPU
NARAYANAN_TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def korthikanti_estimate(row, recompute: str, sp: bool, c: Constants = DEFAULTS):
    name, a, h, l, t, p, n, B, b, v = row[:10]
    model = ModelSpec(hidden=h, layers=l, heads=a, seq=2048, vocab=51200, name=name)
    return estimate(model, get_gpu("a100-80gb"), Layout(t, p, n // (t * p), b, v, recompute, sp), B, c)


def devset_columns(c: Constants = DEFAULTS) -> dict[str, list[tuple[str, float, float]]]:
    """Per column: (row, predicted, published)."""
    cols: dict[str, list] = {k: [] for k in ("time_full_recompute", "time_sp_selective", "memory_params_optimizer",
                                             "memory_act_none", "memory_act_sp_selective")}
    for r in KORTHIKANTI:
        full, sel, none = (korthikanti_estimate(r, "full", False, c), korthikanti_estimate(r, "selective", True, c),
                           korthikanti_estimate(r, "none", False, c))
        cols["time_full_recompute"].append((r[0], full.step_time_s, r[10]))
        cols["time_sp_selective"].append((r[0], sel.step_time_s, r[11]))
        cols["memory_params_optimizer"].append((r[0], sel.memory["model_states_layers"] / GIB, r[12]))
        cols["memory_act_none"].append((r[0], none.memory["activations"] / GIB, r[13]))
        cols["memory_act_sp_selective"].append((r[0], sel.memory["activations"] / GIB, r[14]))
    return cols


def mape(rows) -> float:
    return 100 * sum(abs(pred - ref) / ref for _, pred, ref in rows) / len(rows)


def narayanan_check(c: Constants = DEFAULTS) -> list[dict]:
    from dataclasses import replace

    from trainperf.errors import UserError
    from trainperf.planner.search import Fixed, search

    c = replace(c, dp_overlap=0.0)
    g = get_gpu("a100-80gb")
    out = []
    for P, a, h, l, t, p, n, B, ref in NARAYANAN_TABLE1:
        model = ModelSpec(hidden=h, layers=l, heads=a, seq=2048, vocab=51200, name=f"{P}B")
        ratio = model.hardware_flops_per_sequence("full") / model.model_flops_per_sequence()
        row = {"model": f"{P}B", "published": ref}
        for label, fx in (("mb1", Fixed(tp=t, pp=p, recompute="full", sequence_parallel=False, zero=0,
                                        micro_batch=1, interleave=1)),
                          ("searched", Fixed(tp=t, pp=p, recompute="full", sequence_parallel=False, zero=0))):
            try:
                best = search(model, g, n, B, fx, c, explain_failure=False).best
                row[label] = best.tflops_per_gpu * ratio
                row[label + "_layout"] = best.layout.short()
            except UserError:
                row[label] = None
        out.append(row)
    return out


def main() -> None:
    cols = devset_columns()
    print("Development set (Korthikanti et al. 2022, A100 80 GB): MAPE per column")
    for k, rows in cols.items():
        detail = ", ".join(f"{n} {pred:.2f} vs {ref:.2f}" for n, pred, ref in rows)
        print(f"  {k:26s} {mape(rows):5.2f}%   ({detail})")
    print("\nHeld out: Narayanan et al. 2021 Table 1 (full recompute, hardware TFLOP/s per GPU)")
    rows = narayanan_check()
    errs = {"mb1": [], "searched": []}
    for r in rows:
        cells = []
        for k in ("mb1", "searched"):
            if r.get(k) is None:
                cells.append(f"{k}: no fit")
                continue
            e = 100 * (r[k] / r["published"] - 1)
            errs[k].append(abs(e))
            cells.append(f"{k} {r[k]:6.1f} ({e:+5.1f}%) [{r[k + '_layout']}]")
        print(f"  {r['model']:>8s} published {r['published']:4d}   " + "   ".join(cells))
    for k, v in errs.items():
        if v:
            print(f"  MAPE {k}: {sum(v) / len(v):.1f}% (max {max(v):.1f}%) over {len(v)} rows")


if __name__ == "__main__":
    main()

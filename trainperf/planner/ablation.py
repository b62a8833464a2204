"""What each Hopper mechanism moved on the development set (no torch).

``python -m trainperf.planner.ablation [--json]``: leave-one-source-out (outer folds, as ``loso --fast``) with
every mechanism as shipped, then once more per mechanism with that one switched off on every row (its
constants refitted: an ablation is judged as the model would be without it), and the difference in each
source's error. A mechanism no development row uses moves nothing here; that is said, not hidden.
"""

from __future__ import annotations

from dataclasses import replace

from trainperf.planner import devset
from trainperf.planner.constants import DEFAULTS

ABLATIONS = {
    "gemm_generation": ("the published GEMM ceiling by generation (MAMF: A100 85.9%, H100 80.1%)",
                        "the catalog's gemm_fraction (A100 0.88, H100 0.79)", {"published_gemm": 0.0}, None),
    "nccl_fabric": ("NCCL bandwidths published for NVLink 4 (ring 370 GB/s) and NDR (47 GB/s per NIC)",
                    "0.8 of the link rates", {"published_fabric": 0.0}, None),
    "nccl_latency": ("a collective's latency from NCCL's cost model (tuning.cc: a ring of n ranks takes n - 1 steps)",
                     "20 us per log2 of the ranks", {"nccl_tuning": 0.0}, None),
    "nvls": ("NVLink SHARP all-reduce in an NVSwitch 3 node", "ring all-reduce", {}, lambda s: replace(s, nvls=False)),
    "tp_comm_overlap": ("TP communication overlapped with the GEMMs (decomposed; LLaMA's concurrent)",
                        "TP collectives exposed", {}, lambda s: replace(s, async_tp=False)),
    "fp8_weight_cache": ("Transformer Engine's FP8 weights cast once per step", "cast every micro-batch", {},
                         lambda s: replace(s, fp8_weight_cache=False)),
    "dp_buckets": ("the overlapped DP reduction's last bucket exposed (DDP 25 MB, Megatron-Core 40M params)",
                   "every bucket hidden (the model before issue 39)", {}, lambda s: replace(s, dp_bucket="ideal")),
    "param_gather_overlap": ("the distributed optimizer's all-gather overlapped with the next forward",
                             "all-gather before the forward", {}, lambda s: replace(s, param_gather="after")),
}
"""name -> (what the mechanism is, what it is compared with, constants switched, stack transform)."""


def _uses(name: str, row) -> bool:
    """Whether the mechanism can move this row at all (for the count of rows it applies to)."""
    st, (tp, _, dp, cp, _, _, _, sp, zero) = row.stack, row.fixed
    if name == "nvls":
        return st.nvls and "H100" in row.spec().name and ((tp or 2) > 1 and not sp or zero == 0)
    if name == "tp_comm_overlap":
        return st.async_tp
    if name == "fp8_weight_cache":
        return st.float8 and st.fp8_weight_cache
    if name in ("dp_buckets", "param_gather_overlap"):
        return zero != 3 and (dp or 2) * (cp or 1) > 1 and st.dp_reduce == "overlap" and (
            name == "dp_buckets" or zero in (1, 2, None))
    return True


def ablate(name: str, rows: list) -> tuple[list, dict]:
    """The rows and the base constants with ``name`` switched off."""
    _, _, const, transform = ABLATIONS[name]
    if transform is None:
        return rows, const
    return [replace(r, stack=transform(r.stack)) for r in rows], const


def run(rows=None, progress=None, names=None) -> dict:
    """Per mechanism (``names``: those only): rows it applies to, and the LOSO pooled / per-source error with and
    without it."""
    from trainperf.planner.loso import loso

    rows = devset.load() if rows is None else rows
    base = loso(rows, nested=False)["summary"]
    out = {"with_all": {s: v["model_mean_abs_error"] for s, v in base.items()}, "mechanisms": {}}
    for name, (what, without, _, _) in ABLATIONS.items():
        if names and name not in names:
            continue
        applies = sum(_uses(name, r) for r in rows)
        entry = {"what": what, "without": without, "rows_it_applies_to": applies}
        if applies:
            rws, const = ablate(name, rows)
            summ = loso(rws, replace(DEFAULTS, **const), nested=False)["summary"]
            entry["without_it"] = {s: v["model_mean_abs_error"] for s, v in summ.items()}
            entry["moved"] = {s: round(out["with_all"][s] - entry["without_it"][s], 4) for s in summ}
        if progress:
            progress(name)
        out["mechanisms"][name] = entry
    return out


def render(res: dict) -> str:
    lines = ["| mechanism | what it is | compared with | rows it applies to | pooled error with / without | "
             "sources it moved most (error with - without) |", "|---|---|---|---|---|---|"]
    for name, e in res["mechanisms"].items():
        if not e.get("moved"):
            lines.append(f"| {name} | {e['what']} | {e['without']} | {e['rows_it_applies_to']} | - | no development "
                         "row uses it: it moved nothing here |")
            continue
        pooled = f"{100 * res['with_all']['pooled']:.2f}% / {100 * e['without_it']['pooled']:.2f}%"
        top = sorted(((s, d) for s, d in e["moved"].items() if s != "pooled" and abs(d) >= 0.0005),
                     key=lambda x: -abs(x[1]))[:4]
        moved = ", ".join(f"{s} {100 * d:+.1f}" for s, d in top) or "under 0.05 points everywhere"
        lines.append(f"| {name} | {e['what']} | {e['without']} | {e['rows_it_applies_to']} | {pooled} | {moved} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m trainperf.planner.ablation",
                                 description="what each Hopper mechanism moved on the development set (LOSO, "
                                             "outer folds, each ablation refitted)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(progress=lambda n: print(f"  {n} done", file=sys.stderr))
    if args.json:
        from trainperf.runio import dumps_strict

        print(dumps_strict(res))
    else:
        print(render(res))


if __name__ == "__main__":
    main()

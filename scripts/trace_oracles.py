"""The peers' figures on traces, computed once and stored, so trainperf's tests can assert agreement without
either peer installed. Run from the repository's root with an interpreter that has HTA 0.5.0 and
torch-tb-profiler 0.4.3 (PEERS/bin/python: a virtual environment of your own holding both):

    PEERS/bin/python scripts/trace_oracles.py --out tests/data/trace_oracles/corpus.json \\
        --root tests/data/real $(find tests/data/real -name '*.json*' | sort)
    PEERS/bin/python scripts/trace_oracles.py --out tests/data/trace_oracles/generated.json \\
        --root tests/data/traces tests/data/traces/*.json.gz

The real traces are the peers' own, committed under tests/data/real (tests/data/real/README.md: where each
comes from). An existing --out file is extended: move it away first to compute it afresh.

For each trace (named by its path under --root, with its sha256):

* ``hta``: HTA's ``TraceAnalysis`` (include_last_profiler_step=False, its default): get_temporal_breakdown,
  get_idle_time_breakdown (every stream, consecutive_kernel_delay 30), get_comm_comp_overlap,
  get_gpu_kernel_breakdown's kernel-type table, get_cuda_kernel_launch_stats (medians); ``hta_unrounded``:
  the same with ``HTA_DISABLE_NS_ROUNDING=1`` (HTA otherwise rounds float times to whole microseconds).
* ``tb``: the plugin's ``RunProfileData`` (what its Overview shows): the average step cost per role, the
  steps, GPU utilization, estimated SM efficiency, achieved occupancy and tensor-core kernel share of the
  busiest device. A torch 2.x trace is given to 0.4.3 as a 1.8-era one (cuda_runtime/cuda_driver ->
  Runtime, cpu_op/user_annotation -> Operator, kernel/gpu_memcpy/gpu_memset -> Kernel/Memcpy/Memset,
  gpu_user_annotation dropped): 0.4.3 predates those categories and otherwise sees no launches; the
  translation is recorded as ``tb.input``.

A peer that fails on a trace records its error instead of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

TB_CATS = {"cuda_runtime": "Runtime", "cuda_driver": "Runtime", "cpu_op": "Operator", "user_annotation": "Operator",
           "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def clean(x):
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    try:
        import numpy as np

        if isinstance(x, np.generic):
            x = x.item()
    except ImportError:
        pass
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def hta_figures(path: Path, unrounded: bool) -> dict:
    if unrounded:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    else:
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        link = Path(d) / ("rank-0" + ("".join(path.suffixes[-2:]) if path.name.endswith(".gz") else ".json"))
        os.symlink(path.resolve(), link)
        t0 = time.perf_counter()
        ta = TraceAnalysis(trace_dir=d)
        load_s = time.perf_counter() - t0
        rank = next(iter(ta.t.traces))
        out: dict = {"load_s": load_s, "rank": rank}
        try:
            tb = ta.get_temporal_breakdown(visualize=False).iloc[0].to_dict()
            out["temporal"] = {k: tb[k] for k in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)",
                                                   "kernel_time(us)", "idle_time_pctg", "compute_time_pctg",
                                                   "non_compute_time_pctg")}
        except Exception as exc:  # noqa: BLE001 - a peer's failure is recorded
            out["temporal"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            idle, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False)
            rows = idle.to_dict(orient="records")
            by = {}
            for r in rows:
                by.setdefault(r["idle_category"], 0.0)
                by[r["idle_category"]] += float(r["idle_time"])
            tot = sum(by.values())
            out["idle"] = {"by_stream": rows, "us": by, "pct": {k: 100 * v / tot for k, v in by.items()} if tot else None}
        except Exception as exc:  # noqa: BLE001
            out["idle"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            ov = ta.get_comm_comp_overlap(visualize=False).iloc[0].to_dict()
            out["overlap_pct"] = ov.get("comp_comm_overlap_pctg")
        except Exception as exc:  # noqa: BLE001
            out["overlap_pct"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            kt, _ = ta.get_gpu_kernel_breakdown(visualize=False)
            out["kernel_types"] = {r["kernel_type"]: {"us": r["sum"], "pct": r["percentage"]}
                                   for r in kt.to_dict(orient="records")}
        except Exception as exc:  # noqa: BLE001
            out["kernel_types"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            ls = ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
            if len(ls):
                out["launch"] = {"pairs": int(len(ls)), "cpu_duration_median": float(ls.cpu_duration.median()),
                                 "gpu_duration_median": float(ls.gpu_duration.median()),
                                 "launch_delay_median": float(ls.launch_delay.median()),
                                 "short_pct": 100 * float((ls.gpu_duration < ls.cpu_duration).mean())}
        except Exception as exc:  # noqa: BLE001
            out["launch"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def tb_input(path: Path, work: Path) -> tuple[Path, str]:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    if isinstance(d, list):
        d = {"traceEvents": d}
    evs = d.get("traceEvents") or []
    if not any(str(e.get("cat")) in TB_CATS or e.get("cat") == "gpu_user_annotation" for e in evs):
        return path, "as written (1.8-era categories)"
    out = []
    for e in evs:
        c = e.get("cat")
        if c == "gpu_user_annotation":
            continue
        if c in TB_CATS:
            e = dict(e, cat=TB_CATS[c])
        out.append(e)
    d["traceEvents"] = out
    p = work / ("tb_" + path.name.replace(".json.gz", "").replace(".json", "") + ".pt.trace.json.gz")
    with gzip.open(p, "wt", encoding="utf-8") as f:
        json.dump(d, f)
    return p, "2.x categories mapped to 1.8's: " + ", ".join(f"{k}->{v}" for k, v in TB_CATS.items()) + \
        "; gpu_user_annotation dropped"


def tb_figures(path: Path) -> dict:
    logging.getLogger("torch_tb_profiler").setLevel(logging.ERROR)
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    with tempfile.TemporaryDirectory() as d:
        src, how = tb_input(path, Path(d))
        t0 = time.perf_counter()
        prof = RunProfileData.parse("worker0", "span", str(src), d)
        secs = time.perf_counter() - t0
    avg = prof.avg_costs.costs
    total = avg[ProfileRole.Total]
    roles = {"kernel": ProfileRole.Kernel, "memcpy": ProfileRole.Memcpy, "memset": ProfileRole.Memset,
             "communication": ProfileRole.Communication, "runtime": ProfileRole.Runtime,
             "dataloader": ProfileRole.DataLoader, "cpu_exec": ProfileRole.CpuOp, "other": ProfileRole.Other}
    gm = prof.gpu_metrics_parser
    gpus = sorted(gm.gpu_ids)
    busiest = None
    out: dict = {"input": how, "parse_s": secs, "steps": len(prof.steps_costs), "step_names": prof.steps_names,
                 "step_time_us": total, "breakdown_us": {k: avg[v] for k, v in roles.items()},
                 "breakdown_pct": {k: (100 * avg[v] / total if total else None) for k, v in roles.items()},
                 "gpus": {}}
    for g in gpus:
        out["gpus"][g] = {"utilization_pct": 100 * gm.gpu_utilization[g] if gm.gpu_utilization[g] is not None else None,
                          "sm_efficiency_pct": (100 * gm.avg_approximated_sm_efficiency_per_device[g]
                                                if gm.avg_approximated_sm_efficiency_per_device[g] is not None else None),
                          "occupancy_pct": gm.avg_occupancy_per_device[g],
                          "tensor_core_pct": 100 * prof.tc_ratio[g] if prof.tc_ratio[g] is not None else None}
    if gpus:
        busiest = max(gpus, key=lambda g: gm.gpu_utilization[g] or 0)
    out["main_gpu"] = busiest
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", default=None, help="trace names are their paths relative to this")
    ap.add_argument("--peers", default="hta,tb")
    a = ap.parse_args(argv)
    import hta
    import torch_tb_profiler

    peers = set(a.peers.split(","))
    doc = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "peers": {"HolisticTraceAnalysis": getattr(hta, "__version__", "0.5.0"),
                     "torch-tb-profiler": getattr(torch_tb_profiler, "__version__", "0.4.3")},
           "made": time.strftime("%Y-%m-%d"), "traces": {}}
    outp = Path(a.out)
    if outp.exists():
        old = json.loads(outp.read_text())
        doc["traces"] = old.get("traces", {})
    for t in a.traces:
        p = Path(t)
        name = str(p.resolve().relative_to(Path(a.root).resolve())) if a.root else p.name
        rec: dict = {"sha256": sha256(p)}
        print(f"{name} ...", file=sys.stderr, flush=True)
        sink = io.StringIO()
        for peer, fn in (("hta", lambda: hta_figures(p, False)), ("hta_unrounded", lambda: hta_figures(p, True)),
                         ("tb", lambda: tb_figures(p))):
            if peer.split("_")[0] not in peers:
                continue
            try:
                with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                    rec[peer] = fn()
            except Exception as exc:  # noqa: BLE001 - recorded, the next peer runs
                rec[peer] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        doc["traces"][name] = clean(rec)
        outp.parent.mkdir(parents=True, exist_ok=True)
        tmp = outp.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        tmp.replace(outp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

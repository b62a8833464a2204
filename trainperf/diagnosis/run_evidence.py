"""A run directory as evidence: what ``trainperf train`` (or a tracked loop) wrote, read and summarised.

:func:`compute_summary` reads a loaded run (:func:`trainperf.diagnosis.rundir.load_run`) into the figures
``trainperf diagnose RUN_DIR --json`` prints as ``summary`` (over the steady steps); :func:`run_evidence` turns
them into the :class:`~trainperf.diagnosis.evidence.Evidence` the rules read, recording what a run directory
cannot measure (the figures only a profiler trace has). :func:`run_missing` is the run's own list of figures
it could not record (NVML, GPM, MFU...), with the reason it recorded.

The first 10% of the steps (at least one, when there are three or more) are left out of every figure: they
hold compilation, allocator growth and cold caches. The ``compile`` phase (the trainer books first-step
compilation under it) is never part of the steady-state fractions; its total is ``summary.compile_s``.
MFU/HFU are over the same steady steps as tokens/s (``mfu_run`` / ``hfu_run``: summary.json's whole-run
figures).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainperf.diagnosis.evidence import CommWait, DataWait, Evidence, GpuUse, median, num
from trainperf.diagnosis.rundir import load_run
from trainperf.diagnosis.screen import screen_run

COMPILE_PHASE = "compile"  # booked apart by the trainer; never in the steady-state fractions
NEEDS_TRACE = ("needs a profiler trace: set monitor.profile.start_step (its profile/ traces are then read), or "
               "pass a torch.profiler trace")
CANNOT_MEASURE = {name: NEEDS_TRACE for name in ("tensor_cores", "memcpy", "host_syncs", "occupancy", "attribution")}
"""Evidence fields only a profiler trace holds (GPU kernels, copies, the host's runtime calls), with the reason."""
_num = num


def _steady(recs: list[dict]) -> list[dict]:
    if len(recs) < 3:
        return recs
    skip = max(1, math.ceil(0.1 * len(recs)))
    return recs[skip:]


def _mean(xs):
    xs = [x for x in (_num(v) for v in xs) if x is not None]
    return sum(xs) / len(xs) if xs else None


def _cfg(run: dict, dotted: str, default=None):
    d: Any = run["config"]
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def _phases(rec: dict, key: str = "phases_s") -> dict[str, float]:
    d = rec.get(key)
    if not isinstance(d, dict):
        return {}
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def _bad_loss(v: Any) -> str | None:
    """'nan' / 'inf' / '-inf' (as train's divergence message writes them) for a loss that is not finite
    (null on disk: strict JSON writes NaN and inf as null, and a step's loss is written only when there is
    one), else None."""
    if v is None:
        return "nan"  # null: the trainer's NaN or inf
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return None


def _loss_evidence(run: dict, recs: list[dict]) -> dict | None:
    """Where the loss stopped being a number (the trainer's divergence check: it stops the run with
    DivergedError on the first non-finite loss, before summary.json), or None when every logged loss is finite."""
    bad = [(r["step"], _bad_loss(r["loss"])) for r in recs if "loss" in r and _bad_loss(r["loss"])]
    summ = run["summary"]
    final = summ.get("final_loss")
    if not bad and not (isinstance(final, float) and not math.isfinite(final)):
        return None
    first = bad[0][0] if bad else None
    good = [(r["step"], float(r["loss"])) for r in recs if "loss" in r and _num(r["loss"]) is not None
            and (first is None or r["step"] < first)]
    return {"step": first, "value": bad[0][1] if bad else _bad_loss(final), "records": len(bad),
            "of": sum(1 for r in recs if "loss" in r), "last_finite": good[-1] if good else None,
            "stopped": run["crashed"], "file": str(_metrics_file(run)),
            "summary_final_loss": None if bad else _bad_loss(final),
            "lr": _cfg(run, "optimizer.lr"), "grad_clip": _cfg(run, "train.grad_clip"),
            "warmup_steps": _cfg(run, "schedule.warmup_steps"),
            "dtype": _text(summ.get("precision")) or _text(_cfg(run, "precision.dtype"))}


def _metrics_file(run: dict) -> Path:
    return run.get("rank_files", {}).get(0) or Path(run["dir"]) / "metrics.jsonl"


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def rank_compute_windows(recs: list[dict]) -> dict | None:
    """The trainer's per-rank compute clock: each log flush on rank 0 writes ``rank_compute_s``
    (mean compute seconds per step of every data-parallel rank over the window: forward+backward
    without collective waits) and ``rank_clock`` ("thread_cpu", "cuda_events" or "wall_to_last_grad");
    under tensor or pipeline parallelism also ``rank_compute_by_rank_s`` (every global rank) and
    ``rank_groups`` (the tensor-parallel groups and pipeline ranks: who waits for whom). Returns
    {"clock", "windows": [[s per rank], ...] (one row per record that carries it: a window whose
    every record carries its list weighs by its steps), "n_windows", "cpu_windows", "of" ("data rank",
    or "rank" with the global ranks' rows, preferred where written), "groups" (or None)}, the first 10% of
    the rows (at least one of three or more) left out as warm-up; None when the run has no such records."""
    by_rank = any(isinstance(r.get("rank_compute_by_rank_s"), list) and len(r["rank_compute_by_rank_s"]) >= 2
                  for r in recs)
    key, cpu_key = ("rank_compute_by_rank_s", "rank_cpu_by_rank_s") if by_rank else ("rank_compute_s", "rank_cpu_s")
    rows: list[list[float | None]] = []
    cpu_rows: list[list[float | None] | None] = []
    clock = groups = None
    for r in recs:
        v = r.get(key)
        if isinstance(v, list) and len(v) >= 2:
            rows.append([x if (x or 0) > 0 else None for x in map(_num, v)])
            c = r.get(cpu_key)  # CPU seconds of the same work: far below the clock = waiting for a core
            cpu_rows.append([_num(x) for x in c] if isinstance(c, list) and len(c) == len(v) else None)
            clock = r.get("rank_clock", clock)
            g = r.get("rank_groups")
            groups = g if isinstance(g, dict) else groups
    if not rows:
        return None
    if len(rows) >= 3:
        skip = max(1, math.ceil(0.1 * len(rows)))
        rows, cpu_rows = rows[skip:], cpu_rows[skip:]
    n_windows = sum(1 for i, row in enumerate(rows) if i == 0 or row != rows[i - 1])
    return {"clock": clock, "windows": rows, "n_windows": n_windows, "cpu_windows": cpu_rows,
            "of": "rank" if by_rank else "data rank", "groups": _groups(groups) if by_rank else None}


def _groups(g: dict | None) -> dict | None:
    """``rank_groups`` as written (lists of lists of ints), or None where it is not that."""
    if not isinstance(g, dict):
        return None
    out = {}
    for k in ("tensor", "pipeline", "stages"):
        v = g.get(k) or []
        if not (isinstance(v, list) and all(isinstance(x, list) and all(isinstance(i, int) for i in x) for x in v)):
            return None
        out[k] = v
    return out


def _shares(v: Any) -> str:
    return "/".join(str(x) for x in v) if isinstance(v, list) else str(v)


def balance_log(recs: list[dict]) -> list[str]:
    """The balancer's history from the step records (``balance/*``, trainperf.distributed.balance): each change of
    the ranks' speeds it saw, each move it tried and each verdict, as one line with its step."""
    out = []
    for r in recs:
        step = r.get("step")
        if r.get("balance/change"):
            out.append(f"step {step}: {r['balance/change']}")
        if "balance/new_shares" in r:
            gain = _num(r.get("balance/predicted_gain"))
            out.append(f"step {step}: shares {_shares(r.get('balance/old_shares'))} -> "
                       f"{_shares(r['balance/new_shares'])} tried ({r.get('balance/trigger', 'threshold')}"
                       + (f"; predicted {gain:.0%} faster" if gain is not None else "") + ")")
        if r.get("balance/verdict"):
            gain, se = _num(r.get("balance/verdict_measured_gain")), _num(r.get("balance/verdict_gain_se"))
            measured = f"measured {gain:+.0%} +- {se:.0%}" if gain is not None and se is not None else "measured"
            out.append(f"step {step}: {r['balance/verdict']} ({measured}); shares "
                       f"{_shares(r.get('balance/verdict_shares'))}")
    return out


def compute_summary(run: dict) -> dict[str, Any]:
    """Figures the rules look at (over the steady steps). The ``compile`` phase (first-step
    compilation, booked apart by the trainer) is never part of the steady-state fractions: its
    total over the whole run is ``compile_s``."""
    s: dict[str, Any] = {"source": "run"}
    ranks = run["ranks"]
    recs0 = ranks.get(0) or (next(iter(ranks.values())) if ranks else [])
    main = _steady(recs0)
    s["steps_recorded"] = len(ranks.get(0, []))
    s["steps_used"] = len(main)
    s["balance_enabled"] = _cfg(run, "parallelism.balance.enabled") is True  # the straggler's fix depends on it
    s["balance_log"] = balance_log(recs0) if s["balance_enabled"] else None
    phase_tot: dict[str, float] = {}
    cpu_tot: dict[str, float] = {}
    for r in main:
        for k, v in _phases(r).items():
            if k != COMPILE_PHASE:
                phase_tot[k] = phase_tot.get(k, 0.0) + v
        for k, v in _phases(r, "phases_cpu_s").items():
            if k != COMPILE_PHASE:
                cpu_tot[k] = cpu_tot.get(k, 0.0) + v
    total = sum(phase_tot.values())
    s["phase_fractions"] = {k: v / total for k, v in phase_tot.items()} if total else {}
    s["phase_mean_s"] = {k: v / len(main) for k, v in phase_tot.items()} if main else {}
    s["phase_cpu_ratio"] = {k: cpu_tot[k] / phase_tot[k] for k in cpu_tot if phase_tot.get(k)}
    comp = [_phases(r).get(COMPILE_PHASE) for r in recs0]
    summ = run["summary"]
    booked = _phases(summ, "phase_seconds").get(COMPILE_PHASE)
    s["compile_s"] = sum(c for c in comp if c) or booked or 0.0
    s["oom_events"] = [{k[4:]: v for k, v in r.items() if k.startswith("oom/")} for r in recs0 if "oom/new_micro_batch" in r]
    s["train_time_s"] = summ.get("train_time_s") or (sum(r["step_time_s"] for r in recs0) if recs0 else None)
    times = [r["step_time_s"] for r in main]
    s["step_time_s"] = median(times) if times else None
    s["step_time_p90_s"] = _percentile(times, 0.9) if times else None
    s["step_time_min_s"], s["step_time_max_s"] = (min(times), max(times)) if times else (None, None)
    tps = [r["tokens_per_s"] for r in main if _num(r.get("tokens_per_s"))]
    s["tokens_per_s"] = median(tps) if tps else None
    # MFU/HFU over the same steady steps as tokens/s (median of the per-step MFU, which is linear in
    # tokens/s); HFU keeps summary.json's HFU/MFU ratio (counted / formula FLOPs). Whole-run figures
    # (summary.json: every step, wall clock) are kept as mfu_run / hfu_run.
    s["mfu_run"], s["hfu_run"] = _num(summ.get("mfu")), _num(summ.get("hfu"))
    step_mfu = [m for m in (_num(r.get("mfu")) for r in main) if m is not None]
    s["mfu"] = median(step_mfu) if step_mfu else s["mfu_run"]
    s["hfu"] = s["hfu_run"]
    if step_mfu and s["mfu_run"] and s["hfu_run"]:
        s["hfu"] = s["mfu"] * s["hfu_run"] / s["mfu_run"]
    for k in ("mfu", "hfu", "mfu_run", "hfu_run"):  # a fraction of the peak: outside [0, 1] it is no figure
        if s[k] is not None and not 0 <= s[k] <= 1:
            s[k] = None
    s["loss"] = _loss_evidence(run, recs0)
    s["peak_source"] = _text(summ.get("peak_source"))
    s["mfu_convention"] = _text(summ.get("mfu_convention"))
    s["device"] = _text(summ.get("device")) or _text(_cfg(run, "run.device"))
    threads = _cfg(run, "run.threads")
    s["threads"] = threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None
    mem = [r.get("mem_peak_bytes") for r in main if _num(r.get("mem_peak_bytes"))]
    s["mem_peak_bytes"] = summ.get("mem_peak_bytes") or (max(mem) if mem else None)
    s["mem_capacity_bytes"] = summ.get("mem_capacity_bytes")
    # CPU time the process got per wall second in its compute phases (CPU runs: what its threads got)
    wall = cpu = 0.0
    for r in main:
        w, c = _phases(r), _phases(r, "phases_cpu_s")
        for k in ("forward", "backward", "optimizer"):
            if k in w and k in c:
                wall, cpu = wall + w[k], cpu + c[k]
    s["cpu_cores_got"] = cpu / wall if wall > 0 and str(s["device"] or "").startswith("cpu") else None
    # per rank, from each rank's own file (wall clock)
    per_rank = {}
    for rank, recs in sorted(ranks.items()):
        st = _steady(recs)
        if not st:
            continue
        comp = [sum(v for k, v in _phases(r).items() if k not in ("comm", COMPILE_PHASE)) for r in st]
        comm = [_phases(r).get("comm", 0.0) for r in st]
        total = sum(comp) + sum(comm)
        per_rank[rank] = {"step_time_s": _mean([r["step_time_s"] for r in st]), "compute_s": _mean(comp),
                          "comm_s": _mean(comm), "comm_fraction": sum(comm) / total if total else 0.0}
    s["ranks"] = per_rank
    s["rank_compute"] = rank_compute_windows(recs0)
    # device samples over the steady part of the run
    first_step = main[0]["step"] if main else 0
    sm = [x for recs in run["samples"].values() for x in recs if (_num(x.get("step")) or 0) >= first_step]
    for key in ("gpu_kernel_busy_pct", "gpu_sm_active_pct", "gpu_tensor_active_pct", "gpu_mem_copy_util_pct",
                "gpu_power_w", "cpu_pct", "proc_cpu_pct"):
        s[key] = _mean([x.get(key) for x in sm])
    s["samples"] = len(sm)
    s["xla_steps"] = [r for r in ranks.get(0, []) if "xla_step_compiles" in r]  # all steps: xla_recompile
    return s




def _text(v: Any) -> str | None:
    """A summary field that is text: a hand-edited or corrupt summary.json's number or list there is none."""
    return v if isinstance(v, str) else None



def _why_no_mfu(run: dict) -> str:
    """The real reason a run has no MFU, from what it recorded."""
    summ, cfg = run["summary"], run["config"] or {}
    if (cfg.get("monitor") or {}).get("mfu") is False:
        return "monitor.mfu=false"
    if run["crashed"] or not summ:
        return "the run ended before its summary was written (crashed or stopped)"
    if summ.get("flops_per_token_formula") is None and "flops_per_token_formula" in summ:
        return f"no FLOP formula: {summ.get('flops_formula_note') or 'unknown model shape'}"
    if summ.get("peak_flops") is None:
        return f"no peak FLOP/s for this device ({summ.get('peak_source') or 'not in the catalog'})"
    return "no throughput recorded"


def run_missing(run: dict, s: dict) -> list[str]:
    out = []
    metas = run["sample_meta"]
    meta = metas.get(0) or (next(iter(metas.values())) if metas else {})
    if s.get("gpu_kernel_busy_pct") is None:
        out.append(f"GPU kernel-busy and memory-copy utilization (NVML: {meta.get('nvml', 'no samples recorded')})")
    if s.get("gpu_sm_active_pct") is None:
        out.append(f"SM activity / tensor-pipe activity (NVML GPM: {meta.get('gpm', 'no samples recorded')}; "
                   "DCGM is not read)")
    if s.get("mfu") is None:
        out.append(f"MFU ({_why_no_mfu(run)})")
    if s.get("mem_capacity_bytes") is None:
        out.append("device memory use (memory_bound needs a CUDA run)")
    if len(s["ranks"]) < 2 and not s.get("rank_compute"):
        out.append("per-rank comparison (straggler needs two or more ranks)")
    return out


def load_screened(run_dir: str | Path) -> dict[str, Any]:
    """:func:`load_run`, with the records and summary.json figures no real run can have left out
    (:func:`trainperf.diagnosis.screen.screen_run`, the rule compare uses); the notes are ``run["data_notes"]``."""
    run = load_run(run_dir)
    screen_run(run)
    return run


RUN_NOTE_KEYS = ("raised", "tokens")
"""summary.json notes diagnose repeats: the run ended on an exception (closed by the caller), no tokens counted."""


def run_notes(run: dict) -> list[str]:
    """summary.json's notes that say how the run ended, and the fail-fast reports of ranks that stopped
    (failures.jsonl: a rank that died, hung or raised ended the job; each rank's report, earliest first)."""
    out = []
    for f in sorted(run.get("failures") or [], key=lambda f: f.get("time") or 0):
        out.append(f"failure: {f['report'].removeprefix('trainperf: ')}")
    notes = (run.get("summary") or {}).get("notes")
    if isinstance(notes, dict):
        out += [f"{k}: {notes[k]}" for k in RUN_NOTE_KEYS if isinstance(notes.get(k), str)]
    return out


def _cpu_share(s: dict) -> float | None:
    """On a CPU-device run: CPU seconds per wall second the process got in its compute phases (capped
    at one core). On a busy machine this is below 1, and a decoding loader gets no more than it."""
    if not str(s.get("device") or "").startswith("cpu"):
        return None
    r = s["phase_cpu_ratio"]
    comp = [r[k] for k in ("forward", "backward") if k in r]
    return min(1.0, max(comp)) if comp else None


def run_evidence(s: dict) -> Evidence:
    """The rules' evidence from a run's summary (:func:`compute_summary`)."""
    pf, pm = s["phase_fractions"], s["phase_mean_s"]
    tot = sum(pm.values())
    ev = Evidence(
        rank=None, world=max(1, len(s["ranks"])), window="mean over the steady steps", steps_used=s["steps_used"],
        fixes="config", device={"name": s["device"]} if s.get("device") else None,
        step_time_s=s["step_time_s"], step_s=tot if tot > 0 else s["step_time_s"],
        step_time_p90_s=s["step_time_p90_s"], step_time_min_s=s["step_time_min_s"],
        step_time_max_s=s["step_time_max_s"], train_time_s=s["train_time_s"], compile_s=s["compile_s"],
        phase_fractions=pf, phase_mean_s=pm,
        data=DataWait(fraction=pf.get("data", 0.0), mean_s=pm.get("data", 0.0), label="data wait",
                      cpu_ratio=s["phase_cpu_ratio"].get("data")),
        comm=CommWait(fraction=pf.get("comm", 0.0), mean_s=pm.get("comm", 0.0)),
        gpu=GpuUse(busy_pct=s["gpu_kernel_busy_pct"], sm_active_pct=s["gpu_sm_active_pct"],
                   mem_copy_util_pct=s["gpu_mem_copy_util_pct"]),
        ranks=s["ranks"], rank_compute=s["rank_compute"], balance_enabled=s["balance_enabled"],
        balance_log=s.get("balance_log"),
        cpu_cores_got=s["cpu_cores_got"], cpu_share=_cpu_share(s), threads=s["threads"], cpu_pct=s["cpu_pct"],
        proc_cpu_pct=s["proc_cpu_pct"], loss=s["loss"], mfu=s["mfu"], peak_source=s["peak_source"],
        mem_peak_bytes=s["mem_peak_bytes"], mem_capacity_bytes=s["mem_capacity_bytes"], oom_events=s["oom_events"],
        xla_steps=s["xla_steps"])
    for name, reason in CANNOT_MEASURE.items():
        ev.lacks(name, reason)
    return ev


__all__ = ["CANNOT_MEASURE", "COMPILE_PHASE", "compute_summary", "load_screened", "rank_compute_windows", "run_evidence", "run_missing",
           "run_notes"]

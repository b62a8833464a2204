"""Diagnosis: one rule table over evidence -> findings with evidence, cause, fix and gain.

Evidence is a dict of figures with one shape whatever it came from: a run directory
(:func:`compute_summary`, ``"source": "run"``) or a profiler trace (one rank's figures, built by
:mod:`trainperf.monitor.trace_evidence`, ``"source": "trace"``). A rule reads the figures it needs
and does not ask where they came from; ``Rule.not_from`` names the evidence a rule cannot be judged
from, with the reason (listed as not measured). :func:`apply_rules` runs the table over one evidence
dict. ``trainperf diagnose PATH`` (run directory, trace, directory of traces) is
:func:`trainperf.monitor.engine.diagnose_path`.

``diagnose(run_dir)`` reads what ``trainperf train`` wrote (metrics*.jsonl, samples*.jsonl,
summary.json and config.yaml; a crashed run without summary.json works too) and returns::

    {"findings": [{"id", "severity", "title", "evidence", "cause", "fix", "gain"}],
     "summary": {"mfu", "hfu", "phase_fractions", "step_time_s", "tokens_per_s", ...},
     "missing": ["what could not be checked, and why"], "not_measured": [{"id", "reason"}]}

``gain`` is the upper bound a fix can bring (:mod:`trainperf.monitor.gain`), or None where no honest
bound can be computed.

The first 10% of the steps (at least one, when there are three or more) are left out of every
figure: they hold compilation, allocator growth and cold caches. The ``compile`` phase (the
trainer books first-step compilation under it) is never part of the steady-state fractions; its
total is ``summary.compile_s``. MFU/HFU are over the same steady steps as tokens/s (``mfu_run`` /
``hfu_run``: summary.json's whole-run figures). ``RULES`` is the table; the
README's troubleshooting table is generated from it (``rules_markdown()``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from trainperf.monitor.gain import fraction, step_gain
from trainperf.monitor.rules_runtime import COMPILE_PHASE, RUNTIME_RULES, _num, rank_compute_windows
from trainperf.monitor.rules_runtime import pct as _pct
from trainperf.monitor.rules_trace import NOT_FROM_TRACE, TRACE_RULES, comm_bound_trace, data_bound_trace
from trainperf.monitor.rundir import known_state, load_run, rank_of
from trainperf.monitor.screen import no_steps, screen_run
from trainperf.monitor.xla import XLA_RECOMPILE_RULE

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

# Thresholds (fractions of step time, or percent for NVML/GPM figures).
DATA_WARN, DATA_CRIT = 0.20, 0.40
COMM_WARN, COMM_CRIT = 0.15, 0.30
IO_CPU_RATIO = 0.3  # CPU seconds per second of data wait (relative to the CPU the process gets) below this: IO
LOW_MFU_CATALOG = 0.30  # against a GPU's dense catalog peak
LAUNCH_BUSY_PCT = 70.0
MEMORY_USED_FRAC = 0.5
TARGET_GPU_UTIL, TARGET_SM_EFF, TARGET_MEMCOPY = 85.0, 70.0, 30.0


@dataclass(frozen=True)
class Rule:
    id: str
    symptom: str
    condition: str
    cause: str
    fix: str
    check: Callable[[dict], dict | None]
    not_from: dict[str, str] = field(default_factory=dict)
    """evidence source ("run" | "trace") -> why this rule cannot be judged from it."""
    scope: str = "rank"
    """"rank": judged on each rank's evidence; "job": once, over every rank (straggler)."""


# ---------------------------------------------------------------------- loading
_rank_of = rank_of  # the name monitor.py imports


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
    s["step_time_s"] = statistics.median(times) if times else None
    s["step_time_p90_s"] = _percentile(times, 0.9) if times else None
    s["step_time_min_s"], s["step_time_max_s"] = (min(times), max(times)) if times else (None, None)
    tps = [r["tokens_per_s"] for r in main if _num(r.get("tokens_per_s"))]
    s["tokens_per_s"] = statistics.median(tps) if tps else None
    # MFU/HFU over the same steady steps as tokens/s (median of the per-step MFU, which is linear in
    # tokens/s); HFU keeps summary.json's HFU/MFU ratio (counted / formula FLOPs). Whole-run figures
    # (summary.json: every step, wall clock) are kept as mfu_run / hfu_run.
    s["mfu_run"], s["hfu_run"] = _num(summ.get("mfu")), _num(summ.get("hfu"))
    step_mfu = [m for m in (_num(r.get("mfu")) for r in main) if m is not None]
    s["mfu"] = statistics.median(step_mfu) if step_mfu else s["mfu_run"]
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


# ---------------------------------------------------------------------- rules
def _cpu_share(s: dict) -> float | None:
    """On a CPU-device run: CPU seconds per wall second the process got in its compute phases (capped
    at one core). On a busy machine this is below 1, and a decoding loader gets no more than it."""
    if not str(s.get("device") or "").startswith("cpu"):
        return None
    r = s["phase_cpu_ratio"]
    comp = [r[k] for k in ("forward", "backward") if k in r]
    return min(1.0, max(comp)) if comp else None


def _step_s(s: dict) -> float | None:
    """Mean step time: the sum of the mean phases (run) or the trace's step time."""
    tot = sum((s.get("phase_mean_s") or {}).values())
    return tot if tot > 0 and s.get("source") != "trace" else s.get("step_time_s")


def _on(s: dict) -> str:
    return f" on rank {s['rank']}" if s.get("source") == "trace" and s.get("world", 1) > 1 else ""


def _data_bound(s: dict) -> dict | None:
    f = s["phase_fractions"].get("data", 0.0)
    if f <= DATA_WARN:
        return None
    mean_s = s["phase_mean_s"].get("data", 0.0)
    g = step_gain(_step_s(s), mean_s, "DataLoader waits were hidden" if s.get("source") == "trace"
                  else "data waits were hidden")
    sev = "critical" if f > DATA_CRIT else "warning"
    if s.get("source") == "trace":
        return data_bound_trace(s, f, mean_s, sev, g, DATA_WARN)
    ms = 1000 * mean_s
    ratio = s["phase_cpu_ratio"].get("data")
    share = _cpu_share(s)
    busy = ratio / share if (ratio is not None and share) else ratio
    ev = f"data wait {_pct(f)} of step time ({ms:.0f} ms per step, threshold {_pct(DATA_WARN)})"
    if ratio is not None:
        ev += f"; the training process used {100 * ratio:.0f}% of a core while waiting"
        if share is not None and share < 0.9:
            ev += f" ({100 * share:.0f}% of a core was all it got in forward/backward: a busy machine)"
    if busy is not None and busy < IO_CPU_RATIO:
        kind = "io"
        ev += " -> IO-bound"
        cause = "the loader waits on storage: reads are slow and not overlapped with compute (IO-bound)"
        fix = ("data.loader=hybrid with data.prefetch.io_threads=16 and data.prefetch.depth=8 (overlap reads); "
               "data.cache.dir=<local SSD> to cache remote reads")
    else:
        kind = "decode"
        ev += " -> CPU-bound" if busy is not None else ""
        cause = "the loader is CPU-bound: decoding/collating batches in the training process (decode-bound)"
        fix = "data.loader=dataloader or hybrid with more data.num_workers; pre-tokenize (`trainperf data prepare`)"
    return {"severity": sev, "evidence": ev, "cause": cause, "fix": fix, "gain": g, "kind": kind,
            "data_cpu_ratio": ratio, "cpu_share": share}


def _comm_bound(s: dict) -> dict | None:
    # The ranks that wait show the exposed communication: take the rank that waits most.
    per = {r: v["comm_fraction"] for r, v in s["ranks"].items()}
    rank = max(per, key=per.get) if per else 0
    f = per.get(rank, s["phase_fractions"].get("comm", 0.0))
    if f <= COMM_WARN:
        return None
    sec = s["ranks"][rank]["comm_s"] if rank in s["ranks"] else s["phase_mean_s"].get("comm", 0.0)
    step = (s["ranks"][rank].get("step_time_s") if rank in s["ranks"] else None) or _step_s(s)
    g = step_gain(step, sec, "communication were fully overlapped with compute")
    where = f" on rank {rank}" if len(per) > 1 else _on(s)
    sev = "critical" if f > COMM_CRIT else "warning"
    if s.get("source") == "trace":
        return comm_bound_trace(s, f, sec, where, sev, g, COMM_WARN)
    return {"severity": sev, "gain": g,
            "evidence": f"exposed communication {_pct(f)} of step time{where} ({1000 * sec:.0f} ms per step, threshold "
                        f"{_pct(COMM_WARN)})",
            "cause": "gradient collectives are not hidden behind backward: too little compute per byte sent, "
                     "or a slow link",
            "fix": "parallelism.compression.type=bf16 (or powersgd); raise train.global_batch (more accumulation "
                   "per all-reduce); FSDP: parallelism.fsdp_reduce_dtype=bf16; check links with `trainperf doctor`"}


def _launch_bound(s: dict) -> dict | None:
    busy = s.get("gpu_kernel_busy_pct")
    if busy is None or busy >= LAUNCH_BUSY_PCT:
        return None
    other = s["phase_fractions"].get("data", 0.0) + s["phase_fractions"].get("comm", 0.0)
    if other > 0.15:
        return None  # the GPU idles for data or communication: those rules speak
    label = s.get("busy_label") or "NVML kernel-busy"
    ev = f"{label} {busy:.0f}% (threshold {LAUNCH_BUSY_PCT:.0f}%) while data + comm are only {_pct(other)} of step time"
    idle_s = (1 - busy / 100) * (_step_s(s) or 0.0)
    launch = s.get("launch") or {}
    if s.get("source") == "trace":
        hw = s.get("idle_host_wait_frac")
        if hw is not None:
            idle_s = hw * (s.get("step_time_s") or 0.0)  # only the idle the host caused
            ev += f"; the GPU waits for the host {_pct(hw)} of the step (HTA's host_wait)"
        if launch.get("short_kernel_pct") is not None:
            ev += (f"; {launch['short_kernel_pct']:.0f}% of {launch.get('kernels', '?')} kernels run shorter than "
                   f"their launch (median kernel {_fmt_us(launch.get('gpu_us_median'))}, launch "
                   f"{_fmt_us(launch.get('cpu_launch_us_median'))})")
        fix = ("torch.compile(model) (fusion: fewer, larger kernels; mode='reduce-overhead' for CUDA graphs); CUDA "
               "graphs for a static step; a larger micro-batch (each launch does more work)")
    else:
        fix = "compile.enabled=true (compile.mode=reduce-overhead for CUDA graphs); raise train.micro_batch"
    return {"severity": "warning", "evidence": ev, "gain": step_gain(_step_s(s), idle_s, "the GPU never waited "
            "for kernel launches"), "fix": fix,
            "cause": "the host cannot launch kernels fast enough (many small kernels, Python overhead)"}


def _fmt_us(v) -> str:
    if not isinstance(v, (int, float)):
        return "n/a"
    return f"{v:.1f} us" if v < 1000 else f"{v / 1000:.2f} ms"


def _memory_bound(s: dict) -> dict | None:
    peak, cap = s.get("mem_peak_bytes"), s.get("mem_capacity_bytes")
    if not peak or not cap:
        return None
    frac = peak / cap
    mfu = s.get("mfu")
    if frac >= MEMORY_USED_FRAC or (mfu is not None and mfu >= 0.4):
        return None
    return {"severity": "info",
            "evidence": f"peak allocated {peak / 2**30:.1f} GiB of {cap / 2**30:.1f} GiB ({_pct(frac)}, threshold "
                        f"{_pct(MEMORY_USED_FRAC)})" + (f"; MFU {_pct(mfu)}" if mfu is not None else ""),
            "cause": "the batch is too small for the memory: kernels are small and the device is under-fed",
            "fix": "raise train.micro_batch (about x2 per halving of the unused memory; check with "
                   "`trainperf memory CONFIG`); turn memory.checkpointing off if it is on"}


def _text(v: Any) -> str | None:
    """A summary field that is text: a hand-edited or corrupt summary.json's number or list there is none."""
    return v if isinstance(v, str) else None


def _low_mfu(s: dict) -> dict | None:
    mfu, src = s.get("mfu"), s.get("peak_source") or ""
    if mfu is None or not src.startswith("catalog"):
        return None  # against a measured CPU matmul peak MFU is reported, not judged
    limit = LOW_MFU_CATALOG
    if mfu >= limit:
        return None
    return {"severity": "warning",
            "evidence": f"MFU {100 * mfu:.1f}% (threshold {100 * limit:.0f}%) against {src or 'the peak'}",
            "cause": "compute runs far below the device's peak: fp32 math, eager small kernels, or a small model/batch",
            "fix": "precision.dtype=bf16; compile.enabled=true; optimizer.type=fused_adam; raise train.micro_batch"}


def _num_cfg(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _loss_diverged(s: dict) -> dict | None:
    ev = s.get("loss")
    if not ev:
        return None
    if ev["step"] is not None:
        what = "nan or inf (null in the file, which keeps no other)" if ev["value"] == "nan" else ev["value"]
        where = (f"the loss became {what} at step {ev['step']}; {ev['records']} of the {ev['of']} step records in "
                 f"{ev['file']} hold a loss that is not a number")
    else:
        where = f"summary.json's final_loss is {ev['summary_final_loss']}"
    last = ev.get("last_finite")
    if last:
        where += f"; the last finite loss was {last[1]:.4g} at step {last[0]}"
    if ev["stopped"]:
        where += ("; no summary.json: the run ended there (trainperf train stops a run whose loss is not finite: "
                  "'training diverged')")
    lr, clip, warm, dtype = (_num_cfg(ev.get("lr")), _num_cfg(ev.get("grad_clip")), _num_cfg(ev.get("warmup_steps")),
                             ev.get("dtype"))
    known = lr is not None or clip is not None or warm is not None or dtype is not None
    ways = [f"lower optimizer.lr (now {lr:g}; e.g. {min(lr / 10, 3e-4):g})" if lr else "lower optimizer.lr "
            "(e.g. 3e-4)"]
    if not known or warm is None or warm < 100:
        ways.append("warm the learning rate up over more steps (schedule.warmup_steps" + (
            f", now {warm:g}; e.g. 100)" if warm is not None else ", e.g. 100)"))
    if not known or not clip:
        ways.append("clip gradients (train.grad_clip=1.0" + (", now off)" if clip == 0 else ")"))
    elif clip > 1:
        ways.append(f"clip gradients harder (train.grad_clip, now {clip:g}; e.g. 1.0)")
    if not known or dtype in ("fp16", None):
        ways.append("precision.dtype=bf16 instead of fp16 (fp16 overflows where bf16 does not)")
    return {"severity": "critical", "gain": None, "evidence": where, "step": ev["step"],
            "fix": "; ".join(ways) + "; then resume from a checkpoint before that step, or start over"}


def _target(key: str, limit: float, above: bool, label: str):
    def check(s: dict) -> dict | None:
        v = s.get(key)
        if v is None or (v > limit if above else v < limit):
            return None
        over = "over the profiled steps" + _on(s) if s.get("source") == "trace" else "mean over the steady steps"
        return {"severity": "info", "gain": None,
                "evidence": f"{s.get(key + '_label') or label} {v:.0f}% ({over}; target "
                            f"{'>' if above else '<'} {limit:.0f}%)"}
    return check


_TABLE: list[Rule] = [
    Rule("loss_diverged", "the loss became nan or inf (training diverged)", "a step record's loss is nan, inf or "
         "null (the trainer's divergence check stops the run there, before summary.json), or summary.json's "
         "final_loss is not finite", "updates too large for the model: learning rate too high or not warmed up, "
         "gradients not clipped, fp16 overflow", "lower optimizer.lr; raise schedule.warmup_steps; "
         "train.grad_clip=1.0; precision.dtype=bf16 instead of fp16", _loss_diverged,
         not_from={"trace": "a profiler trace holds no loss values"}),
    Rule("data_bound", "steps wait for batches", f"data phase (trace: DataLoader time) > {_pct(DATA_WARN)} of step "
         f"time (critical > {_pct(DATA_CRIT)}); IO- vs decode-bound from the process CPU during the wait "
         f"(< {IO_CPU_RATIO} of the CPU the process gets: IO); trace: num_workers=0 from the DataLoader iterator",
         "slow storage (IO) or CPU decoding in the training process",
         "data.loader=hybrid, prefetch depth/io_threads, data.cache.dir; more workers (DataLoader num_workers, "
         "pin_memory); pre-tokenize", _data_bound),
    Rule("comm_bound", "ranks wait on collectives", f"exposed comm phase (trace: communication kernels not "
         f"overlapped by compute, waits for a straggler left out) > {_pct(COMM_WARN)} of step time on the rank that "
         f"waits most (critical > {_pct(COMM_CRIT)})", "collectives not overlapped with backward; slow links",
         "parallelism.compression.type=bf16/powersgd; larger global batch; fsdp_reduce_dtype=bf16; DDP bucket_cap_mb, "
         "FSDP prefetch", _comm_bound),
    *(Rule(**r) for r in RUNTIME_RULES),  # trainperf/monitor/rules_runtime.py
    Rule("launch_bound", "GPU idle between small kernels (host-bound)", f"NVML kernel-busy (trace: GPU utilization) "
         f"< {LAUNCH_BUSY_PCT:.0f}% with data + comm < 15% of step time", "Python/launch overhead, many small kernels",
         "compile.enabled=true (mode reduce-overhead: CUDA graphs); larger micro-batch", _launch_bound),
    *(Rule(**r) for r in TRACE_RULES),  # trainperf/monitor/rules_trace.py
    Rule("memory_bound", "memory left unused, device under-fed", f"peak allocated < {_pct(MEMORY_USED_FRAC)} of "
         "device memory and MFU < 40%", "batch too small for the memory", "raise train.micro_batch; "
         "drop activation checkpointing", _memory_bound),
    Rule("low_mfu", "far below the device's peak", f"MFU < {_pct(LOW_MFU_CATALOG)} of the catalog dense peak "
         "(GPU only: on CPU, MFU against a measured matmul peak is reported, not judged)", "fp32, eager small kernels, "
         "small model or batch", "precision.dtype=bf16; compile.enabled=true; optimizer.type=fused_adam", _low_mfu),
    Rule("gpu_util_below_target", "GPU kernel-busy below the founding target",
         f"NVML kernel-busy (trace: GPU utilization) < {TARGET_GPU_UTIL:.0f}%", "the GPU waits: see data/comm/launch "
         "findings", "fix the bottleneck named by the other findings",
         _target("gpu_kernel_busy_pct", TARGET_GPU_UTIL, True, "NVML kernel-busy utilization")),
    Rule("sm_efficiency_below_target", "SMs idle while kernels run", f"SM activity (NVML GPM / DCGM; trace: "
         f"estimated SM efficiency) < {TARGET_SM_EFF:.0f}%", "kernels too small to fill the SMs",
         "raise train.micro_batch; compile.enabled=true", _target("gpu_sm_active_pct", TARGET_SM_EFF, True,
                                                                 "SM activity (GPM)")),
    Rule("mem_copy_above_target", "device memory busy copying", f"NVML memory-copy utilization > "
         f"{TARGET_MEMCOPY:.0f}%", "memory-bound kernels (elementwise, fp32, unfused)",
         "precision.dtype=bf16; compile.enabled=true (fusion); optimizer.type=fused_adam",
         _target("gpu_mem_copy_util_pct", TARGET_MEMCOPY, False, "NVML memory-copy utilization")),
    Rule(**XLA_RECOMPILE_RULE),  # trainperf/monitor/xla.py
]
RULES: list[Rule] = [replace(r, not_from={**r.not_from, "trace": NOT_FROM_TRACE[r.id]}) if r.id in NOT_FROM_TRACE
                     else r for r in _TABLE]


GPU_ONLY_TRACE_RULES = {"fp32_on_tensor_cores", "pageable_copies", "host_syncs", "low_occupancy", "launch_bound",
                        "gpu_util_below_target", "sm_efficiency_below_target", "mem_copy_above_target"}
"""Rules that judge GPU work: on a trace with no GPU events they are listed as not measured, saying so."""


def apply_rules(ev: dict, rules: list[Rule] | None = None) -> tuple[list[dict], list[dict]]:
    """Run the rule table over one evidence dict: (findings, not measured [{"id", "reason"}]). A rule that
    cannot be judged from ``ev["source"]`` (``Rule.not_from``) or whose check says ``unmeasured`` is listed
    as not measured with the reason."""
    findings, not_measured = [], []
    src = ev.get("source", "run")
    for rule in RULES if rules is None else rules:
        if src in rule.not_from:
            not_measured.append({"id": rule.id, "reason": rule.not_from[src]})
            continue
        if ev.get("cpu_only") and rule.id in GPU_ONLY_TRACE_RULES:
            not_measured.append({"id": rule.id, "reason": "a CPU-only trace (no GPU events): the rule is about GPU work"})
            continue
        got = rule.check(ev)
        if got is None:
            continue
        if "unmeasured" in got:
            not_measured.append({"id": rule.id, "reason": got["unmeasured"]})
            continue
        f = {"id": rule.id, "severity": got.pop("severity"), "title": rule.symptom,
             "evidence": got.pop("evidence"), "cause": got.pop("cause", rule.cause), "fix": got.pop("fix", rule.fix),
             "gain": got.pop("gain", None)}
        f.update(got)
        findings.append(f)
    findings.sort(key=lambda f: (SEVERITY_ORDER[f["severity"]], -fraction(f.get("gain"))))
    return findings, not_measured


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


def _missing(run: dict, s: dict) -> list[str]:
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
    (:func:`trainperf.monitor.screen.screen_run`, the rule compare uses); the notes are ``run["data_notes"]``."""
    run = load_run(run_dir)
    screen_run(run)
    return run


def diagnose(run_dir: str | Path) -> dict[str, Any]:
    return diagnose_run(load_screened(run_dir))


RUN_NOTE_KEYS = ("raised", "tokens")
"""summary.json notes diagnose repeats: the run ended on an exception (closed by the caller), no tokens counted."""


def _run_notes(run: dict) -> list[str]:
    """summary.json's notes that say how the run ended, and the fail-fast reports of ranks that stopped
    (failures.jsonl: a rank that died, hung or raised ended the job; each rank's report, earliest first)."""
    out = []
    for f in sorted(run.get("failures") or [], key=lambda f: f.get("time") or 0):
        out.append(f"failure: {f['report'].removeprefix('trainperf: ')}")
    notes = (run.get("summary") or {}).get("notes")
    if isinstance(notes, dict):
        out += [f"{k}: {notes[k]}" for k in RUN_NOTE_KEYS if isinstance(notes.get(k), str)]
    return out


def diagnose_run(run: dict) -> dict[str, Any]:
    """The diagnosis of a run already loaded by :func:`load_run` (its metrics; the profile/ traces are
    read by :func:`trainperf.monitor.engine.diagnose_path`)."""
    s = compute_summary(run)
    findings, not_measured = apply_rules(s)
    missing = _missing(run, s)
    out = {"run_dir": str(run["dir"]), "crashed": run["crashed"], "findings": findings, "summary": s,
           "missing": missing, "not_measured": [*not_measured, *({"id": None, "reason": m} for m in missing)],
           "data_notes": list(run.get("data_notes") or []),
           "run_notes": _run_notes(run)}
    if not any(run["ranks"].values()):  # ended (killed) before its first whole step record: say what it left
        out["known"] = known_state(run)
        if run.get("screened", {}).get(0, (0, {}))[0]:  # records exist, but every one is malformed (NaN, ...)
            out["known"]["malformed"] = no_steps(run["dir"], run)
    return out


def known_lines(result: dict) -> list[str]:
    """The text for a run without a step record: that, and what is known (config, checkpoints, samples)."""
    k = result.get("known")
    if k is None:
        return []
    c = k.get("config") or {}
    if k.get("malformed"):
        lines = [f"  {k['malformed']}. No step figures exist. What it left:"]
    elif k.get("finished") and not k.get("summary_steps"):  # it ended normally, having taken no step
        lines = ["  the run finished (summary.json) without a step record in metrics.jsonl: it took no step, so no "
                 "step figures exist. What it left:"]
    elif k.get("finished"):
        lines = [f"  metrics.jsonl holds no step record although summary.json counts {k['summary_steps']} steps: the "
                 "log was lost or emptied, so no step figures exist. What it left:"]
    else:
        lines = ["  no step record reached metrics.jsonl: the run ended (was killed?) before its first record was "
                 "written, so no step figures exist. What it left:"]
    lines.append("    config: " + (", ".join(f"{n} {v}" for n, v in c.items() if v is not None) if c else "none (no "
                 "config.yaml)"))
    ck = k["checkpoint_steps"]
    lines.append(f"    checkpoints: steps {', '.join(map(str, ck))}" if ck else "    checkpoints: none complete")
    if k["samples"]:
        span = f" over {k['samples_span_s']:.1f} s" if k.get("samples_span_s") is not None else ""
        step = f"; the last one saw step {k['last_sampled_step']}" if k.get("last_sampled_step") is not None else ""
        lines.append(f"    device samples: {k['samples']}{span}{step} (samples.jsonl)")
    else:
        lines.append("    device samples: none")
    return lines


# ---------------------------------------------------------------------- output
def format_findings(result: dict) -> str:
    s = result["summary"]
    lines = ["", "== trainperf diagnosis =="]
    if result.get("known") is not None:
        lines.extend(known_lines(result))
    elif result.get("crashed"):
        lines.append("  (no summary.json: the run did not finish; figures from metrics.jsonl)")
    lines += [f"  note: {n}" for n in result.get("run_notes") or []]
    fr = s.get("phase_fractions") or {}
    if fr:
        lines.append("  time by phase: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in fr.items())
                     + f" (over {s['steps_used']} steps after warm-up)")
    if s.get("compile_s"):
        lines.append(f"  compilation: {s['compile_s']:.1f} s (phase '{COMPILE_PHASE}', left out of the "
                     "steady-state fractions)")
    if s.get("mfu") is not None:
        hfu = f", HFU {100 * s['hfu']:.1f}%" if s.get("hfu") is not None else ""
        lines.append(f"  MFU {100 * s['mfu']:.1f}%{hfu} against {s.get('peak_source') or 'the recorded peak'}")
        if s.get("mfu_convention"):
            lines.append(f"  MFU convention: {s['mfu_convention']}")
    lines += [f"  note: {n}" for n in result.get("data_notes", [])]
    if not result["findings"]:
        lines.append("  no findings: no rule fired (see `trainperf diagnose RUN_DIR --json` for the figures)")
    for f in result["findings"]:
        lines.append(f"  [{f['severity']}] {f['id']}: {f['evidence']}")
        lines.append(f"      cause: {f['cause']}")
        lines.append(f"      try:   {f['fix']}")
        if f.get("gain"):
            lines.append(f"      gain:  {f['gain']['text']}")
    for m in result.get("missing", []):
        lines.append(f"  not measured: {m}")
    return "\n".join(lines)


def rules_markdown() -> str:
    """The troubleshooting table (README), generated from RULES."""
    rows = ["| id | symptom | fires when | judged from | likely cause | what to try |", "|---|---|---|---|---|---|"]
    for r in RULES:
        src = ", ".join(x for x in ("run", "trace") if x not in r.not_from)
        rows.append(f"| `{r.id}` | {r.symptom} | {r.condition} | {src} | {r.cause} | {r.fix} |")
    return "\n".join(rows)

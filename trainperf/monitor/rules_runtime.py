"""Diagnosis rules about the run's environment rather than its model: a straggling rank (by its own
compute clock), a host that gives the process less CPU than it asks for or steps whose times
spread far beyond their median, and first-step compilation. Each ``check(s)`` takes the figures
of :func:`trainperf.monitor.diagnose.compute_summary` and returns a finding's fields or None.
"""

from __future__ import annotations

import math
import statistics

from trainperf.monitor.gain import gain, step_gain
from trainperf.monitor.rules_trace import straggler_by_trace

STRAGGLER_RATIO = 1.15  # a rank's compute over the median of the others' (median over the log windows)
STRAGGLER_CRIT = 1.5
STRAGGLER_MIN_GAP_S = 0.001  # and at least this much slower per step (clock resolution, tiny steps)
COMPILE_PHASE = "compile"  # booked apart by the trainer; never in the steady-state fractions
COMPILE_INFO_FRAC = 0.10  # compile_time fires when compilation is more than this share of the training time
HOST_MIN_CORES = 0.75  # a CPU run's compute got less than this many cores per wall second: contended
HOST_MIN_SHARE, MACHINE_BUSY_PCT = 0.6, 90.0  # or < 60% of its threads while the machine was >= 90% busy
HOST_CRIT_SHARE = 0.4
SPREAD_WARN, SPREAD_CRIT, SPREAD_MIN_STEPS = 1.5, 3.0, 10  # p90 / median step time, over >= 10 steady steps

CLOCKS = {"thread_cpu": "thread CPU time of forward+backward, no collective waits",
          "cuda_events": "CUDA events on the compute stream, no collective waits",
          "wall_to_last_grad": "wall time to this rank's last gradient, before it waits for the all-reduce"}


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def rank_compute_windows(recs: list[dict]) -> dict | None:
    """The trainer's per-rank compute clock: each log flush on rank 0 writes ``rank_compute_s``
    (mean compute seconds per step of every data-parallel rank over the window: forward+backward
    without collective waits) and ``rank_clock`` ("thread_cpu" or "cuda_events"). Returns
    {"clock", "windows": [[s per rank], ...] (one row per record that carries it: a window whose
    every record carries its list weighs by its steps), "n_windows"}, the first 10% of the rows (at
    least one of three or more) left out as warm-up; None when the run has no such records."""
    rows: list[list[float | None]] = []
    cpu_rows: list[list[float | None] | None] = []
    clock = None
    for r in recs:
        v = r.get("rank_compute_s")
        if isinstance(v, list) and len(v) >= 2:
            rows.append([x if (x or 0) > 0 else None for x in map(_num, v)])
            c = r.get("rank_cpu_s")  # CPU seconds of the same work: far below the clock = waiting for a core
            cpu_rows.append([_num(x) for x in c] if isinstance(c, list) and len(c) == len(v) else None)
            clock = r.get("rank_clock", clock)
    if not rows:
        return None
    if len(rows) >= 3:
        skip = max(1, math.ceil(0.1 * len(rows)))
        rows, cpu_rows = rows[skip:], cpu_rows[skip:]
    n_windows = sum(1 for i, row in enumerate(rows) if i == 0 or row != rows[i - 1])
    return {"clock": clock, "windows": rows, "n_windows": n_windows, "cpu_windows": cpu_rows}


def _vs_others(row: list[float | None], rank: int) -> float | None:
    others = [v for i, v in enumerate(row) if i != rank and v is not None]
    if row[rank] is None or not others:
        return None
    return row[rank] / statistics.median(others)


def _straggler_by_clock(rc: dict) -> dict | None:
    windows = rc["windows"]
    n = max(len(w) for w in windows)
    ratios = {r: [x for x in (_vs_others(w, r) for w in windows if len(w) > r) if x is not None] for r in range(n)}
    med = {r: statistics.median(v) for r, v in ratios.items() if v}
    if not med:
        return None
    worst = max(med, key=med.get)
    mine = [w[worst] for w in windows if len(w) > worst and w[worst] is not None]
    others = [statistics.median([v for i, v in enumerate(w) if i != worst and v is not None])
              for w in windows if len(w) > worst and any(v is not None for i, v in enumerate(w) if i != worst)]
    slow_s, base_s = statistics.median(mine), statistics.median(others)
    ratio = med[worst]
    if ratio <= STRAGGLER_RATIO or slow_s - base_s < STRAGGLER_MIN_GAP_S:
        return None
    above = sum(1 for x in ratios[worst] if x > STRAGGLER_RATIO)
    clock = rc.get("clock")
    return {"severity": "critical" if ratio > STRAGGLER_CRIT else "warning", "rank": worst, "ratio": ratio,
            "clock": clock, "_excess_s": slow_s - base_s,
            "evidence": f"rank {worst} computes {slow_s * 1000:.0f} ms per step against {base_s * 1000:.0f} ms "
                        f"for the median of the other ranks: {ratio:.2f}x (median over {rc['n_windows']} log windows, "
                        f"above {STRAGGLER_RATIO}x in {pct(above / len(ratios[worst]))} of the steps they cover); "
                        f"clock: {CLOCKS.get(clock, clock or '?')}" + _cpu_evidence(rc, worst, slow_s)}


def _cpu_evidence(rc: dict, rank: int, slow_s: float) -> str:
    """Where the CPU clock was recorded too: a rank whose CPU time is far below its compute clock waited
    for a core (another process shares it), not for a slower device."""
    if rc.get("clock") != "wall_to_last_grad":  # a CPU clock already, or GPU work the host CPU does not see
        return ""
    cpu = [w[rank] for w in rc.get("cpu_windows") or [] if w and len(w) > rank and w[rank]]
    if not cpu or not slow_s:
        return ""
    share = statistics.median(cpu) / slow_s
    if share >= 0.8:
        return f"; its CPU time is {pct(share)} of that: it computes slower (a slower or throttled device)"
    return (f"; its CPU time is only {pct(share)} of that: it waited for a core (another process shares its CPU: "
            "pin the job to free cores)")


def _straggler_by_files(s: dict) -> dict | None:
    ranks = {r: v for r, v in s["ranks"].items() if v.get("compute_s")}
    if len(ranks) < 2:
        return None
    worst = max(ranks, key=lambda r: ranks[r]["compute_s"])
    base = statistics.median(v["compute_s"] for r, v in ranks.items() if r != worst)
    slow = ranks[worst]["compute_s"]
    ratio = slow / base if base else 0.0
    if ratio <= STRAGGLER_RATIO or slow - base < STRAGGLER_MIN_GAP_S:
        return None
    return {"severity": "critical" if ratio > STRAGGLER_CRIT else "warning", "rank": worst, "ratio": ratio,
            "clock": "wall", "_excess_s": slow - base,
            "evidence": f"rank {worst} computes {slow * 1000:.0f} ms per step, {ratio:.2f}x the median "
                        f"{base * 1000:.0f} ms of the other ranks (threshold {STRAGGLER_RATIO}x; wall clock of "
                        "each rank's non-comm phases from its own metrics file: a wait hidden inside an "
                        "overlapped all-reduce counts as compute there)"}


def straggler(s: dict) -> dict | None:
    """By the trainer's per-rank compute clock where recorded, else by each rank's own file; from traces,
    by each rank's GPU compute (:func:`trainperf.monitor.rules_trace.straggler_by_trace`)."""
    if s.get("source") == "trace":
        return straggler_by_trace(s)
    got = _straggler_by_clock(s["rank_compute"]) if s.get("rank_compute") else _straggler_by_files(s)
    if got is None:
        return None
    r = got["rank"]
    got["gain"] = step_gain(s.get("step_time_s"), got.pop("_excess_s", None),
                            f"rank {r} computed as fast as the median rank (every rank waits for it)")
    if s.get("balance_enabled"):  # already on: suggesting it again was the fix users got
        got["fix"] = (f"the balancer is on (parallelism.balance.enabled=true) and rank {r} is still slower: check "
                      f"rank {r}'s host load, clocks and temperature (samples.jsonl); a lower "
                      "parallelism.balance.min_share lets it move more of the batch off that rank")
    else:
        got["fix"] = (f"parallelism.balance.enabled=true (moves micro-batches off rank {r}); check rank {r}'s host "
                      "load, clocks and temperature (samples.jsonl)")
    return got


def host_contention(s: dict) -> dict | None:
    """The process got much less CPU than its threads ask for, or step times spread far beyond
    their median: both say the measurements are taken on a shared or unsteady host."""
    ev, crit = [], False
    cores, threads = s.get("cpu_cores_got"), s.get("threads") or 1
    machine = s.get("cpu_pct")
    starved = cores is not None and (cores < HOST_MIN_CORES or (
        cores / threads < HOST_MIN_SHARE and machine is not None and machine >= MACHINE_BUSY_PCT))
    if starved:
        crit = cores / threads < HOST_CRIT_SHARE
        ev.append(f"the training process got {cores:.2f} cores of CPU time per wall second in forward/backward/"
                  f"optimizer ({pct(cores / threads)} of the {threads} thread(s) it runs, run.threads; fires below "
                  f"{HOST_MIN_CORES} core, or below {pct(HOST_MIN_SHARE)} while the machine is >= "
                  f"{MACHINE_BUSY_PCT:.0f}% busy)")
    med, p90, n = s.get("step_time_s"), s.get("step_time_p90_s"), s.get("steps_used") or 0
    spread = p90 / med if (med and p90 and n >= SPREAD_MIN_STEPS) else None
    if spread is not None and spread > SPREAD_WARN:
        crit = crit or spread > SPREAD_CRIT
        ev.append(f"step times spread far beyond their median: p90 {p90:.3g} s = {spread:.2f}x the median "
                  f"{med:.3g} s (threshold {SPREAD_WARN}x), from {s['step_time_min_s']:.3g} to "
                  f"{s['step_time_max_s']:.3g} s over {n} steady steps")
    if not ev:
        return None
    if machine is not None:
        proc = s.get("proc_cpu_pct")
        ev.append(f"machine CPU {machine:.0f}% busy on average" +
                  (f", this process and its workers {proc:.0f}% of one core" if proc is not None else "") +
                  " (samples.jsonl)")
    return {"severity": "critical" if crit else "warning", "evidence": "; ".join(ev),
            "cpu_cores_got": cores, "step_time_spread": spread}


def compile_time(s: dict) -> dict | None:
    c, total = s.get("compile_s") or 0.0, s.get("train_time_s")
    if c <= 0 or not total:
        return None
    frac = c / total
    if frac <= COMPILE_INFO_FRAC:
        return None
    return {"severity": "info", "compile_s": c,
            "gain": gain(total, c, "later runs reused the compiled kernels (a persistent cache)",
                         metric="training time", unit="s", scale=1.0, verb="the training time would shrink"),
            "evidence": f"compilation took {c:.1f} s, {pct(frac)} of the {total:.1f} s of training (booked as the "
                        f"phase '{COMPILE_PHASE}', not as data; left out of the steady-state fractions and figures)"}


def oom_recovered(s: dict) -> dict | None:
    events = s.get("oom_events") or []
    if not events:
        return None
    first, last = events[0], events[-1]
    return {"severity": "warning", "oom_events": events,
            "evidence": f"out of memory at step {first.get('step')} with micro-batch {first.get('old_micro_batch')}: "
                        f"train.on_oom halved it to {last.get('new_micro_batch')} (accumulation "
                        f"{last.get('accumulation')}, global batch unchanged) in {len(events)} step(s); reason: "
                        f"{first.get('reason')}"}


RUNTIME_RULES = [
    dict(id="straggler", symptom="one rank is slower than the others",
         condition=f"a rank's own compute (the trainer's rank_compute_s: thread CPU time on CPU, CUDA events on GPU) "
                   f"> {STRAGGLER_RATIO}x the median of the other ranks', median over the log windows (critical > "
                   f"{STRAGGLER_CRIT}x); without rank_compute_s, each rank file's non-comm wall time; traces: each "
                   "rank's GPU time in non-communication kernels per step (never wall time)",
         cause="one rank is slower (throttled clocks, a shared or slower device, a busy host) and every collective "
               "waits for it",
         fix="parallelism.balance.enabled=true; inspect that rank's clocks and host", check=straggler,
         scope="job"),
    dict(id="host_contention", symptom="the host is shared or unsteady: less CPU than asked, erratic step times",
         condition=f"CPU runs: compute got < {HOST_MIN_CORES} core per wall second, or < {pct(HOST_MIN_SHARE)} of "
                   f"run.threads while the machine is >= {MACHINE_BUSY_PCT:.0f}% busy; any run: p90 step time > "
                   f"{SPREAD_WARN}x the median over >= {SPREAD_MIN_STEPS} steady steps (critical > {SPREAD_CRIT}x, "
                   f"or < {pct(HOST_CRIT_SHARE)} of the threads)",
         cause="other processes share the cores (or the host throttles), so figures measured here are slow and noisy",
         fix="run on a quiet machine or pin the job (taskset / cgroup cpusets) to free cores; set run.threads to "
             "the cores it really gets; look at samples.jsonl (cpu_pct, proc_cpu_pct) and `top`",
         check=host_contention),
    dict(id="oom_recovered", symptom="the run ran out of memory and went on with a smaller micro-batch",
         condition="metrics.jsonl records oom/* (train.on_oom=halve_micro_batch acted)",
         cause="the micro-batch's activations did not fit on the device",
         fix="start with the micro-batch the run settled on (train.micro_batch), or checkpoint activations "
             "(memory.checkpointing) to keep the larger one; `trainperf memory CONFIG` shows the estimate",
         check=oom_recovered),
    dict(id="compile_time", symptom="compilation is a large share of the run",
         condition=f"the '{COMPILE_PHASE}' phase > {pct(COMPILE_INFO_FRAC)} of the training time",
         cause="torch.compile compiles on the first step (and on each recompilation); short runs do not amortize it",
         fix="longer runs amortize it; keep TORCHINDUCTOR_CACHE_DIR on a persistent disk so later runs reuse the "
             "kernels; compile.enabled=false for short experiments", check=compile_time),
]

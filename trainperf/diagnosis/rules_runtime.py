"""The checks of the rules about the run's environment rather than its model: a straggling rank (by its own
compute clock, each rank's file, or each rank's GPU compute in traces), a host that gives the process less
CPU than it asks for or steps whose times spread far beyond their median, first-step compilation, and an
out-of-memory the trainer recovered from. Each check takes one
:class:`~trainperf.diagnosis.evidence.Evidence` and returns a finding's fields or None; the rules are
entries of :data:`trainperf.diagnosis.rules.RULES`.
"""

from __future__ import annotations


from trainperf.diagnosis.evidence import Evidence, median
from trainperf.diagnosis.gain import gain, step_gain
from trainperf.diagnosis.run_evidence import COMPILE_PHASE
from trainperf.diagnosis.rules_trace import straggler_by_trace

STRAGGLER_RATIO = 1.15  # a rank's compute over the median of the others' (median over the log windows)
STRAGGLER_CRIT = 1.5
STRAGGLER_MIN_GAP_S = 0.001  # and at least this much slower per step (clock resolution, tiny steps)
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


def _vs_others(row: list[float | None], rank: int) -> float | None:
    others = [v for i, v in enumerate(row) if i != rank and v is not None]
    if row[rank] is None or not others:
        return None
    return row[rank] / median(others)


def _straggler_by_clock(rc: dict) -> dict | None:
    windows = rc["windows"]
    n = max(len(w) for w in windows)
    ratios = {r: [x for x in (_vs_others(w, r) for w in windows if len(w) > r) if x is not None] for r in range(n)}
    med = {r: median(v) for r, v in ratios.items() if v}
    if not med:
        return None
    worst = max(med, key=med.get)
    mine = [w[worst] for w in windows if len(w) > worst and w[worst] is not None]
    others = [median([v for i, v in enumerate(w) if i != worst and v is not None])
              for w in windows if len(w) > worst and any(v is not None for i, v in enumerate(w) if i != worst)]
    slow_s, base_s = median(mine), median(others)
    ratio = med[worst]
    if ratio <= STRAGGLER_RATIO or slow_s - base_s < STRAGGLER_MIN_GAP_S:
        return None
    above = sum(1 for x in ratios[worst] if x > STRAGGLER_RATIO)
    clock = rc.get("clock")
    got = {"severity": "critical" if ratio > STRAGGLER_CRIT else "warning", "rank": worst, "ratio": ratio,
           "clock": clock, "_excess_s": slow_s - base_s,
           "evidence": f"rank {worst} computes {slow_s * 1000:.0f} ms per step against {base_s * 1000:.0f} ms "
                       f"for the median of the other ranks: {ratio:.2f}x (median over {rc['n_windows']} log windows, "
                       f"above {STRAGGLER_RATIO}x in {pct(above / len(ratios[worst]))} of the steps they cover); "
                       f"clock: {CLOCKS.get(clock, clock or '?')}" + _cpu_evidence(rc, worst, slow_s)}
    got.update(_where(rc.get("groups"), worst, n))
    return got


def _where(groups: dict | None, rank: int, world: int) -> dict:
    """Under tensor / pipeline parallelism: the group that waits for the slow rank (its tensor-parallel
    group, its pipeline stage), as finding fields and the words the evidence, cause and fix add."""
    if not groups:
        return {}
    tensor = next((g for g in groups.get("tensor") or [] if rank in g), None)
    pipe = groups.get("pipeline") or []
    stage = next((i for i, g in enumerate(pipe) if rank in g), None)
    tp, pp = (len(tensor) if tensor else 1), (len(pipe) or 1)
    out: dict = {"_dp": max(1, world // (tp * pp))}
    said, why = [], []
    if tensor and len(tensor) > 1:
        out["tensor_group"] = tensor
        said.append(f"rank {rank} is in tensor-parallel group {tensor}: the group's collectives inside every layer "
                    f"make each of its ranks wait for rank {rank}, so by step time and collective waits its ranks "
                    "look alike; only their own compute tells them apart")
        why.append(f"tensor-parallel group {tensor} runs every layer's collectives at rank {rank}'s pace")
    if stage is not None and pp > 1:
        held = (groups.get("stages") or [])[stage] if stage < len(groups.get("stages") or []) else [stage]
        name = f"pipeline stage {stage}" if held == [stage] else \
            f"pipeline rank {stage} (stages {', '.join(map(str, held))})"
        out.update(stage=stage, stages=held, stage_ranks=pipe[stage])
        said.append(f"rank {rank} is {name}, ranks {pipe[stage]}: a slow stage sets the pace of the whole pipeline, "
                    "and the other stages idle in a longer bubble (their sends and receives wait for it)")
        why.append(f"{name} computes slower than the other stages: the schedule runs at the pace of its slowest "
                   "stage, and the others idle in the bubble")
    if said:
        out["_said"], out["_why"] = said, why
    return out


def _cpu_evidence(rc: dict, rank: int, slow_s: float) -> str:
    """Where the CPU clock was recorded too: a rank whose CPU time is far below its compute clock waited
    for a core (another process shares it), not for a slower device."""
    if rc.get("clock") != "wall_to_last_grad":  # a CPU clock already, or GPU work the host CPU does not see
        return ""
    cpu = [w[rank] for w in rc.get("cpu_windows") or [] if w and len(w) > rank and w[rank]]
    if not cpu or not slow_s:
        return ""
    share = median(cpu) / slow_s
    if share >= 0.8:
        return f"; its CPU time is {pct(share)} of that: it computes slower (a slower or throttled device)"
    return (f"; its CPU time is only {pct(share)} of that: it waited for a core (another process shares its CPU: "
            "pin the job to free cores)")


def _straggler_by_files(ev: Evidence) -> dict | None:
    ranks = {r: v for r, v in ev.ranks.items() if v.get("compute_s")}
    if len(ranks) < 2:
        return None
    worst = max(ranks, key=lambda r: ranks[r]["compute_s"])
    base = median(v["compute_s"] for r, v in ranks.items() if r != worst)
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


def straggler(ev: Evidence) -> dict | None:
    """By the figures across the ranks of profiler traces where there are some (each rank's GPU compute:
    :func:`trainperf.diagnosis.rules_trace.straggler_by_trace`), else by the trainer's per-rank compute
    clock where recorded, else by each rank's own file."""
    if ev.trace_ranks is not None:
        return straggler_by_trace(ev)
    got = _straggler_by_clock(ev.rank_compute) if ev.rank_compute else _straggler_by_files(ev)
    if got is None:
        return None
    r = got["rank"]
    got["gain"] = step_gain(ev.step_time_s, got.pop("_excess_s", None),
                            f"rank {r} computed as fast as the median rank (every rank waits for it)")
    dp, said, why = got.pop("_dp", None), got.pop("_said", []), got.pop("_why", [])
    if said:  # tensor / pipeline parallelism: the group or stage that waits for it
        got["evidence"] += "; " + "; ".join(said)
        got["cause"] = "; ".join(why)
    if "stage" in got and dp == 1:
        got["fix"] = (f"check rank {r}'s host load, clocks and temperature (samples.jsonl): the stages are split "
                      f"by estimated FLOPs, so pipeline stage {got['stage']} computing slower on equal devices points at "
                      "its host or device (parallelism.balance moves batch shares between data-parallel ranks, and "
                      "this layout has one)")
    elif dp == 1:  # no data-parallel ranks: no batch share to move
        got["fix"] = (f"check rank {r}'s host load, clocks and temperature (samples.jsonl); every rank of its "
                      "tensor-parallel group runs at its pace (parallelism.balance moves batch shares between "
                      "data-parallel ranks, and this layout has one)")
    elif ev.balance_enabled:  # already on: suggesting it again was the fix users got
        got["fix"] = (f"the balancer is on (parallelism.balance.enabled=true) and rank {r} is still slower: check "
                      f"rank {r}'s host load, clocks and temperature (samples.jsonl); a lower "
                      "parallelism.balance.min_share lets it move more of the batch off that rank")
    else:
        off = f"the data-parallel rank of rank {r} and its group" if said else f"rank {r}"
        got["fix"] = (f"parallelism.balance.enabled=true (moves micro-batches off {off}); check rank {r}'s host "
                      "load, clocks and temperature (samples.jsonl)")
    return got


def host_contention(ev: Evidence) -> dict | None:
    """The process got much less CPU than its threads ask for, or step times spread far beyond
    their median: both say the measurements are taken on a shared or unsteady host."""
    said, crit = [], False
    cores, threads = ev.cpu_cores_got, ev.threads or 1
    machine = ev.cpu_pct
    starved = cores is not None and (cores < HOST_MIN_CORES or (
        cores / threads < HOST_MIN_SHARE and machine is not None and machine >= MACHINE_BUSY_PCT))
    if starved:
        crit = cores / threads < HOST_CRIT_SHARE
        said.append(f"the training process got {cores:.2f} cores of CPU time per wall second in forward/backward/"
                    f"optimizer ({pct(cores / threads)} of the {threads} thread(s) it runs, run.threads; fires below "
                    f"{HOST_MIN_CORES} core, or below {pct(HOST_MIN_SHARE)} while the machine is >= "
                    f"{MACHINE_BUSY_PCT:.0f}% busy)")
    med, p90, n = ev.step_time_s, ev.step_time_p90_s, ev.steps_used or 0
    spread = p90 / med if (med and p90 and n >= SPREAD_MIN_STEPS) else None
    if spread is not None and spread > SPREAD_WARN:
        crit = crit or spread > SPREAD_CRIT
        said.append(f"step times spread far beyond their median: p90 {p90:.3g} s = {spread:.2f}x the median "
                    f"{med:.3g} s (threshold {SPREAD_WARN}x), from {ev.step_time_min_s:.3g} to "
                    f"{ev.step_time_max_s:.3g} s over {n} steady steps")
    if not said:
        return None
    if machine is not None:
        proc = ev.proc_cpu_pct
        said.append(f"machine CPU {machine:.0f}% busy on average" +
                    (f", this process and its workers {proc:.0f}% of one core" if proc is not None else "") +
                    " (samples.jsonl)")
    return {"severity": "critical" if crit else "warning", "evidence": "; ".join(said),
            "cpu_cores_got": cores, "step_time_spread": spread}


def compile_time(ev: Evidence) -> dict | None:
    c, total = ev.compile_s or 0.0, ev.train_time_s
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


def oom_recovered(ev: Evidence) -> dict | None:
    events = ev.oom_events or []
    if not events:
        return None
    first, last = events[0], events[-1]
    return {"severity": "warning", "oom_events": events,
            "evidence": f"out of memory at step {first.get('step')} with micro-batch {first.get('old_micro_batch')}: "
                        f"train.on_oom halved it to {last.get('new_micro_batch')} (accumulation "
                        f"{last.get('accumulation')}, global batch unchanged) in {len(events)} step(s); reason: "
                        f"{first.get('reason')}"}


def balancer(ev: Evidence) -> dict | None:
    """What the load balancer did (parallelism.balance): the changes of the ranks' speeds it saw, the moves it
    tried and their verdicts, in order (information: the straggler rule judges what is left)."""
    log = ev.balance_log or []
    if not log:
        return None
    shown = log if len(log) <= 8 else [*log[:3], f"... {len(log) - 6} more ...", *log[-3:]]
    return {"severity": "info", "balance_log": log, "evidence": "; ".join(shown)}


LATE_WARN, LATE_CRIT = 0.05, 0.20  # the wait a late rank costs the job, share of the step


def late_rank(ev: Evidence) -> dict | None:
    """The rank the others wait for at their collectives, charged with their waits, and what made it late
    (from the traces of every rank: clock offsets corrected, each collective split into the wait for the last
    arrival and the transfer; :mod:`trainperf.trace.blame`). A late rank whose cause is its own compute and
    that the straggler rule names (by compute) is left to that rule."""
    from trainperf.diagnosis.causes import cause as cause_of

    tr = ev.trace_ranks
    if tr is None:
        return None  # the run's own files: the straggler by compute clock speaks
    if tr.get("count", 1) < 2:
        return {"unmeasured": "one rank: who waits for whom needs the traces of two or more ranks"}
    late = [x for x in tr.get("late_arrivals") or [] if not (x.get("cause") == "compute" and
                                                            x.get("straggler_by_compute"))]
    step_s = ev.step_s or 0.0
    if not late or not step_s:
        return None
    top = late[0]
    delay_s = (top.get("delay_us_per_step") or 0.0) / 1e6
    share = delay_s / step_s
    if share < LATE_WARN:
        return None
    r, c = top["rank"], cause_of(top.get("cause"))
    causes = top.get("causes_us_per_step") or {}
    total = sum(causes.values())
    text = top.get("summary") or f"rank {r} arrives last at its collectives"
    if len(causes) > 1 and total > 0:  # the job's wait split as the late rank's causes are
        text += "; by cause: " + ", ".join(f"{cause_of(k).label} {v / total * delay_s * 1000:.2f} ms" for k, v in
                                           list(causes.items())[:4])
    text += (f"; {share:.0%} of the step (threshold {LATE_WARN:.0%}); the other ranks lose "
             f"{(top.get('wait_caused_us_per_step') or 0.0) / 1000:.2f} ms of GPU time per step between them")
    others = [x for x in late[1:] if (x.get("delay_us_per_step") or 0.0) / 1e6 >= LATE_WARN * step_s]
    if others:
        text += "; also late: " + ", ".join(f"rank {x['rank']} ({cause_of(x.get('cause')).label}, "
                                            f"{x['delay_us_per_step'] / 1000:.2f} ms per step)" for x in others[:3])
    if tr.get("partial"):
        text += " (among the ranks in these traces: the job's other ranks are not here)"
    return {"severity": "critical" if share > LATE_CRIT else "warning", "evidence": text, "rank": r,
            "late_cause": top.get("cause"), "wait_us_per_step": top.get("delay_us_per_step"),
            "cause": f"rank {r} arrives last because of {c.label}: {c.why}; every other rank waits for it inside "
                     "its collectives",
            "fix": f"on rank {r}: {c.fix(ev.fixes)}",
            "gain": step_gain(step_s, delay_s, f"rank {r} arrived with the others")}


__all__ = ["balancer", "compile_time", "host_contention", "late_rank", "oom_recovered", "straggler"]

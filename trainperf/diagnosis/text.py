"""The text of ``trainperf diagnose``: a run's figures and findings (:func:`format_findings`), and over traces
the per-rank figures, across ranks, findings and what is left (:func:`format_traces`)."""

from __future__ import annotations

from trainperf.diagnosis.rules_trace import MIN_GAIN
from trainperf.diagnosis.run_evidence import COMPILE_PHASE

BREAKDOWN = ("kernel", "communication", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")


def _p(v, digits: int = 0) -> str:
    return f"{v:.{digits}f}%" if isinstance(v, (int, float)) else "n/a"


def _ms(us) -> str:
    return f"{us / 1000:.1f} ms" if isinstance(us, (int, float)) else "n/a"


def _device(t: dict) -> str:
    d = t.get("device_info") or t.get("device")
    if isinstance(d, dict):
        return d.get("name") or (f"compute capability {d['compute_capability']}" if d.get("compute_capability")
                                 else "GPU")
    return str(d) if d else "CPU only"


IDLE_LABELS = {"allocator": "allocator", "sync": "syncs", "launch": "launches", "dataloader": "DataLoader",
               "optimizer": "optimizer step", "cpu_op": "host ops", "gc": "gc", "untraced": "untraced host",
               "gpu_wait": "queued work waiting"}


def where_the_step_went(t: dict, mine: dict | None = None) -> list[tuple[str, float]]:
    """One rank's step as (part, % of the step) summing to 100: the GPU's busy parts (communication split into
    the wait for a late rank and the rest, from the figures across ranks ``mine``), then its idle time by the
    host cause it is charged to (:mod:`trainperf.trace.attribution`). Empty without an attribution."""
    a = t.get("attribution") or {}
    pct, step = a.get("gpu_pct") or {}, a.get("step_us") or 0.0
    if not pct or not step:
        return []
    comm = pct.get("communication") or 0.0
    wait = min(comm, 100.0 * ((mine or {}).get("comm_wait_us_per_step") or 0.0) / step)
    parts = [("compute", pct.get("compute") or 0.0)]
    parts += [("waiting for other ranks", wait), ("communication", comm - wait)] if wait else \
        [("communication", comm)]
    parts += [("memcpy", pct.get("memcpy") or 0.0), ("memset", pct.get("memset") or 0.0)]
    causes = a.get("idle_causes") or []
    parts += [(f"idle: {IDLE_LABELS.get(c['cause'], c['cause'])}", 100.0 * c["us_per_step"] / step) for c in causes]
    rest = (pct.get("idle") or 0.0) - sum(100.0 * c["us_per_step"] / step for c in causes)
    if rest > 0.05:
        parts.append(("idle: other", rest))
    return parts


def step_line(t: dict, mine: dict | None = None) -> list[str]:
    parts = [(k, v) for k, v in where_the_step_went(t, mine) if v >= 0.05]
    if not parts:
        return []
    return ["    where the step went (critical path, 100%): " + ", ".join(f"{k} {v:.1f}%" for k, v in parts)]


def rank_lines(t: dict, mine: dict | None = None) -> list[str]:
    steps = t.get("steps")
    marked = steps and not str(t.get("steps_found") or "").startswith("none")  # else one step: the whole trace
    lines = [f"  rank {t.get('rank')}: {t.get('path')} ({_device(t)}; {steps if marked else 'no'} profiler step(s)"
             + ("" if marked else ": the whole trace as one step") + ")"]
    bd = t.get("step_breakdown_pct") or {}
    lines.append(f"    step {_ms(t.get('step_time_us'))}: " + ", ".join(f"{k} {_p(bd.get(k))}" for k in BREAKDOWN))
    lines.append(f"    GPU utilization {_p(t.get('gpu_utilization_pct'))}, est. SM efficiency "
                 f"{_p(t.get('sm_efficiency_pct'))}, est. achieved occupancy {_p(t.get('achieved_occupancy_pct'))}, "
                 f"tensor cores {_p(t.get('tensor_core_kernel_pct'))} of kernel time")
    lines += step_line(t, mine)
    tp, ip = t.get("temporal_pct") or {}, t.get("idle_pct") or {}
    if tp:
        lines.append(f"    temporal: compute {_p(tp.get('compute'))}, non-compute {_p(tp.get('non_compute'))}, idle "
                     f"{_p(tp.get('idle'))} (host_wait {_p(ip.get('host_wait'))}, kernel_wait "
                     f"{_p(ip.get('kernel_wait'))}, other {_p(ip.get('other'))}); comm/compute overlap "
                     f"{_p(t.get('comm_compute_overlap_pct'))}")
    top = t.get("top_kernels") or []
    if top:
        lines.append("    top kernels: " + "; ".join(
            f"{str(k.get('name'))[:48]} [{k.get('kind', k.get('group', '?'))}] {_ms(k.get('us', k.get('total_us')))}"
            for k in top[:3]))
    lines += [f"    note: {n}" for n in t.get("notes") or []]
    return lines


SHOWN_RANKS = 8
"""With more ranks than this, the per-rank lines are those that matter (late arrivals, the straggler, the
slowest and the first): the rest is summarised; --json and the HTML report have every rank."""


def _rank_line(p: dict, partial: bool) -> str:
    line = (f"    rank {p['rank']}: step {_ms(p.get('step_time_us'))}, compute {_ms(p.get('compute_us_per_step'))}, "
            f"communication {_ms(p.get('comm_us_per_step'))}")
    if partial:
        line += f" (includes waiting for ranks not in these traces: {_ms(p.get('comm_incl_absent_wait_us_per_step'))})"
    elif p.get("transfer_us_per_step") is not None:
        line += (f": waiting {_ms(p.get('comm_wait_us_per_step'))}, transfer {_ms(p.get('transfer_us_per_step'))} "
                 "per step")
    else:
        line += f", of which waiting {_ms(p.get('comm_wait_us_per_step'))} per step"
    if p.get("clock_offset_us"):
        line += f"; clock {p['clock_offset_us']:+.0f} us"
    return line


def shown(r: dict) -> set:
    """The ranks whose lines are printed (an empty set: all of them; see ``SHOWN_RANKS``)."""
    per = (r or {}).get("per_rank") or []
    if len(per) <= SHOWN_RANKS:
        return set()
    keep = {x["rank"] for x in (r.get("late_arrivals") or [])[:3]} | {(r.get("straggler") or {}).get("rank")}
    return (keep | {per[0]["rank"], max(per, key=lambda p: p.get("step_time_us") or 0)["rank"]}) - {None}


def ranks_lines(r: dict) -> list[str]:
    if not r or r.get("count", 0) < 2:
        return []
    lines = [f"  across {r['count']} ranks (compute = "
             f"{r.get('compute_definition') or 'GPU time in non-communication kernels per step'}; wait = "
             "from a rank's arrival at a collective to the last arrival's, clocks corrected; transfer = the rest):"]
    per = r.get("per_rank", [])
    keep = shown(r)
    for p in per:
        if not keep or p["rank"] in keep:
            lines.append(_rank_line(p, bool(r.get("partial"))))
    if keep:
        steps = sorted(p["step_time_us"] for p in per if isinstance(p.get("step_time_us"), (int, float)))
        waits = sorted(p["comm_wait_us_per_step"] for p in per if isinstance(p.get("comm_wait_us_per_step"),
                                                                            (int, float)))
        lines.append(f"    ... {len(per) - len(keep)} other ranks: step {_ms(steps[0])} to {_ms(steps[-1])} "
                     f"(median {_ms(steps[len(steps) // 2])})" + (f", waiting median {_ms(waits[len(waits) // 2])} "
                                                                  "per step" if waits else "")
                     + " (--json, or the HTML report, for every rank)" if steps else "")
    ck = r.get("clocks") or {}
    if ck.get("collectives"):
        lines.append(f"    clocks: each rank's offset fitted to the ends of {ck['collectives']} collectives before any "
                     f"skew is measured (residual median {ck.get('residual_us') or 0:.0f} us, p95 "
                     f"{ck.get('residual_p95_us') or 0:.0f} us)")
    for x in (r.get("late_arrivals") or [])[:3]:
        lines.append(f"    late: {x['summary']}")
    m = r.get("matching") or {}
    if m:
        cpu = str(r.get("compute_definition") or "").startswith("step time")
        by = "name and order of the CPU ops" if cpu and m.get("by") else ", ".join(m.get("by") or []) or "-"
        lines.append(f"    collectives matched across ranks: {m.get('matched_collectives')} (by {by}; "
                     f"{m.get('unmatched_kernels')} {'ops' if cpu else 'kernels'} unmatched)")
    return lines


def skipped_lines(r: dict) -> list[str]:
    return ([f"  skipped {s['path']}: {s['why']}" for s in (r or {}).get("skipped") or []]
            + [f"  note: {n}" for n in (r or {}).get("notes") or []])


def findings_lines(result: dict, with_ranks: bool = True) -> list[str]:
    """Each finding: its severity, id (and the ranks it fired on), evidence, cause, fix and gain."""
    lines = []
    for f in result["findings"]:
        where = f" (ranks {', '.join(map(str, f['ranks']))})" if with_ranks and len(f.get("ranks") or []) > 1 \
            else ""
        lines.append(f"  [{f['severity']}] {f['id']}{where}: {f['evidence']}")
        lines.append(f"      cause: {f['cause']}")
        lines.append(f"      try:   {f['fix']}")
        if f.get("gain"):
            lines.append(f"      gain:  {f['gain']['text']}")
    return lines


def left_lines(result: dict) -> list[str]:
    """What is left after the findings: each remainder as a share of the step, worst rank."""
    worst: dict[str, float] = {}
    for per in result.get("_left") or []:
        for label, frac in per:
            worst[label] = max(worst.get(label, 0.0), frac or 0.0)
    if not worst:
        return []
    items = ", ".join(f"{k} {100 * v:.1f}%" for k, v in sorted(worst.items(), key=lambda kv: -kv[1]))
    return [f"  what is left (share of the step, worst rank; a finding needs >= {100 * MIN_GAIN:.0f}% or its "
            f"rule's threshold): {items}"]


def verdict(traces: list[dict]) -> str:
    """Why a quiet trace is quiet, in its own figures (worst rank)."""
    def worst(key, low=True):
        vals = [t[key] for t in traces if isinstance(t.get(key), (int, float))]
        return (min(vals) if low else max(vals)) if vals else None

    parts = []
    if worst("gpu_utilization_pct") is not None:
        parts.append(f"the GPU is busy {worst('gpu_utilization_pct'):.0f}% of the step")
    if worst("comm_compute_overlap_pct") is not None:
        parts.append(f"communication {worst('comm_compute_overlap_pct'):.0f}% overlapped with compute")
    if worst("tensor_core_kernel_pct") is not None:
        parts.append(f"tensor-core kernels {worst('tensor_core_kernel_pct'):.0f}% of kernel time")
    return (": " + ", ".join(parts)) if parts else ""


def format_traces(result: dict) -> str:
    lines = ["== trainperf diagnosis (profiler traces) =="]
    keep = shown(result.get("ranks"))
    per = {p["rank"]: p for p in (result.get("ranks") or {}).get("per_rank") or []}
    for t in result["traces"]:
        if not keep or t.get("rank") in keep:
            lines += rank_lines(t, per.get(t.get("rank")))
    if keep:
        lines.append(f"  ({len(result['traces']) - len(keep)} more ranks: their lines are left out here; --json and the "
                     "HTML report have every rank)")
    lines += ranks_lines(result.get("ranks") or {})
    lines += skipped_lines(result.get("ranks"))
    if not result["findings"]:
        lines.append("  no findings: no rule fired on these traces" + verdict(result["traces"]))
    lines += findings_lines(result)
    lines += left_lines(result)
    for m in result.get("not_measured", []):
        lines.append(f"  not measured: {m['id']}: {m['reason']}")
    return "\n".join(lines)


def format_run_traces(result: dict) -> str:
    """The profile/ traces of a run directory, after the run's own diagnosis."""
    if not result.get("traces"):
        return ""
    lines = ["  profiler traces (profile/):"]
    per = {p["rank"]: p for p in (result.get("ranks") or {}).get("per_rank") or []}
    for t in result["traces"]:
        lines += rank_lines(t, per.get(t.get("rank")))
    lines += ranks_lines(result.get("ranks") or {})
    lines += skipped_lines(result.get("ranks"))
    lines += left_lines(result)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- a run directory
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
    lines += findings_lines(result, with_ranks=False)
    for m in result.get("missing", []):
        lines.append(f"  not measured: {m}")
    return "\n".join(lines)


__all__ = ["findings_lines", "format_findings", "format_run_traces", "format_traces", "known_lines"]

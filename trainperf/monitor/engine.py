"""``trainperf diagnose PATH``: one diagnosis over a run directory, a trace, or a directory of traces.

``diagnose_path(path)`` returns the ``--json`` contract::

    {"source": "trace" | "run",
     "traces": [one element per rank: trainperf.trace.analyze_file's figures, rank, path],
     "ranks": {"count", "per_rank": [...], "straggler", "matching", "wait_definition"},
     "findings": [{"id", "severity", "title", "evidence", "cause", "fix", "gain", ...}],
     "not_measured": [{"id", "reason"}]}

A run directory adds what ``trainperf diagnose RUN_DIR`` always printed (``run_dir``, ``crashed``,
``summary``, ``missing``); its ``profile/`` traces are analysed too, and the rules only a trace can
judge are judged on them. Over traces, a rule of scope "rank" is judged on each rank's evidence and
reported once, from the rank where its gain is largest (``ranks`` lists every rank it fired on); a rule
of scope "job" (the straggler) is judged once over all ranks. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trainperf.monitor.diagnose import RULES, SEVERITY_ORDER, apply_rules, diagnose_run, load_screened
from trainperf.monitor.gain import fraction
from trainperf.monitor.trace_evidence import evidence, headroom, public, read_traces
from trainperf.trace.ranks import aside, discover


def _merge(per_rank: list[tuple[int, list[dict]]]) -> list[dict]:
    """One finding per rule id: the one with the largest gain (then the highest severity), with every
    rank it fired on."""
    best: dict[str, dict] = {}
    fired: dict[str, list[int]] = {}
    for rank, findings in per_rank:
        for f in findings:
            fired.setdefault(f["id"], []).append(rank)
            cur = best.get(f["id"])
            key = (-SEVERITY_ORDER[f["severity"]], fraction(f.get("gain")))
            if cur is None or key > (-SEVERITY_ORDER[cur["severity"]], fraction(cur.get("gain"))):
                best[f["id"]] = f
    out = []
    for fid, f in best.items():
        f = dict(f)
        if len(per_rank) > 1:
            f["ranks"] = sorted(set(fired[fid]))
        out.append(f)
    out.sort(key=lambda f: (SEVERITY_ORDER[f["severity"]], -fraction(f.get("gain"))))
    return out


def _dedupe(items: list[dict]) -> list[dict]:
    seen, out = set(), []
    for x in items:
        k = (x.get("id"), x.get("reason"))
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def diagnose_results(results: list[dict], across: dict, rules=None) -> dict[str, Any]:
    """Findings over already analysed traces (``read_traces``'s output)."""
    rules = RULES if rules is None else rules
    rank_rules = [r for r in rules if r.scope == "rank"]
    job_rules = [r for r in rules if r.scope == "job"]
    evs = [evidence(res, across) for res in results]
    per_rank, not_measured = [], []
    for ev in evs:
        f, nm = apply_rules(ev, rank_rules)
        per_rank.append((ev["rank"], f))
        not_measured += nm
    job_f, job_nm = apply_rules(evs[0], job_rules) if evs else ([], [])
    findings = _merge(per_rank)
    findings = sorted(findings + job_f, key=lambda f: (SEVERITY_ORDER[f["severity"]], -fraction(f.get("gain"))))
    return {"source": "trace", "traces": [public(r) for r in results], "ranks": across, "findings": findings,
            "not_measured": _dedupe(not_measured + job_nm), "_left": [headroom(ev) for ev in evs]}


def diagnose_path(path: str | Path, *, top_n: int = 10, patterns: list[str] | None = None,
                  progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The diagnosis of PATH: a run directory, a trace file or a directory of traces."""
    found = discover(path)
    kw = dict(top_n=top_n, patterns=patterns, progress=progress)
    if found["kind"] != "run":
        results, across = read_traces(found["files"], **kw)
        left = aside(found)
        if left:
            across["skipped"] = across.get("skipped", []) + left
        return diagnose_results(results, across)
    return with_traces(diagnose_run(load_screened(found["run_dir"])), found["files"], **kw)


def with_traces(result: dict, files: list[Path], **kw) -> dict[str, Any]:
    """A run directory's diagnosis (``diagnose_run``) with its profiler traces read: the rules only a trace
    can judge are judged on them, and the contract's ``traces`` / ``ranks`` filled."""
    result = {"source": "run", **result, "traces": [], "ranks": {}}
    if not files:
        return result
    results, across = read_traces(files, **kw)
    trace_only = [r for r in RULES if "run" in r.not_from]
    sub = diagnose_results(results, across, trace_only)
    have = {f["id"] for f in result["findings"]}
    result["findings"] = sorted(result["findings"] + [f for f in sub["findings"] if f["id"] not in have],
                                key=lambda f: (SEVERITY_ORDER[f["severity"]], -fraction(f.get("gain"))))
    judged = {r.id for r in trace_only} - {x["id"] for x in sub["not_measured"]}
    result["not_measured"] = _dedupe([x for x in result["not_measured"] if x["id"] not in judged]
                                     + sub["not_measured"])
    result.update(traces=sub["traces"], ranks=across, _left=sub["_left"])
    return result


def contract(result: dict) -> dict:
    """What ``--json`` prints: the result without its private keys."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


__all__ = ["contract", "diagnose_path", "diagnose_results", "with_traces"]

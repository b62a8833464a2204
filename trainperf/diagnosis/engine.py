"""``trainperf diagnose PATH``: one diagnosis over a run directory, a trace, or a directory of traces.

``diagnose_path(path)`` returns the ``--json`` contract::

    {"source": "trace" | "run",
     "traces": [one element per rank: trainperf.trace.analyze_file's figures, rank, path],
     "ranks": {"count", "per_rank": [...], "straggler", "matching", "wait_definition"},
     "findings": [{"id", "severity", "title", "evidence", "cause", "fix", "gain", ...}],
     "not_measured": [{"id", "reason"}]}

A run directory adds what ``trainperf diagnose RUN_DIR`` always printed (``run_dir``, ``crashed``,
``summary``, ``missing``); its ``profile/`` traces are analysed too, and the rules a run directory cannot
judge (the fields it lacks, :data:`trainperf.diagnosis.run_evidence.CANNOT_MEASURE`) are judged on them.
Over traces, a rule of scope "rank" is judged on each rank's evidence and reported once, from the rank where
its gain is largest (``ranks`` lists every rank it fired on); a rule of scope "job" (the straggler) is
judged once over all ranks. PATH is looked at once (:func:`trainperf.trace.ranks.discover`): a caller that
already did passes what it found (:func:`diagnose_found`). Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trainperf.diagnosis.evidence import Evidence
from trainperf.diagnosis.gain import fraction
from trainperf.diagnosis.rules import RULES, SEVERITY_ORDER, Rule
from trainperf.diagnosis.run_evidence import compute_summary, load_screened, run_evidence, run_missing, run_notes
from trainperf.diagnosis.rundir import known_state
from trainperf.diagnosis.screen import no_steps
from trainperf.diagnosis.trace_evidence import evidence, headroom, public
from trainperf.trace.job import read_traces
from trainperf.trace.ranks import aside, discover


def _order(f: dict) -> tuple:
    return SEVERITY_ORDER[f["severity"]], -fraction(f.get("gain"))


def apply_rules(ev: Evidence, rules: list[Rule] | None = None) -> tuple[list[dict], list[dict]]:
    """Run the rule table over one evidence: (findings, not measured [{"id", "reason"}]). A rule that needs a
    field the reader could not measure is not measured, with the reader's reason; so is a rule whose check
    answers ``{"unmeasured": reason}``."""
    findings, not_measured = [], []
    for rule in RULES if rules is None else rules:
        gap = next((f for f in rule.needs if f in ev.missing), None)
        if gap is not None:
            not_measured.append({"id": rule.id, "reason": ev.missing[gap]})
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
    findings.sort(key=_order)
    return findings, not_measured


# ---------------------------------------------------------------------------- a run directory
def diagnose_run(run: dict) -> dict[str, Any]:
    """The diagnosis of a run already loaded by :func:`trainperf.diagnosis.rundir.load_run` (its metrics; the
    profile/ traces are read by :func:`diagnose_path`)."""
    s = compute_summary(run)
    findings, not_measured = apply_rules(run_evidence(s))
    missing = run_missing(run, s)
    out = {"run_dir": str(run["dir"]), "crashed": run["crashed"], "findings": findings, "summary": s,
           "missing": missing, "not_measured": [*not_measured, *({"id": None, "reason": m} for m in missing)],
           "data_notes": list(run.get("data_notes") or []),
           "run_notes": run_notes(run)}
    if not any(run["ranks"].values()):  # ended (killed) before its first whole step record: say what it left
        out["known"] = known_state(run)
        if run.get("screened", {}).get(0, (0, {}))[0]:  # records exist, but every one is malformed (NaN, ...)
            out["known"]["malformed"] = no_steps(run["dir"], run)
    return out


def diagnose(run_dir: str | Path) -> dict[str, Any]:
    """The diagnosis of a run directory's metrics (its traces are not read: :func:`diagnose_path` reads them)."""
    return diagnose_run(load_screened(run_dir))


def print_findings(run_dir: str | Path) -> None:
    """Print a run's diagnosis as ``trainperf train`` ends it (its metrics' findings)."""
    from trainperf.diagnosis.text import format_findings

    print(format_findings(diagnose(run_dir)))


# ---------------------------------------------------------------------------- traces
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
    out.sort(key=_order)
    return out


def _dedupe(items: list[dict]) -> list[dict]:
    seen, out = set(), []
    for x in items:
        k = (x.get("id"), x.get("reason"))
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def diagnose_results(results: list[dict], across: dict, rules: list[Rule] | None = None) -> dict[str, Any]:
    """Findings over already analysed traces (:func:`trainperf.trace.job.read_traces`'s output)."""
    rules = RULES if rules is None else rules
    rank_rules = [r for r in rules if r.scope == "rank"]
    job_rules = [r for r in rules if r.scope == "job"]
    evs = [evidence(res, across) for res in results]
    per_rank, not_measured = [], []
    for ev in evs:
        f, nm = apply_rules(ev, rank_rules)
        per_rank.append((ev.rank, f))
        not_measured += nm
    job_f, job_nm = apply_rules(evs[0], job_rules) if evs else ([], [])
    findings = sorted(_merge(per_rank) + job_f, key=_order)
    return {"source": "trace", "traces": [public(r) for r in results], "ranks": across, "findings": findings,
            "not_measured": _dedupe(not_measured + job_nm), "_left": [headroom(ev) for ev in evs]}


def diagnose_found(found: dict, *, top_n: int = 10, patterns: list[str] | None = None,
                   progress: Callable[[int], None] | None = None, step: str | None = None) -> dict[str, Any]:
    """The diagnosis of what :func:`trainperf.trace.ranks.discover` found: a run directory (its metrics and its
    profile/ traces), a trace file, a directory of traces, or Nsight captures (``step``: the NVTX range of a
    step)."""
    kw = dict(top_n=top_n, patterns=patterns, progress=progress, step=step)
    if found["kind"] != "run":
        results, across = read_traces(found["files"], **kw)
        left = aside(found)
        if left:
            across["skipped"] = across.get("skipped", []) + left
        return diagnose_results(results, across)
    return with_traces(diagnose_run(load_screened(found["run_dir"])), found["files"], **kw)


def diagnose_path(path: str | Path, **kw) -> dict[str, Any]:
    """The diagnosis of PATH: a run directory, a trace file or a directory of traces (keywords: as
    :func:`diagnose_found`)."""
    return diagnose_found(discover(path), **kw)


def with_traces(result: dict, files: list[Path], **kw) -> dict[str, Any]:
    """A run directory's diagnosis (:func:`diagnose_run`) with its profiler traces read: the rules a run cannot
    judge (they need fields only a trace has) are judged on them, and the contract's ``traces`` / ``ranks``
    filled."""
    result = {"source": "run", **result, "traces": [], "ranks": {}}
    if not files:
        return result
    results, across = read_traces(files, **kw)
    lacks = run_evidence(result["summary"]).missing
    trace_only = [r for r in RULES if any(f in lacks for f in r.needs)]
    sub = diagnose_results(results, across, trace_only)
    have = {f["id"] for f in result["findings"]}
    result["findings"] = sorted(result["findings"] + [f for f in sub["findings"] if f["id"] not in have], key=_order)
    judged = {r.id for r in trace_only} - {x["id"] for x in sub["not_measured"]}
    result["not_measured"] = _dedupe([x for x in result["not_measured"] if x["id"] not in judged]
                                     + sub["not_measured"])
    result.update(traces=sub["traces"], ranks=across, _left=sub["_left"])
    return result


def contract(result: dict) -> dict:
    """What ``--json`` prints: the result without its private keys."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


__all__ = ["apply_rules", "contract", "diagnose", "diagnose_found", "diagnose_path", "diagnose_results",
           "diagnose_run", "print_findings", "with_traces"]

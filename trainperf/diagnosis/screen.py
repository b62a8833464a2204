"""The screening rule of diagnose, report and compare: step records and summary.json figures no real run
can have are left out of every figure, with a note naming the file.

A step record with a non-positive, non-finite or absurd step time or tokens/s (or, counted by
:func:`trainperf.diagnosis.rundir.load_run`, a step time that is NaN or text) is left out of every figure;
an MFU/HFU outside [0, 1] is left out of the MFU/HFU figures only (above 1 against a measured peak, the
note says what that means). summary.json figures that are non-positive, non-finite or absurd are ignored.
:func:`screen_run` applies both to a loaded run and returns the notes; :func:`no_steps` says why a run has
no step record left.
"""

from __future__ import annotations

from pathlib import Path

from trainperf.diagnosis.evidence import num as _num

# Figures no real run can have: above these a record or summary.json is corrupt, not fast or slow.
MAX_TOKENS_PER_S = 1e12  # tokens/s (the largest jobs are near 1e8)
MAX_STEP_TIME_S = 1e7  # seconds per step (about 116 days)
MAX_TRAIN_TIME_S = 1e9  # seconds (about 32 years)
MAX_BYTES = 2**60  # 1 EiB of device memory
# summary.json figures compare reads: (highest, what it is); each must be above 0 and at most the highest
SUMMARY_BOUNDS = {"tokens_per_s": (MAX_TOKENS_PER_S, "tokens/s"), "mfu": (1.0, "a fraction of the peak"),
                  "hfu": (1.0, "a fraction of the peak"), "train_time_s": (MAX_TRAIN_TIME_S, "seconds"),
                  "mem_peak_bytes": (MAX_BYTES, "bytes"), "mem_capacity_bytes": (MAX_BYTES, "bytes")}


def _bad_step(r: dict) -> str | None:
    """Why a step record (finite ``step_time_s``, whole ``step``: :func:`load_run` checked those) cannot be
    a real step's timing, or None when it can."""
    if not 0 < r["step_time_s"] <= MAX_STEP_TIME_S:
        return f"step_time_s not in (0, {MAX_STEP_TIME_S:g}] s"
    # null: a step whose tokens were not counted (a loop that passed no batch): its timing stands
    if r.get("tokens_per_s") is not None and not (0 < (_num(r["tokens_per_s"]) or 0.0) <= MAX_TOKENS_PER_S):
        return f"tokens_per_s not a number in (0, {MAX_TOKENS_PER_S:g}]"
    return None


def _screen_steps(run: dict) -> list[str]:
    """Leave impossible step records (a non-positive, non-finite or absurd step time or tokens/s, or a step
    time that is NaN or text) out of every figure, and an MFU/HFU outside [0, 1] out of the MFU/HFU figures
    (the record's timing is kept: an MFU is only as good as the peak it divides by); one note per file."""
    out = []
    summ = run.get("summary") if isinstance(run.get("summary"), dict) else {}
    measured = str(summ.get("peak_source") or "").startswith("measured")
    for rank in sorted(run["ranks"]):
        recs = run["ranks"][rank]
        keep, why, util, over = [], {}, {}, False
        for r in recs:
            reason = _bad_step(r)
            if reason is not None:
                why[reason] = why.get(reason, 0) + 1
                continue
            for k in ("mfu", "hfu"):
                v = _num(r.get(k))
                if k in r and (v is None or not 0 <= v <= 1):
                    r = {x: y for x, y in r.items() if x != k}
                    util[k] = util.get(k, 0) + 1
                    over = over or (measured and v is not None and v > 1)
            keep.append(r)
        unreadable = run.get("malformed", {}).get(rank, 0)
        if unreadable:
            why["step_time_s missing, NaN or text, or step not a whole number"] = unreadable
        total = len(recs) + unreadable
        run["ranks"][rank] = keep
        run.setdefault("screened", {})[rank] = (total, why)
        if not keep:
            continue  # rank 0: the error says it; another rank: its figures are simply absent
        parts = []
        skipped, back = run.get("skipped_lines", {}).get(rank, 0), run.get("out_of_order", {}).get(rank, 0)
        if skipped:
            parts.append(f"{_rank_file(run, rank)}: {skipped} line(s) that are not JSON records skipped (the file "
                         "was edited or damaged)")
        if back:
            parts.append(f"{'' if skipped else f'{_rank_file(run, rank)}: '}step records out of step order "
                         f"({back} place(s) where the step goes back), read in step order")
        if why:
            parts.append(f"{total - len(keep)} of {total} step records in {_rank_file(run, rank)} left out of the "
                         f"figures as malformed ({_reasons(why)})")
        if util:
            parts.append(("" if parts else f"{_rank_file(run, rank)}: ") + " and ".join(
                f"the {k.upper()} of {n} step records (outside [0, 1])" for k, n in util.items())
                + " left out of the MFU/HFU figures" + (
                    " (above 100% of a measured peak: a best matmul timing on this machine, not a hardware limit, "
                    "which these steps outran)" if over else ""))
        if parts:
            out.append("; ".join(parts))
    return out


def _rank_file(run: dict, rank: int) -> Path:
    return run.get("rank_files", {}).get(rank) or Path(run["dir"]) / ("metrics.jsonl" if rank == 0
                                                                     else f"metrics.rank{rank}.jsonl")


def _reasons(why: dict[str, int]) -> str:
    return "; ".join(f"{k}: {n}" for k, n in why.items())


def _screen_summary(run: dict) -> list[str]:
    """summary.json figures that no run can have (non-positive, non-finite, absurd) are ignored; one note."""
    summ = dict(run["summary"])
    bad = []
    for key, (hi, unit) in SUMMARY_BOUNDS.items():
        if summ.get(key) is None:
            continue  # absent, or null (not measured)
        v = _num(summ[key])
        if v is None or not 0 < v <= hi:
            bad.append(f"{key}={summ.pop(key)!r} (want {unit} in (0, {hi:g}])")
    ph = summ.get("phase_seconds")
    if isinstance(ph, dict):
        good = {k: v for k, v in ph.items() if _num(v) is not None and v >= 0}
        if len(good) != len(ph):
            bad.append(f"phase_seconds entries {', '.join(f'{k}={v!r}' for k, v in ph.items() if k not in good)} "
                       "(want seconds >= 0)")
            summ["phase_seconds"] = good
    run["summary"] = summ
    return ([f"{Path(run['dir']) / 'summary.json'}: ignored {'; '.join(bad)}, which no run can have; the figures "
             "come from metrics.jsonl"] if bad else [])


def _no_steps(d, run: dict) -> str:
    total, why = run.get("screened", {}).get(0, (0, {}))
    if total:
        return (f"{_rank_file(run, 0)} holds {total} step records, but every one is malformed ({_reasons(why)}): "
                "NaN, text, negative, zero or absurd values that no real step has; the file is corrupt, so pass "
                "the directory of an intact run (or rerun this one)")
    return (f"{d} holds no step records in metrics.jsonl (the run did not reach its first logged "
            "step); pass a run directory with at least one step")


def screen_run(run: dict) -> list[str]:
    """Screen a run loaded by :func:`trainperf.diagnosis.rundir.load_run` in place (step records, then
    summary.json); returns the notes, one per file with something left out. Screening twice changes nothing
    more: the second call returns the notes of the first."""
    if "data_notes" not in run:
        run["data_notes"] = _screen_steps(run) + _screen_summary(run)
    return run["data_notes"]


no_steps = _no_steps

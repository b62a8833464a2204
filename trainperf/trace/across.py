"""The figures across ranks: collectives matched, each host's clock offset, each collective split into the wait
for the last arrival and the transfer, the late arrivals charged with the others' waits, the straggler.

:func:`across_ranks` takes each rank's analysis (``trainperf.trace.analyze_file``: its ``_comm`` table,
:mod:`trainperf.trace.collectives`) and returns the contract's ``ranks``:

1. **Matching** (:func:`match`): a rank's collectives form one sequence per process group (``Process Group
   Name`` when the trace records it, else per communication stream in the order the streams first appear);
   the i-th collective of a sequence on one rank is the same collective as the i-th on the others, as long
   as their names agree (``Collective name`` where every rank has it, else the kernel name); matching stops
   at the first disagreement (the rest is reported unmatched).
2. **Clocks** (:mod:`trainperf.trace.clocks`): every matched collective ends at about the same true time on
   all its ranks; each rank's clock offset is fitted to those ends before any skew is measured.
3. **Wait and transfer**: on the corrected clocks, a rank's **wait** at a collective is the last arrival's
   start minus its own (at most its kernel's duration), its **transfer** the rest of its kernel. With the
   traces of only some ranks of a job (fewer than ``distributedInfo.world_size``, or fewer than a process
   group's ``pg_size``), the last arrival may be a rank that is not here: the wait among these ranks is
   measured, and the rest is *communication, which includes waiting for ranks not in these traces*, never
   called transfer.
4. **Late arrivals** (:mod:`trainperf.trace.blame`): the last arrival at each collective, how often it
   recurs, its cause and the wait it costs the job; the wait matrix.
5. **Straggler** by compute (:func:`straggler`), one case of a late rank (``late_arrivals[].cause ==
   "compute"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.blame import DEFINITION as BLAME_DEFINITION
from trainperf.trace.blame import LATE_MIN_US, Ledger
from trainperf.trace.clocks import METHOD, estimate_offsets
from trainperf.trace.collectives import CAUSES, compact, from_rows
from trainperf.trace.columns import percentiles

STRAGGLER_RATIO = 1.15  # as the run-directory straggler rule (monitor/rules_runtime.py)
STRAGGLER_MIN_GAP_US = 1000.0
RESIDUAL_NOTE_US = 50.0  # a clock fit worse than this (median) is said in the notes
COMPUTE_DEFINITION = "GPU time in non-communication kernels per step"
CPU_COMPUTE_DEFINITION = ("step time less exposed communication: on CPU-only traces, the time the rank was not waiting "
                          "in a gloo/nccl collective")
WAIT_DEFINITION = ("wait of a rank at a collective = the last arrival's start minus its own start, each rank's clock "
                   "offset removed first (at most its kernel's duration); transfer = the rest of its kernel; "
                   "collectives matched across ranks by order within each process group (or communication "
                   "stream); per step = sum over its steps / steps")
CPU_WAIT_DEFINITION = ("wait of a rank at a collective = the last arrival's start minus its own start in the "
                       "collective's CPU op (gloo/nccl), each rank's clock offset removed first (at most the op's "
                       "duration); transfer = the rest of the op; collectives matched across ranks by name and "
                       "order; per step = sum over its steps / steps")
PARTIAL_NOTE = ("communication, which includes waiting for ranks not in these traces: the job had ranks that are not "
                "here, so a collective's time beyond the wait among these ranks is not split into wait and transfer "
                "(transfer_us_per_step is null; comm_incl_absent_wait_us_per_step holds it)")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _mean(xs) -> float | None:
    xs = [x for x in (_num(v) for v in xs) if x is not None]
    return sum(xs) / len(xs) if xs else None


def as_table(c: Any) -> dict:
    """A rank's ``_comm``: the columnar table, or the older list of rows, or nothing."""
    if isinstance(c, dict) and "ts" in c:
        return compact(c)
    return from_rows(c if isinstance(c, (list, tuple)) else [])


# ---------------------------------------------------------------------------- matching
def match(tables: dict[int, dict]) -> dict[str, Any]:
    """Collectives matched across ranks (module docstring, 1). ``tables``: rank -> its table. Returns
    {"sequences": [{"key", "ranks", "rows": (ranks x matched) row indices into each rank's table}],
    "matched", "unmatched", "by"}."""
    labels: dict[str, int] = {}
    local: dict[int, dict[tuple, np.ndarray]] = {}
    lab: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for r, t in tables.items():
        gid = np.array([labels.setdefault(s, len(labels)) for s in t["names"]] + [-1], dtype=np.int64)
        lab[r] = (gid[t["coll"]], gid[t["name"]])  # id -1 reads the trailing -1: no name
        local[r] = {tuple(k): np.flatnonzero(t["seq"] == i) for i, k in enumerate(t["seqs"])}
    keys = sorted({k for d in local.values() for k in d}, key=lambda k: (k[0], str(k[1])))
    out, matched, unmatched, by = [], 0, 0, set()
    for key in keys:
        holders = [r for r in sorted(tables) if key in local[r] and local[r][key].size]
        if len(holders) < 2:
            unmatched += sum(local[r][key].size for r in holders)
            continue
        n = min(local[r][key].size for r in holders)
        rows = np.stack([local[r][key][:n] for r in holders])
        coll = np.stack([lab[r][0][rows[i]] for i, r in enumerate(holders)])
        name = np.stack([lab[r][1][rows[i]] for i, r in enumerate(holders)])
        same = np.where((coll >= 0).all(axis=0), (coll == coll[0]).all(axis=0), (name == name[0]).all(axis=0))
        ok = int(np.argmin(same)) if not same.all() else n
        unmatched += sum(local[r][key].size - ok for r in holders)
        if ok:
            by.add("process group" if key[0] == "pg" else "stream order")
            out.append({"key": key, "ranks": holders, "rows": rows[:, :ok]})
            matched += ok
    return {"sequences": out, "matched": matched, "unmatched": unmatched, "by": sorted(by)}


def measure(tables: dict[int, dict], *, world: int | None = None, pg_sizes: dict[str, int] | None = None,
            steps: dict[int, int] | None = None) -> dict[str, Any]:
    """Match, fit the clocks, split each collective into wait and transfer, charge the waits (module
    docstring). ``world``: the job's size when the traces say it; ``pg_sizes``: process group name -> size;
    ``steps``: rank -> its analysed steps (per-step figures)."""
    ranks = sorted(tables)
    idx = {r: i for i, r in enumerate(ranks)}
    m = match(tables)
    seqs = m["sequences"]
    # clocks: one observation per (rank, matched collective): its end on its own clock
    obs_r, obs_c, obs_e, base = [], [], [], 0
    for s in seqs:
        h, n = s["rows"].shape
        t_end = np.stack([tables[r]["ts"][s["rows"][i]] + tables[r]["dur"][s["rows"][i]] for i, r in enumerate(s["ranks"])])
        obs_r.append(np.repeat([idx[r] for r in s["ranks"]], n))
        obs_c.append(np.tile(np.arange(base, base + n), h))
        obs_e.append(t_end.ravel())
        base += n
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))  # noqa: E731
    clocks = estimate_offsets(cat(obs_r).astype(np.int64), cat(obs_c).astype(np.int64), cat(obs_e), len(ranks))
    off = np.nan_to_num(clocks["offset_us"])
    resid = clocks["residual_us"] or 0.0
    threshold = max(LATE_MIN_US, 3.0 * resid)
    waits: dict[int, list] = {r: [] for r in ranks}
    per = {r: {"wait": 0.0, "transfer": 0.0, "absent": 0.0, "by_step": {}, "matched_us": 0.0} for r in ranks}
    ledger = Ledger(list(CAUSES), ranks)
    partial_any = False
    for s in seqs:
        hs, rows = s["ranks"], s["rows"]
        size = (pg_sizes or {}).get(str(s["key"][1])) if s["key"][0] == "pg" else None
        if not size or size < len(hs):  # no size recorded, or one the traces contradict: the job's
            size = world
        partial = bool((size or 0) > len(hs))
        partial_any |= partial
        arr = np.stack([tables[r]["ts"][rows[i]] - off[idx[r]] for i, r in enumerate(hs)])
        dur = np.stack([tables[r]["dur"][rows[i]] for i, r in enumerate(hs)])
        st = np.stack([tables[r]["step"][rows[i]] for i, r in enumerate(hs)])
        w = np.clip(arr.max(axis=0) - arr, 0.0, dur)
        for i, r in enumerate(hs):
            p = per[r]
            p["wait"] += float(w[i].sum())
            p["transfer" if not partial else "absent"] += float((dur[i] - w[i]).sum())
            p["matched_us"] += float(dur[i].sum())
            for k, x in zip(st[i].tolist(), w[i].tolist()):
                if k >= 0:
                    p["by_step"][k] = p["by_step"].get(k, 0.0) + x
                waits[r].append((k if k >= 0 else None, x))
        have = all(tables[r].get("attribution") for r in hs)
        causes = np.stack([tables[r]["causes"][rows[i]] for i, r in enumerate(hs)]).astype(np.float64) if have else None
        ledger.add_sequence(hs, arr, w, causes, st, threshold)
    nsteps = max([v for v in (steps or {}).values() if v] or [1])
    return {"match": m, "clocks": clocks, "waits": waits, "per": per, "ledger": ledger, "threshold": threshold,
            "partial": partial_any, "nsteps": nsteps, "ranks": ranks}


def comm_waits(per_rank: dict[int, Any]) -> dict[str, Any]:
    """Each rank's wait at each matched collective. ``per_rank``: rank -> its ``_comm`` (table or rows).
    Returns {"waits": {rank: [(step, wait_us)]}, "matched", "unmatched", "by", "clock_offset_us": {rank: us}}."""
    got = measure({r: as_table(c) for r, c in per_rank.items()})
    off = got["clocks"]["offset_us"]
    return {"waits": got["waits"], "matched": got["match"]["matched"], "unmatched": got["match"]["unmatched"],
            "by": got["match"]["by"],
            "clock_offset_us": {r: (None if np.isnan(off[i]) else float(off[i])) for i, r in enumerate(got["ranks"])}}


# ---------------------------------------------------------------------------- the contract's ``ranks``
def _world_and_groups(results: list[dict]) -> tuple[int | None, dict[str, int]]:
    worlds, groups = set(), {}
    for res in results:
        di = res.get("distributed_info") or {}
        w = di.get("world_size") if isinstance(di, dict) else None
        if isinstance(w, int) and not isinstance(w, bool) and w > 0:
            worlds.add(w)
        for g in (di.get("pg_config") or []) if isinstance(di, dict) else []:
            if isinstance(g, dict) and g.get("pg_name") is not None:
                size = g.get("pg_size", len(g.get("ranks") or []) or None)
                if isinstance(size, int) and size > 0:
                    groups[str(g["pg_name"])] = size
    return (worlds.pop() if len(worlds) == 1 else None), groups


def _clock_figures(got: dict) -> dict[str, Any]:
    c = got["clocks"]
    return {"method": METHOD, "residual_us": c["residual_us"], "residual_p95_us": c["residual_p95_us"],
            "rounds": c["rounds"], "collectives": got["match"]["matched"],
            "reference_ranks": sorted({got["ranks"][int(i)] for i in set(c["reference"].tolist())
                                       if not np.isnan(c["offset_us"][int(i)])})}


def across_ranks(results: list[dict]) -> dict[str, Any]:
    """The contract's ``ranks`` (module docstring)."""
    per = []
    for res in sorted(results, key=lambda r: r["rank"]):
        steps = max(1, int(res.get("steps") or 0) or len(res.get("_step_compute_us") or []) or 1)
        per.append({"rank": res["rank"], "path": res.get("path"), "steps": res.get("steps"),
                    "step_time_us": _num(res.get("step_time_us")),
                    "compute_us_per_step": _mean(res.get("_step_compute_us") or []),
                    "comm_us_per_step": _mean(res.get("_step_comm_us") or []),
                    "exposed_comm_us_per_step": _mean(res.get("_step_exposed_comm_us") or []),
                    "comm_wait_us_per_step": None, "_steps": steps})
    cpu = bool(results) and all(res.get("cpu_only") for res in results)
    out: dict[str, Any] = {"count": len(per), "per_rank": per, "straggler": None,
                           "wait_definition": CPU_WAIT_DEFINITION if cpu else WAIT_DEFINITION, "matching": None,
                           "compute_definition": CPU_COMPUTE_DEFINITION if cpu else COMPUTE_DEFINITION,
                           "notes": job_notes(results)}
    if len(per) < 2:
        out["note"] = "one rank: the straggler and the communication wait need the traces of two or more ranks"
        for p in per:
            p.pop("_steps")
        return out
    world, groups = _world_and_groups(results)
    steps = {p["rank"]: p["_steps"] for p in per}
    got = measure({res["rank"]: as_table(res.get("_comm")) for res in results}, world=world, pg_sizes=groups,
                  steps=steps)
    m = got["match"]
    out["matching"] = {"matched_collectives": m["matched"], "unmatched_kernels": m["unmatched"], "by": m["by"]}
    off, c = got["clocks"]["offset_us"], got["clocks"]
    nsteps = got["nsteps"]
    for p in per:
        i = got["ranks"].index(p["rank"])
        g = got["per"][p["rank"]]
        n = p.pop("_steps")
        have = m["matched"] > 0
        p["comm_wait_us_total"] = g["wait"]
        p["comm_wait_us_per_step"] = g["wait"] / n if have else None
        p["transfer_us_per_step"] = g["transfer"] / n if (have and not got["partial"]) else None
        if got["partial"]:
            p["comm_incl_absent_wait_us_per_step"] = g["absent"] / n if have else None
        p["wait_us_by_step"] = [g["by_step"].get(k, 0.0) for k in range(n)] if have else []
        ok = not np.isnan(off[i])
        p["clock_offset_us"] = float(off[i]) if ok else None
        p["clock_residual_us"] = float(c["residual_median_us"][i]) if ok else None
        p["clock_residual_max_us"] = float(c["residual_max_us"][i]) if ok else None
        p["last_at"] = got["ledger"].last_at.get(p["rank"], 0)
    out["straggler"] = straggler(per)
    late = got["ledger"].late_arrivals(nsteps, got["partial"])
    st = out["straggler"]
    for x in late:
        x["straggler_by_compute"] = bool(st and st["slower"] and st["rank"] == x["rank"])
    out |= {"clocks": _clock_figures(got), "late_arrivals": late, "wait_matrix": got["ledger"].wait_matrix(nsteps),
            "late_threshold_us": got["threshold"], "blame_definition": BLAME_DEFINITION, "partial": got["partial"],
            "attribution": next((res["_comm"].get("attribution") for res in results
                                 if isinstance(res.get("_comm"), dict) and res["_comm"].get("attribution")), None)}
    if got["partial"]:
        out["notes"] = out["notes"] + [PARTIAL_NOTE]
    resid = got["clocks"]["residual_us"]
    if resid is not None and resid > RESIDUAL_NOTE_US:
        out["notes"] = out["notes"] + [
            f"the matched collectives' ends disagree by {resid / 1000:.2f} ms (median, after one clock offset per rank): "
            "not collectives that end together (point-to-point send/recv with other peers, all-to-all of uneven "
            "sizes) or clocks that drift during the trace; waits and late arrivals are uncertain by that much, and "
            f"arrivals less than {got['threshold'] / 1000:.2f} ms apart are not called late"]
    return out


def job_notes(results: list[dict]) -> list[str]:
    """What the set of traces says about itself: ranks of the job that have no trace here (from
    ``distributedInfo.world_size``), and two files that hold the same trace (one copied under two names)."""
    notes = []
    world, _ = _world_and_groups(results)
    if world:
        have = {r["rank"] for r in results}
        missing = [k for k in range(world) if k not in have]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            notes.append(f"the job had {world} ranks (distributedInfo.world_size) and {len(have)} trace(s) are here: "
                         f"rank(s) {shown} missing, so the figures across ranks (straggler, waits) leave them out")
    seen: dict[tuple, int] = {}
    for r in sorted(results, key=lambda r: r["rank"]):
        key = (r.get("events"), r.get("base_time_us"), r.get("step_time_us"), tuple(r.get("step_numbers") or ()))
        if key[0] and key in seen:
            notes.append(f"the traces of ranks {seen[key]} and {r['rank']} are the same trace (same events, start "
                         "time and steps): a file copied under two names? the figures across ranks count it twice")
        seen.setdefault(key, r["rank"])
    return notes


def straggler(per: list[dict]) -> dict | None:
    """The rank whose compute per step is furthest above the median of the others', if above the
    threshold; by compute, never by wall time (a fast rank's collectives are long because they wait)."""
    comp = {p["rank"]: p["compute_us_per_step"] for p in per if p.get("compute_us_per_step")}
    if len(comp) < 2:
        return None
    worst = max(comp, key=comp.get)
    base = float(percentiles([v for r, v in comp.items() if r != worst], [50])[0])
    ratio = comp[worst] / base if base else None
    waits = {p["rank"]: p.get("comm_wait_us_per_step") for p in per}
    others_wait = [w for r, w in waits.items() if r != worst and w is not None]
    return {"rank": worst, "compute_us_per_step": comp[worst], "median_others_us": base, "ratio": ratio,
            "excess_us_per_step": comp[worst] - base,
            "slower": bool(ratio and ratio > STRAGGLER_RATIO and comp[worst] - base >= STRAGGLER_MIN_GAP_US),
            "threshold_ratio": STRAGGLER_RATIO, "its_wait_us_per_step": waits.get(worst),
            "others_wait_us_per_step": float(percentiles(others_wait, [50])[0]) if others_wait else None}


__all__ = ["COMPUTE_DEFINITION", "CPU_COMPUTE_DEFINITION", "CPU_WAIT_DEFINITION", "PARTIAL_NOTE", "STRAGGLER_RATIO",
           "WAIT_DEFINITION", "across_ranks", "as_table", "comm_waits", "job_notes", "match", "measure", "straggler"]

"""NVTX ranges of one process -> the Timeline's CPU side: every range a complete CPU event (``c_*``), PyTorch's
``emit_nvtx`` ranges (``aten::mm, seq = 12, op_id = 345, sizes = [...]``) CPU ops under their base name,
other ranges annotations (``record_function`` scopes, a user's NVTX, NCCL's own domain), and the steps.

Roles are the Kineto Collector's (one function, :func:`trainperf.trace.timeline._op_role`): a DataLoader
``__next__`` span, a ``nccl:*`` / ``gloo:*`` collective op, ``aten::item`` / ``_local_scalar_dense`` (a host
sync), a ``ProfilerStep#N``; everything else (ops and annotations) is the plugin's "CPU Exec". Ranges of
NCCL's NVTX domain (``ncclAllReduce``...) are communication on the CPU, as ``nccl:*`` ops are.

**Steps.** ``--step NAME``: the ranges named NAME (or NAME followed by a number: ``step_12``, ``step 12``).
Otherwise a *repeated top-level range*: among the annotations no other annotation of the same thread
encloses, those whose name (digits folded: ``iteration 7`` -> ``iteration #``) occurs at least twice; a
name that reads like a step (step, iter, batch, epoch: ``ProfilerStep#3``, ``train_step``; not
``Optimizer.step#...`` nor a DataLoader's ``__next__``) wins, else one whose ranges cover at least 80% of
the time from the first to the last (steps follow one another; a hook run per layer, or the forward
alone, does not). trainperf's own phase ranges (``trainperf/data``, ``trainperf/forward``...) make
steps from one ``trainperf/data`` to the next. None found: the whole capture is one step, and the notes
name the repeated ranges that ``--step`` could take.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.errors import UserError
from trainperf.trace.intervals import Accumulator
from trainperf.trace.nsys.schema import NVTX, Export
from trainperf.trace.nsys.columns import column
from trainperf.trace.timeline import _R_COMM, _R_DL, _R_OP, _R_STEP, _R_SYNC, _Names, _op_role

RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange and their NVTXT forms
DOMAIN_CREATE = 75
OP_RE = re.compile(r"^[a-z_][a-z0-9_]*::")  # torch operator namespaces (aten::, c10d::, prim::...): lower case
STEP_LIKE = re.compile(r"step|iter|batch|epoch", re.I)
DIGITS = re.compile(r"\d+")
NOT_STEPS = ("Optimizer.", "enumerate(DataLoader)", "enumerate(DataPipe)")  # step-like names that are no step
COVER = 0.8  # a repeated range not named like a step is one when its ranges cover this share of their span
K_OP, K_ANNO = 0, 1
_DECORATIONS = (", seq = ", ", op_id = ", ", sizes = ", ", input_op_ids = ")


def base_name_sql(col: str) -> str:
    """SQL that cuts emit_nvtx's decorations off a range's text (``aten::mm, seq = 3, op_id = 9`` -> ``aten::mm``):
    done by SQLite, so the per-op unique strings never reach Python."""
    expr = col
    for d in reversed(_DECORATIONS):
        expr = f"CASE WHEN instr({col}, '{d}') > 0 THEN substr({col}, 1, instr({col}, '{d}') - 1) ELSE {expr} END"
    return expr


def domains(exp: Export) -> dict[tuple[int, int], str]:
    """(globalPid, domainId) -> domain name, from the NvtxDomainCreate events."""
    if not exp.has(NVTX, "domainId") or not exp.has(NVTX, "eventType"):
        return {}
    text = _text_sql(exp)
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if exp.has(NVTX, "textId") else ""
    out: dict[tuple[int, int], str] = {}
    tid = "coalesce(e.globalTid, 0)" if exp.has(NVTX, "globalTid") else "0"
    for chunk in exp.rows(f"SELECT {tid}, e.domainId, {text} FROM {NVTX} e {join} WHERE e.eventType = {DOMAIN_CREATE}"):
        for t, d, name in chunk:
            if d is not None:
                out[((int(t) >> 24) << 24, int(d))] = str(name or "")
    return out


def _text_sql(exp: Export) -> str:
    parts = [p for p, ok in (("e.text", exp.has(NVTX, "text")), ("s.value", exp.has(NVTX, "textId"))) if ok]
    return f"coalesce({', '.join(parts)}, '')" if parts else "''"


class Ranges:
    """The NVTX ranges of one process, read into the Timeline's ``c_*`` columns as they stream in."""

    def __init__(self, names: _Names, capacity: int = 0):
        self.names = names
        self.cols = {k: column(dt, capacity) for k, dt in (
            ("ts", np.float64), ("dur", np.float64), ("name", np.int32), ("tid", np.int64), ("kind", np.int8))}
        self.role: list[int] = []  # by name id
        self.kind: list[int] = []
        self.ops = Accumulator()
        self.op_only = Accumulator()
        self.nccl: list[tuple[float, float, str]] = []
        self.cpu_min, self.cpu_max = np.inf, -np.inf
        self.rows = 0

    def _describe(self, upto: int) -> None:
        names = self.names.names
        for i in range(len(self.role), upto):
            n = names[i]
            self.role.append(_op_role(n))
            self.kind.append(K_OP if OP_RE.match(n) else K_ANNO)

    def read(self, exp: Export, pid_lo: int | None, pid_hi: int | None, nccl_domains: set[int],
             progress=None) -> None:
        if not exp.has(NVTX, "start") or not exp.has(NVTX, "end"):
            return
        text = base_name_sql(_text_sql(exp))
        join = "LEFT JOIN StringIds s ON s.id = e.textId" if exp.has(NVTX, "textId") else ""
        tid = "coalesce(e.globalTid, -1)" if exp.has(NVTX, "globalTid") else "-1"
        dom = "coalesce(e.domainId, 0)" if exp.has(NVTX, "domainId") else "0"
        where = ["e.\"end\" IS NOT NULL", "e.\"end\" >= e.start"]
        if exp.has(NVTX, "eventType"):
            where.append(f"e.eventType IN {RANGE_TYPES}")
        args: tuple = ()
        if pid_lo is not None and exp.has(NVTX, "globalTid"):
            where.append("e.globalTid >= ? AND e.globalTid < ?")
            args = (pid_lo, pid_hi)
        sql = (f"SELECT e.start, e.\"end\", {tid}, {dom}, {text} FROM {NVTX} e {join} WHERE {' AND '.join(where)}")
        intern = self.names.__getitem__
        for chunk in exp.rows(sql, args):
            start, end, tids, doms, texts = zip(*chunk)
            ids = np.fromiter(map(intern, texts), dtype=np.int32, count=len(texts))
            self._describe(len(self.names.names))
            tids = np.array(tids, dtype=np.int64)
            if pid_lo is not None:  # threads numbered within the process (its OS thread ids), as the calls
                tids = np.where(tids >= 0, tids - pid_lo, -1)
            self._add(np.array(start, dtype=np.int64), np.array(end, dtype=np.int64), tids,
                      np.array(doms, dtype=np.int64), ids, nccl_domains)
            if progress:
                progress(len(chunk))

    def _add(self, start, end, tids, doms, ids, nccl_domains) -> None:
        ts = start / 1000.0
        dur = (end - start) / 1000.0
        kind = np.asarray(self.kind, dtype=np.int8)[ids]
        role = np.asarray(self.role, dtype=np.int8)[ids]
        nccl = np.isin(doms, list(nccl_domains)) if nccl_domains else np.zeros(ids.size, dtype=bool)
        kind[nccl] = K_ANNO
        for k, v in (("ts", ts), ("dur", dur), ("name", ids), ("tid", tids), ("kind", kind)):
            self.cols[k].add(v)
        self.rows += ids.size
        if ids.size:
            self.cpu_min = min(self.cpu_min, float(ts.min()))
            self.cpu_max = max(self.cpu_max, float((ts + dur).max()))
        op = (kind == K_OP) & (role == _R_OP) & ~nccl  # annotations wait for the step choice (a step is no op)
        if op.any():
            self.ops.add(ts[op], ts[op] + dur[op])
            self.op_only.add(ts[op], ts[op] + dur[op])
        names = self.names.names
        for i in np.flatnonzero(nccl):
            self.nccl.append((float(ts[i]), float(dur[i]), names[ids[i]]))

    def columns(self) -> dict[str, np.ndarray]:
        return {k: c.array() for k, c in self.cols.items()}


def _steps_from(c: dict, idx: np.ndarray, names: list[str]) -> list[tuple[float, float, int]]:
    """(ts, dur, number) of the chosen ranges, in time order; the number is the one in the name when every
    range has its own, else the ordinal."""
    idx = idx[np.argsort(c["ts"][idx], kind="stable")]
    nums = []
    for i in idx:
        m = DIGITS.findall(names[c["name"][i]])
        nums.append(int(m[-1]) if m and len(m[-1]) < 18 else None)
    if None in nums or len(set(nums)) != len(nums):
        nums = list(range(len(idx)))
    return [(float(c["ts"][i]), float(c["dur"][i]), n) for i, n in zip(idx, nums)]


def _top_level(c: dict, idx: np.ndarray) -> np.ndarray:
    """The ranges of ``idx`` no other range of ``idx`` on the same thread encloses."""
    if idx.size == 0:
        return idx
    o = np.lexsort((-c["dur"][idx], c["ts"][idx], c["tid"][idx]))
    idx = idx[o]
    ts, end, tid = c["ts"][idx], c["ts"][idx] + c["dur"][idx], c["tid"][idx]
    keep = np.ones(idx.size, dtype=bool)
    for t in unique(tid):
        sel = np.flatnonzero(tid == t)
        reach = np.maximum.accumulate(end[sel])
        keep[sel[1:]] = ts[sel[1:]] >= reach[:-1]
    return idx[keep]


def _match(name: str, want: str) -> bool:
    return name == want or bool(re.fullmatch(re.escape(want) + r"[\s#_:\-]*\d+", name)) or \
        DIGITS.sub("#", name) == DIGITS.sub("#", want)


def choose_steps(c: dict, names: list[str], step: str | None, path: str) -> dict[str, Any]:
    """The steps of the capture: {"steps": [(ts, dur, n)], "step_idx", "name", "how", "candidates", "notes"}."""
    anno = np.flatnonzero(c["kind"] == K_ANNO)
    role_ok = np.array([_op_role(n) in (_R_OP, _R_STEP) and not n.startswith(NOT_STEPS) for n in names] or [False])
    top = _top_level(c, anno[role_ok[c["name"][anno]]])
    groups: dict[str, list[int]] = {}
    for i in top:
        groups.setdefault(DIGITS.sub("#", names[c["name"][i]]), []).append(int(i))
    repeated = {k: np.array(v) for k, v in groups.items() if len(v) >= 2}
    cover = {}
    for k, v in repeated.items():
        span = float((c["ts"][v] + c["dur"][v]).max() - c["ts"][v].min())
        cover[k] = float(c["dur"][v].sum()) / span if span > 0 else 0.0
    cands = sorted(repeated, key=lambda k: (-len(repeated[k]), k))
    out: dict[str, Any] = {"candidates": [{"name": k, "count": len(repeated[k]), "coverage": cover[k]}
                                          for k in cands[:8]], "notes": []}
    if step is not None:
        ids = [i for i, n in enumerate(names) if _match(n, step)]
        idx = np.flatnonzero(np.isin(c["name"], ids)) if ids else np.zeros(0, dtype=np.int64)
        if idx.size == 0:
            shown = ", ".join(f"{d['name']!r} ({d['count']}x)" for d in out["candidates"]) or "none"
            raise UserError(f"{path}: --step {step!r}: no NVTX range of that name in the capture; its repeated "
                            f"top-level ranges: {shown}. Pass one of them, or the name your code gives the "
                            "step's range (torch.cuda.nvtx.range_push(NAME))")
        return out | {"steps": _steps_from(c, idx, names), "step_idx": idx, "name": step,
                      "how": f"NVTX range {step!r} (--step)"}
    steplike = [k for k in cands if STEP_LIKE.search(k)]
    covering = [k for k in cands if cover[k] >= COVER]
    pick = max(steplike, key=lambda k: float(c["dur"][repeated[k]].sum())) if steplike else \
        (max(covering, key=lambda k: cover[k]) if covering else None)
    if pick is not None:
        idx = repeated[pick]
        return out | {"steps": _steps_from(c, idx, names), "step_idx": idx, "name": pick,
                      "how": f"NVTX range {pick!r} (top-level, repeated {idx.size}x)"}
    phases = _trainperf_phases(c, names)
    if phases is not None:
        return out | phases
    if cands:
        out["notes"].append("no NVTX range reads as a step (a repeated top-level range named step / iter / batch / "
                            "epoch, or covering most of the capture): the whole capture is one step; pass "
                            f"--step NAME, e.g. one of {', '.join(repr(k) for k in cands[:4])}")
    return out | {"steps": [], "step_idx": np.zeros(0, dtype=np.int64), "name": None, "how": None}


def _trainperf_phases(c: dict, names: list[str]) -> dict[str, Any] | None:
    """Steps from trainperf's own phase ranges: each ``trainperf/data`` starts one, up to the next."""
    first = [i for i, n in enumerate(names) if n == "trainperf/data"]
    if not first:
        return None
    all_ids = [i for i, n in enumerate(names) if n.startswith("trainperf/")]
    idx = np.flatnonzero(np.isin(c["name"], first))
    if idx.size < 2:
        return None
    every = np.flatnonzero(np.isin(c["name"], all_ids))
    starts = np.sort(c["ts"][idx])
    last_end = float((c["ts"][every] + c["dur"][every]).max())
    ends = np.append(starts[1:], last_end)
    steps = [(float(s), float(e - s), n) for n, (s, e) in enumerate(zip(starts, ends))]
    return {"steps": steps, "step_idx": np.zeros(0, dtype=np.int64), "name": "trainperf/data",
            "how": "trainperf's phase ranges: from one 'trainperf/data' to the next"}


def finish(r: Ranges, c: dict, chosen: dict, t) -> None:
    """Fill the Timeline's CPU side from the ranges and the chosen steps."""
    names = r.names.names
    step_mask = np.zeros(c["ts"].size, dtype=bool)
    step_mask[chosen["step_idx"]] = True
    role = np.asarray(r.role, dtype=np.int8)[c["name"]] if c["name"].size else np.zeros(0, dtype=np.int8)
    anno = (c["kind"] == K_ANNO) & (role == _R_OP) & ~step_mask
    if r.nccl:  # NCCL's domain ranges are communication, not CPU exec
        nccl_ids = {r.names[n] for _, _, n in r.nccl}
        anno &= ~np.isin(c["name"], list(nccl_ids))
    if anno.any():
        r.ops.add(c["ts"][anno], c["ts"][anno] + c["dur"][anno])
    t.cpu_ops = r.ops.result()
    t.cpu_op_only = r.op_only.result()
    t.steps = list(chosen["steps"])
    special = np.flatnonzero((role != _R_OP) & ~step_mask)
    for i in special:
        row = (float(c["ts"][i]), float(c["dur"][i]), names[c["name"][i]])
        ro = role[i]
        if ro == _R_DL:
            t.dataloader.append(row)
        elif ro == _R_COMM:
            t.comm_ops.append(row)
        elif ro == _R_SYNC:
            t.sync_ops.append(row)
        elif ro == _R_STEP and not chosen["steps"]:
            pass  # a ProfilerStep range the choice did not take: neither op nor step
    t.comm_ops.extend(r.nccl)
    t.comm_ops.sort()
    t.dataloader.sort()
    t.cpu_events = int(c["ts"].size)
    t.cpu_min, t.cpu_max = r.cpu_min, r.cpu_max
    t.c_ts, t.c_dur, t.c_name, t.c_tid, t.c_kind = c["ts"], c["dur"], c["name"], c["tid"], c["kind"]


__all__ = ["OP_RE", "Ranges", "base_name_sql", "choose_steps", "domains", "finish"]

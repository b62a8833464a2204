"""One rank of an Nsight Systems export -> a :class:`~trainperf.trace.timeline.Timeline`, the same arrays the
Kineto reader builds, so every figure (tb.py, hta.py, figures.py) is computed by the same code.

=========================================  ===============================================================
export                                     Timeline
=========================================  ===============================================================
``CUPTI_ACTIVITY_KIND_KERNEL``             kernels (``g_*``): demangled name (Kineto's), stream, device,
                                           correlation id; grid / block / registers / shared memory ->
                                           ``blocks per SM`` and ``est. achieved occupancy %`` as Kineto
                                           computes them (:mod:`.occupancy`)
``..._MEMCPY`` / ``..._MEMSET``            copies and fills, named as Kineto names them
                                           (``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``), bytes
``..._RUNTIME`` (``..._DRIVER``)           runtime / driver calls (``r_*``): name without nsys's version
                                           suffix (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``),
                                           correlation id, thread (``r_tid``: globalTid less
                                           the process's globalPid, its OS thread id, int32;
                                           ``meta["thread_base"]`` adds back)
``..._SYNCHRONIZATION``                    CUPTI sync records on a stream (``s_*``, HTA's ``cuda_sync``)
``NVTX_EVENTS``                            CPU events, CPU ops, annotations and steps (:mod:`.nvtx`)
=========================================  ===============================================================

Rows stream ``fetchmany`` at a time into the Timeline's growing columns; names are interned once (kernel and
call names by StringIds id, range names after SQLite has cut emit_nvtx's decorations). Times: the export's
integer nanoseconds / 1000 (us, exact), with ``base_us`` the capture's epoch offset when
``TARGET_INFO_SESSION_START_TIME`` has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace.nsys import nvtx as nv
from trainperf.trace.nsys import occupancy
from trainperf.trace.nsys.columns import column
from trainperf.trace.nsys.schema import DRIVER, KERNEL, MEMCPY, MEMSET, RUNTIME, Export, pid_range
from trainperf.trace.timeline import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Timeline, _Names, _clean_steps

SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_G = {"ts": np.float64, "dur": np.float64, "kind": np.int8, "name": np.int32, "stream": np.int64, "device": np.int64,
      "corr": np.int64, "occ": np.float32, "bps": np.float32, "bytes": np.float64}
_R = {"ts": np.float64, "dur": np.float64, "corr": np.int64, "name": np.int32, "driver": bool,
      "tid": np.int64}


@dataclass
class RankSpec:
    """Which rows of the export one rank is: a process (``pid``: its globalPid, None when the export has no
    process column) on a GPU (``devices``: its own and those it only copied to), and where calls go when
    the process drives several GPUs (``others``: its other ranks' devices; ``main``: unlinked calls)."""
    pid: int | None
    device: int | None
    devices: tuple = ()
    others: tuple = ()
    main: bool = True
    label: str = ""
    info: dict = field(default_factory=dict)  # the device (TARGET_INFO_GPU), the process name


def call_name(raw: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (nsys records the API version; Kineto does not)."""
    return _VERSION_SUFFIX.sub("", raw)


class _Builder:
    def __init__(self, exp: Export, spec: RankSpec, progress: Callable[[int], None] | None):
        self.exp, self.spec, self.progress = exp, spec, progress
        self.names = _Names()
        n_g = sum(exp.row_estimate(t) for t in (KERNEL, MEMCPY, MEMSET))
        n_r = sum(exp.row_estimate(t) for t in (RUNTIME, DRIVER))
        self.g = {k: column(dt, n_g) for k, dt in _G.items()}
        self.r = {k: column(dt, n_r) for k, dt in _R.items()}
        self.tid_base = spec.pid if spec.pid is not None else 0  # threads numbered within the rank's process
        self.s = {k: column(dt, exp.row_estimate(SYNC_TABLE))
                  for k, dt in (("ts", np.float64), ("dur", np.float64), ("stream", np.int64))}
        self.string_ids: dict[int, int] = {}  # StringIds id -> names index
        self.lim = None
        self.notes: list[str] = []

    # -------------------------------------------------------------- helpers
    def _where_gpu(self, table: str) -> tuple[str, tuple]:
        conds, args = [], []
        if self.spec.pid is not None and self.exp.has(table, "globalPid"):
            conds.append("globalPid = ?")
            args.append(self.spec.pid)
        if self.spec.devices and self.exp.has(table, "deviceId"):
            conds.append(f"deviceId IN ({','.join('?' * len(self.spec.devices))})")
            args.extend(self.spec.devices)
        return (" WHERE " + " AND ".join(conds)) if conds else "", tuple(args)

    def _intern_ids(self, ids: np.ndarray, rename: Callable[[str], str] | None = None) -> np.ndarray:
        """StringIds ids -> names indices (the strings fetched once per new id)."""
        uniq = unique(ids)
        new = [int(i) for i in uniq if int(i) not in self.string_ids]
        if new:
            got = self.exp.strings(new)
            for i in new:
                s = got.get(i, f"<string {i}>")
                self.string_ids[i] = self.names[rename(s) if rename else s]
        table = np.array([self.string_ids[int(i)] for i in uniq], dtype=np.int32)
        return table[np.searchsorted(uniq, ids)]

    def _gpu_rows(self, n: int, ts, end, kind: int, name, stream, device, corr, occ=None, bps=None, nbytes=None):
        g = self.g
        g["ts"].add(ts / 1000.0)
        g["dur"].add(np.maximum(end - ts, 0) / 1000.0)
        g["kind"].add(np.full(n, kind, dtype=np.int8))
        g["name"].add(name)
        g["stream"].add(stream)
        g["device"].add(device)
        g["corr"].add(corr)
        nan32 = np.full(n, np.nan, dtype=np.float32)
        g["occ"].add(nan32 if occ is None else occ)
        g["bps"].add(nan32 if bps is None else bps)
        g["bytes"].add(np.full(n, np.nan) if nbytes is None else nbytes.astype(np.float64))
        if self.progress:
            self.progress(n)

    # -------------------------------------------------------------- GPU
    def kernels(self) -> None:
        e = self.exp
        if not e.has(KERNEL):
            return
        name = e.col(KERNEL, "demangledName", "shortName", "mangledName", "name")
        if name is None:
            self.notes.append(f"{KERNEL} has no name column (demangledName / shortName): kernels are unnamed")
        x = e.expr
        cols = ["start", '"end"', x(KERNEL, "deviceId", 0), x(KERNEL, "streamId", -1), x(KERNEL, "correlationId", -1),
                f'coalesce("{name}", -1)' if name else "-1",
                f'{x(KERNEL, "gridX", 0)} * {x(KERNEL, "gridY", 1)} * {x(KERNEL, "gridZ", 1)}',
                f'{x(KERNEL, "blockX", 0)} * {x(KERNEL, "blockY", 1)} * {x(KERNEL, "blockZ", 1)}',
                x(KERNEL, "registersPerThread", 0), x(KERNEL, "staticSharedMemory", 0),
                x(KERNEL, "dynamicSharedMemory", 0)]
        where, args = self._where_gpu(KERNEL)
        text_names = name is not None and name == "name" and _is_text(e, KERNEL, name)
        for chunk in e.rows(f"SELECT {', '.join(cols)} FROM {KERNEL}{where}", args):
            a = list(zip(*chunk))
            n = len(chunk)
            if text_names:
                ids = np.fromiter(map(self.names.__getitem__, a[5]), dtype=np.int32, count=n)
            else:
                ids = self._intern_ids(np.array(a[5], dtype=np.int64))
            grid, block, regs, s_smem, d_smem = (np.array(v, dtype=np.int64) for v in a[6:11])
            bps, occ = occupancy.estimate(grid, block, regs, s_smem, d_smem, self.lim)
            self._gpu_rows(n, np.array(a[0], dtype=np.int64), np.array(a[1], dtype=np.int64), GPU_KERNEL, ids,
                           np.array(a[3], dtype=np.int64), np.array(a[2], dtype=np.int64),
                           np.array(a[4], dtype=np.int64), occ, bps)

    def copies(self) -> None:
        e, x = self.exp, self.exp.expr
        if e.has(MEMCPY):
            if not e.has(MEMCPY, "srcKind"):
                self.notes.append(f"{MEMCPY} has no srcKind / dstKind (an older export): pageable or pinned "
                                  "copies cannot be told apart")
            cols = ["start", '"end"', x(MEMCPY, "deviceId", 0), x(MEMCPY, "streamId", -1),
                    x(MEMCPY, "correlationId", -1), x(MEMCPY, "copyKind", 0), x(MEMCPY, "srcKind", -1),
                    x(MEMCPY, "dstKind", -1), x(MEMCPY, "bytes", 0)]
            where, args = self._where_gpu(MEMCPY)
            cache: dict[tuple, int] = {}
            for chunk in e.rows(f"SELECT {', '.join(cols)} FROM {MEMCPY}{where}", args):
                a = list(zip(*chunk))
                ids = np.fromiter((self._copy_name(cache, k, s, d) for k, s, d in zip(a[5], a[6], a[7])),
                                  dtype=np.int32, count=len(chunk))
                self._gpu_rows(len(chunk), np.array(a[0], dtype=np.int64), np.array(a[1], dtype=np.int64),
                               GPU_MEMCPY, ids, np.array(a[3], dtype=np.int64), np.array(a[2], dtype=np.int64),
                               np.array(a[4], dtype=np.int64), nbytes=np.array(a[8], dtype=np.int64))
        if e.has(MEMSET):
            cols = ["start", '"end"', x(MEMSET, "deviceId", 0), x(MEMSET, "streamId", -1),
                    x(MEMSET, "correlationId", -1), x(MEMSET, "memKind", 2), x(MEMSET, "bytes", 0)]
            where, args = self._where_gpu(MEMSET)
            for chunk in e.rows(f"SELECT {', '.join(cols)} FROM {MEMSET}{where}", args):
                a = list(zip(*chunk))
                ids = np.fromiter((self.names[f"Memset ({e.mem_kind(k)})"] for k in a[5]), dtype=np.int32,
                                  count=len(chunk))
                self._gpu_rows(len(chunk), np.array(a[0], dtype=np.int64), np.array(a[1], dtype=np.int64),
                               GPU_MEMSET, ids, np.array(a[3], dtype=np.int64), np.array(a[2], dtype=np.int64),
                               np.array(a[4], dtype=np.int64), nbytes=np.array(a[6], dtype=np.int64))

    def _copy_name(self, cache: dict, k, s, d) -> int:
        key = (k, s, d)
        got = cache.get(key)
        if got is None:
            e = self.exp
            got = cache[key] = self.names[f"Memcpy {e.copy_kind(k)} ({e.mem_kind(s)} -> {e.mem_kind(d)})"]
        return got

    def syncs(self) -> None:
        e, x = self.exp, self.exp.expr
        if not e.has(SYNC_TABLE, "streamId"):
            return
        where, args = self._where_gpu(SYNC_TABLE)
        where += (" AND " if where else " WHERE ") + "streamId IS NOT NULL AND streamId >= 0"
        for chunk in e.rows(f'SELECT start, "end", {x(SYNC_TABLE, "streamId", -1)} FROM {SYNC_TABLE}{where}', args):
            a = np.array(chunk, dtype=np.int64)
            self.s["ts"].add(a[:, 0] / 1000.0)
            self.s["dur"].add(np.maximum(a[:, 1] - a[:, 0], 0) / 1000.0)
            self.s["stream"].add(a[:, 2])

    # -------------------------------------------------------------- host calls
    def calls(self) -> None:
        """Runtime and driver calls of the rank's process. A process driving several GPUs (several ranks): a
        call whose correlation id is another rank's GPU event goes there; calls linked to no GPU event go to
        the process's main rank."""
        e = self.exp
        mine = unique(self.g["corr"].array())
        other = self._other_corrs() if self.spec.others else None
        for table in (RUNTIME, DRIVER):
            if not e.has(table, "nameId"):
                continue
            x = e.expr
            cols = ["start", '"end"', x(table, "correlationId", -1), "nameId", x(table, "globalTid", -1),
                    x(table, "eventClass", 0)]
            where, args = "", ()
            if self.spec.pid is not None and e.has(table, "globalTid"):
                where, args = " WHERE globalTid >= ? AND globalTid < ?", pid_range(self.spec.pid)
            for chunk in e.rows(f"SELECT {', '.join(cols)} FROM {table}{where}", args):
                a = np.array(chunk, dtype=np.int64)
                if other is not None:
                    keep = ~np.isin(a[:, 2], other)
                    if not self.spec.main:
                        keep &= np.isin(a[:, 2], mine)
                    a = a[keep]
                if not a.size:
                    continue
                ids = self._intern_ids(a[:, 3], call_name)
                r = self.r
                r["ts"].add(a[:, 0] / 1000.0)
                r["dur"].add(np.maximum(a[:, 1] - a[:, 0], 0) / 1000.0)
                r["corr"].add(a[:, 2])
                r["name"].add(ids)
                uniq = unique(ids)
                flag = np.array([self.names.names[i].startswith("cu") and not self.names.names[i].startswith("cuda")
                                 for i in uniq], dtype=bool)
                r["driver"].add(flag[np.searchsorted(uniq, ids)] | (a[:, 5] == 1) | (table == DRIVER))
                r["tid"].add(np.where(a[:, 4] >= 0, a[:, 4] - self.tid_base, -1))
                if self.progress:
                    self.progress(len(a))

    def _other_corrs(self) -> np.ndarray:
        e = self.exp
        out = []
        for table in (KERNEL, MEMCPY, MEMSET):
            if not (e.has(table, "correlationId") and e.has(table, "deviceId")):
                continue
            marks = ",".join("?" * len(self.spec.others))
            where = f"deviceId IN ({marks})"
            args: tuple = tuple(self.spec.others)
            if self.spec.pid is not None and e.has(table, "globalPid"):
                where += " AND globalPid = ?"
                args += (self.spec.pid,)
            for chunk in e.rows(f"SELECT correlationId FROM {table} WHERE {where}", args):
                out.append(np.array([c for (c,) in chunk if c is not None], dtype=np.int64))
        return unique(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def _is_text(e: Export, table: str, col: str) -> bool:
    got = e.one(f'SELECT typeof("{col}") FROM {table} LIMIT 1')
    return bool(got) and got[0] == "text"


def read_rank(exp: Export, spec: RankSpec, *, step: str | None = None, nccl_domains: set[int] | None = None,
              base_us: float = 0.0, progress: Callable[[int], None] | None = None) -> tuple[Timeline, dict[str, Any]]:
    """One rank's Timeline and what the reader knows beside it ({"step": the step choice, "notes"})."""
    b = _Builder(exp, spec, progress)
    dev = spec.info.get("device") or {}
    cc = dev.get("cc")
    b.lim = occupancy.limits(tuple(cc) if cc else None, dev.get("num_sms"), dev.get("limits"))
    b.kernels()
    b.copies()
    b.syncs()
    b.calls()
    ranges = nv.Ranges(b.names, exp.row_estimate(nv.NVTX))
    lo, hi = pid_range(spec.pid) if spec.pid is not None else (None, None)
    ranges.read(exp, lo, hi, nccl_domains or set(), progress)
    t = Timeline()
    t.base_us = base_us
    for prefix, cols in (("g_", b.g), ("r_", b.r), ("s_", b.s)):
        for k, col in cols.items():
            setattr(t, prefix + k, col.array())
    # what an export never has (collective and process-group names on kernels, External ids on calls): one
    # read-only -1 per row, taking no memory
    t.g_coll = t.g_pg = np.broadcast_to(np.int32(-1), t.g_ts.shape)
    t.r_ext = np.broadcast_to(np.int32(-1), t.r_ts.shape)
    t.op_ext = np.zeros(0, dtype=np.int64)
    c = ranges.columns()
    chosen = nv.choose_steps(c, b.names.names, step, str(exp.path))
    nv.finish(ranges, c, chosen, t)
    t.names = b.names.names
    t.events = int(t.g_ts.size + t.r_ts.size + t.s_ts.size + t.c_ts.size)
    lows = [float(a.min()) for a in (t.g_ts, t.r_ts) if a.size] + ([t.cpu_min] if np.isfinite(t.cpu_min) else [])
    highs = [float((a + d).max()) for a, d in ((t.g_ts, t.g_dur), (t.r_ts, t.r_dur)) if a.size] + \
        ([t.cpu_max] if np.isfinite(t.cpu_max) else [])
    if lows:
        t.all_min, t.all_max = min(lows), max(highs)
    t.meta = _meta(spec)
    t.meta["thread_base"] = b.tid_base
    t.steps = _clean_steps(t)
    return t, {"step": chosen, "notes": b.notes, "limits": b.lim}


def _meta(spec: RankSpec) -> dict[str, Any]:
    dev = spec.info.get("device") or {}
    meta: dict[str, Any] = {"source": "nsys"}
    if dev.get("name") or dev.get("cc"):
        cc = dev.get("cc") or (None, None)
        meta["deviceProperties"] = [{"id": spec.device, "name": dev.get("name"), "computeMajor": cc[0],
                                     "computeMinor": cc[1], "numSms": dev.get("num_sms"),
                                     "totalGlobalMem": dev.get("memory_bytes")}]
    rank = spec.info.get("nccl_rank")
    if rank is not None:
        meta["distributedInfo"] = {"rank": rank, "world_size": spec.info.get("nccl_ranks"), "backend": "nccl"}
    return meta


__all__ = ["RankSpec", "call_name", "read_rank"]

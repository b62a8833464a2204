"""Nsight Systems SQLite exports of a simulated job (:mod:`trainperf.tracegen.nsys_job`), written table by table
as ``nsys export --type=sqlite`` lays them out, in several schema generations:

* ``"3.25"``: the current layout (Nsight Systems 2026.2, export schema 3.25, as the real capture in
  tests/data/nsys has it): ENUM_* tables, ``globalPid`` on GPU rows, ``TARGET_INFO_GPU`` with the compute
  capability, ``TARGET_INFO_CUDA_DEVICE`` mapping a process's CUDA ordinal to the GPU's id (the GPU ids
  here are not the ordinals, as on a machine where ``CUDA_VISIBLE_DEVICES`` reorders them), NVTX payload
  columns (``jsonText``: NCCL's communicator rank), GPU metrics named ``SM Active [Throughput %]``...
* ``"2.x"``: an older layout (a synthetic one, modeled on the columns the 2021-era schema reference lists):
  no ENUM_* tables, no ``TARGET_INFO_CUDA_DEVICE``, a ``TARGET_INFO_GPU`` without the compute capability
  (only the chip name says it), no NVTX payload columns, older metric names (``SM Active``, ``Tensor
  Active / FP16 Active``), API names already versioned.
* ``"1.x"``: the oldest (synthetic, modeled on the 2020.1 reference): no ``META_DATA_EXPORT``, no
  ``globalPid`` on GPU rows, kernel names in ``shortName`` only, copies without ``srcKind`` / ``dstKind``,
  NVTX ranges without ``textId`` / ``domainId``, no GPU table, no sync records, no GPU metrics, API names
  without a version suffix.

:func:`make_export` writes one job; :func:`make_pair` a before/after pair (one cause removed);
:func:`make_large` an export grown to a size by repeating steady-state steps (the memory benchmark).
"""

from __future__ import annotations

import os
import sqlite3

import numpy as np
from pathlib import Path
from typing import Any, Iterable

from trainperf.tracegen.nsys_job import DEVICES, Job, Proc, gpu_samples, simulate

SCHEMAS = ("3.25", "2.x", "1.x")
_SUFFIX = {"cudaLaunchKernel": "_v7000", "cudaMemcpyAsync": "_v3020", "cudaMemsetAsync": "_v3020",
           "cudaStreamSynchronize": "_v3020", "cudaMalloc": "_v3020", "cudaFree": "_v3020"}
KERNEL_COLS = ["start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
               "demangledName", "shortName", "mangledName", "launchType", "cacheConfig", "registersPerThread",
               "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
               "localMemoryPerThread", "localMemoryTotal", "gridId", "sharedMemoryExecuted", "graphNodeId",
               "sharedMemoryLimitConfig"]
MEMCPY_COLS = ["start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
               "bytes", "copyKind", "deprecatedSrcId", "srcKind", "dstKind", "srcDeviceId", "srcContextId",
               "dstDeviceId", "dstContextId", "migrationCause", "graphNodeId", "virtualAddress", "copyCount"]
MEMSET_COLS = ["start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
               "value", "bytes", "graphNodeId", "memKind"]
RUNTIME_COLS = ["start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId"]
NVTX_COLS = ["start", "end", "eventType", "rangeId", "category", "color", "text", "globalTid", "endGlobalTid",
             "textId", "domainId", "uint64Value", "int64Value", "doubleValue", "uint32Value", "int32Value",
             "floatValue", "jsonTextId", "jsonText", "binaryData"]
GPU_COLS = ["id", "name", "busLocation", "isDiscrete", "l2CacheSize", "totalMemory", "memoryBandwidth", "clockRate",
            "smCount", "uuid", "chipName", "cuDevice", "computeMajor", "computeMinor", "threadsPerWarp",
            "maxWarpsPerSm", "maxShmemPerSm", "maxShmemPerBlock", "maxRegistersPerBlock"]
DROP = {  # the columns an older generation lacks
    "2.x": {"KERNEL": {"greenContextId", "mangledName", "sharedMemoryExecuted", "graphNodeId",
                       "sharedMemoryLimitConfig"},
            "MEMCPY": {"greenContextId", "srcDeviceId", "srcContextId", "dstDeviceId", "dstContextId",
                       "graphNodeId", "virtualAddress", "copyCount"},
            "MEMSET": {"greenContextId", "graphNodeId"}, "RUNTIME": {"callchainId"},
            "NVTX": {"endGlobalTid", "uint64Value", "int64Value", "doubleValue", "uint32Value", "int32Value",
                     "floatValue", "jsonTextId", "jsonText", "binaryData"},
            "GPU": {"computeMajor", "computeMinor", "threadsPerWarp", "maxWarpsPerSm", "maxShmemPerSm",
                    "maxShmemPerBlock", "maxRegistersPerBlock"}},
    "1.x": {"KERNEL": {"greenContextId", "globalPid", "demangledName", "mangledName", "sharedMemoryExecuted",
                       "graphNodeId", "sharedMemoryLimitConfig", "launchType"},
            "MEMCPY": {"greenContextId", "globalPid", "srcKind", "dstKind", "srcDeviceId", "srcContextId",
                       "dstDeviceId", "dstContextId", "migrationCause", "graphNodeId", "virtualAddress", "copyCount"},
            "MEMSET": {"greenContextId", "globalPid", "graphNodeId", "memKind"},
            "RUNTIME": {"eventClass", "callchainId"},
            "NVTX": {"endGlobalTid", "textId", "domainId", "uint64Value", "int64Value", "doubleValue", "uint32Value",
                     "int32Value", "floatValue", "jsonTextId", "jsonText", "binaryData"}},
}
OLD_METRIC_NAMES = {"SM Active [Throughput %]": "SM Active", "SM Issue [Throughput %]": "SM Issue",
                    "Tensor Active [Throughput %]": "Tensor Active / FP16 Active",
                    "DRAM Read Bandwidth [Throughput %]": "DRAM Read Bandwidth",
                    "DRAM Write Bandwidth [Throughput %]": "DRAM Write Bandwidth",
                    "GR Active [Throughput %]": "GR Active"}
ENUM_MEMCPY = [(0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
               (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
               (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer")]
ENUM_MEM = [(0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"), (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
            (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"), (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown")]
NCCL_DOMAIN = 1
GPU_ID_OFFSET = 10  # 3.25: the GPU's id is not its CUDA ordinal (TARGET_INFO_CUDA_DEVICE maps them)


def global_pid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


class _Strings(dict):
    def __missing__(self, key: str) -> int:
        v = self[key] = len(self) + 1
        return v


class Writer:
    """The tables of one export, in one schema generation."""

    def __init__(self, path: Path, schema: str):
        if schema not in SCHEMAS:
            raise ValueError(f"schema {schema!r}: one of {SCHEMAS}")
        self.path, self.schema = Path(path), schema
        if self.path.exists():
            self.path.unlink()
        self.db = sqlite3.connect(str(self.path))
        self.db.execute("PRAGMA journal_mode = OFF")
        self.db.execute("PRAGMA synchronous = OFF")
        self.strings = _Strings()
        self.cols = {t: [c for c in cols if c not in DROP.get(schema, {}).get(t, set())]
                     for t, cols in (("KERNEL", KERNEL_COLS), ("MEMCPY", MEMCPY_COLS), ("MEMSET", MEMSET_COLS),
                                     ("RUNTIME", RUNTIME_COLS), ("NVTX", NVTX_COLS), ("GPU", GPU_COLS))}
        tables = {"KERNEL": "CUPTI_ACTIVITY_KIND_KERNEL", "MEMCPY": "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "MEMSET": "CUPTI_ACTIVITY_KIND_MEMSET", "RUNTIME": "CUPTI_ACTIVITY_KIND_RUNTIME",
                  "NVTX": "NVTX_EVENTS"}
        self.table = tables
        for key, name in tables.items():
            self.db.execute(f"CREATE TABLE {name} ({', '.join(f'[{c}]' for c in self.cols[key])})")
        self.db.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")

    def call_name(self, name: str) -> str:
        return name if self.schema == "1.x" else name + _SUFFIX.get(name, "_v3020")

    def _insert(self, key: str, full: list[str], rows: Iterable[tuple]) -> None:
        idx = [full.index(c) for c in self.cols[key]]
        marks = ",".join("?" * len(idx))
        self.db.executemany(f"INSERT INTO {self.table[key]} VALUES ({marks})",
                            (tuple(r[i] for i in idx) for r in rows))

    # ------------------------------------------------------------------ events
    def process(self, p: Proc, *, offset_ns: int = 0, corr_offset: int = 0, op_offset: int = 0,
                job: Job | None = None, first: bool = True) -> None:
        """Write one process's events (``offset_ns`` / ``corr_offset`` / ``op_offset``: a repeated copy)."""
        S, o, co = self.strings, offset_ns, corr_offset
        gp = global_pid(p.pid)
        gt = gp | p.tid
        dev = p.device
        self._insert("KERNEL", KERNEL_COLS, (
            (s + o, e + o, dev, 1, None, st, c + co, gp, S[k[0]], S[_short(k[0])], S["_Z" + _short(k[0])], 1, 0, k[3],
             *k[1], *k[2], k[4], k[5], 0, 0, c + co, k[4] + k[5], None, 0) for s, e, st, k, c in p.kernels))
        self._insert("MEMCPY", MEMCPY_COLS, (
            (s + o, e + o, dev, 1, None, st, c + co, gp, n, kind, None, src, dst, dev, 1, dev, 1, None, None, None, 1)
            for s, e, st, kind, src, dst, n, c in p.copies))
        self._insert("MEMSET", MEMSET_COLS, ((s + o, e + o, dev, 1, None, st, c + co, gp, 0, n, None, 2)
                                             for s, e, st, n, c in p.sets))
        self._insert("RUNTIME", RUNTIME_COLS, ((s + o, e + o, 0, gt, c + co, S[self.call_name(n)], 0, None)
                                               for s, e, n, c in p.calls))
        self._insert("NVTX", NVTX_COLS, (self._nvtx(r, gt, o, op_offset) for r in p.ranges))
        if first and job is not None and job.step_range:
            self._insert("NVTX", NVTX_COLS, ((s + o, e + o, 59, None, None, None, job.step_range, gt, gt, None, 0,
                                              *([None] * 9)) for s, e in p.steps))

    def _nvtx(self, r: tuple, gt: int, o: int, op_offset: int) -> tuple:
        s, e, name, role, oid = r
        if role == "nccl":
            text, dom = name, NCCL_DOMAIN
        elif role == "op":
            text, dom = f"{name}, seq = {oid + op_offset}, op_id = {oid + op_offset}", 0
        else:
            text, dom = f"{name}, op_id = {oid + op_offset}", 0
        return (s + o, e + o, 59, None, None, None, text, gt, gt, None, dom, *([None] * 9))

    def nccl_domain(self, p: Proc, rank: int, ranks: int) -> None:
        gt = global_pid(p.pid) | p.tid
        t0 = p.steps[0][0] - 2_000_000
        rows = [(t0, None, 75, None, None, None, "NCCL", gt, None, None, NCCL_DOMAIN, *([None] * 9))]
        js = (f'{{"NCCL communicator ID": {0xC0FFEE}, "No. of ranks": {ranks}, "Rank": {rank}, '
              f'"CUDA device": {p.device}}}')
        rows.append((t0 + 1000, t0 + 900_000, 59, None, None, None, "ncclCommInitRank", gt, gt, None, NCCL_DOMAIN,
                     None, None, None, None, None, None, None, js, None))
        self._insert("NVTX", NVTX_COLS, rows)

    # ------------------------------------------------------------------ the rest of the export
    def finish(self, procs: list[Proc], job: Job, metrics: dict[int, dict] | None) -> None:
        db, sch = self.db, self.schema
        dev = DEVICES[job.device]
        if sch != "1.x":
            db.execute("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)")
            version = {"3.25": "3.25.0", "2.x": "2.7.1"}[sch]
            db.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [
                ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_SCHEMA_VERSION", version),
                ("EXPORT_PRODUCT_VERSION", "2026.2.1.210" if sch == "3.25" else "2021.5.2.53"),
                ("EXPORT_PARAM_TIME_NORMALIZE", "false"), ("GENERATED_BY", "trainperf.tracegen.nsys")])
        db.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, "
                   "systemClockNs INTEGER)")
        db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?, ?)",
                   (1_780_000_000_000_000_000, "2026-05-28T00:00:00", "2026-05-28T00:00:00", job.start_ns - 5 * 10**9))
        db.execute("CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT)")
        db.executemany("INSERT INTO PROCESSES VALUES (?, ?, ?)", [(global_pid(p.pid), p.pid, "python3") for p in procs])
        devices = sorted({p.device for p in procs})
        if sch != "1.x":
            cols = self.cols["GPU"]
            db.execute(f"CREATE TABLE TARGET_INFO_GPU ({', '.join(cols)})")
            gid = (lambda d: d + GPU_ID_OFFSET) if sch == "3.25" else (lambda d: d)
            full = [(gid(d), dev["name"], f"0000:{d + 0x18:02x}:00.0", 1, 52428800, dev["memory"], dev["bandwidth"],
                     1980000000, dev["num_sms"], f"GPU-{d:08x}-0000", dev["chip"], d if sch != "3.25" else None,
                     dev["cc"][0], dev["cc"][1], 32, dev["threads_per_sm"] // 32, dev["smem_per_sm"], 232448, 65536)
                    for d in devices]
            idx = [GPU_COLS.index(c) for c in cols]
            db.executemany(f"INSERT INTO TARGET_INFO_GPU VALUES ({','.join('?' * len(cols))})",
                           [tuple(r[i] for i in idx) for r in full])
        if sch == "3.25":
            db.execute("CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER, uuid TEXT, "
                       "numMultiprocessors INTEGER, computeMajor INTEGER, computeMinor INTEGER)")
            db.executemany("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(p.device + GPU_ID_OFFSET, p.device, p.pid, f"GPU-{p.device:08x}-0000", dev["num_sms"],
                             *dev["cc"]) for p in procs])
            for name, rows in (("ENUM_CUDA_MEMCPY_OPER", ENUM_MEMCPY), ("ENUM_CUDA_MEM_KIND", ENUM_MEM)):
                db.execute(f"CREATE TABLE {name} (id INTEGER, name TEXT, label TEXT)")
                db.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", rows)
        if metrics and sch != "1.x":
            self._metrics(metrics, devices)
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", ((i, s) for s, i in self.strings.items()))
        db.commit()
        db.close()

    def _metrics(self, metrics: dict[int, dict], devices: list[int]) -> None:
        db = self.db
        db.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, "
                   "metricId INTEGER, metricName TEXT)")
        db.execute("CREATE TABLE GPU_METRICS (typeId INTEGER, timestamp INTEGER, metricId INTEGER, value INTEGER)")
        for d, m in metrics.items():
            type_id = (1 << 8) | ((d + GPU_ID_OFFSET) if self.schema == "3.25" else d)
            for mid, (name, values) in enumerate(m["values"].items()):
                shown = name if self.schema == "3.25" else OLD_METRIC_NAMES.get(name, name)
                db.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, ?, ?, ?)",
                           (type_id, 0, "GPU metrics", mid, shown))
                db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)",
                               ((type_id, t, mid, v) for t, v in zip(m["timestamp"], values)))


def _short(name: str) -> str:
    """nsys's shortName: the function's base name (no return type, template arguments or parameters)."""
    base = name.split("(", 1)[0]
    if base.startswith("void "):
        base = base[5:]
    base = base.split("<", 1)[0]
    return base.rsplit("::", 1)[-1]


def make_export(path: str | Path, job: Job | None = None, *, schema: str = "3.25", gpu_metrics: bool = False,
                procs: list[Proc] | None = None) -> dict[str, Any]:
    """Simulate ``job`` and write it as an export; returns what was written (the processes' events, the GPU
    metrics samples per device) for the tests' answers."""
    job = job or Job()
    procs = procs if procs is not None else simulate(job)
    w = Writer(Path(path), schema)
    samples: dict[int, dict] = {}
    for p in procs:
        w.process(p, job=job)
        if job.ranks > 1 and schema != "1.x":
            w.nccl_domain(p, p.rank, job.ranks)
        if gpu_metrics and p.device not in samples:
            samples[p.device] = gpu_samples(p)
    w.finish(procs, job, samples if gpu_metrics else None)
    return {"path": str(path), "job": job, "procs": procs, "schema": schema, "gpu_metrics": samples}


def steady_step_ns(p: Proc, last: int) -> float:
    """The simulation's answer for a step's time: the median period between the last ``last`` step starts (once
    the launch queue has filled, every step starts one period after the one before)."""
    starts = [s for s, _ in p.steps]
    tail = [b - a for a, b in list(zip(starts, starts[1:]))[-last:]]
    return float(np.median(tail)) if tail else float("nan")


def make_pair(directory: str | Path, cause: str, job: Job | None = None, *, schema: str = "3.25",
              gpu_metrics: bool = False) -> dict[str, Any]:
    """``before.sqlite`` (the job with ``cause``) and ``after.sqlite`` (the same job without it), and each one's
    steady-state step time from the simulation (the median period of the second half of the steps): the
    speed-up's answer, ``speedup`` = before / after."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    base = job or Job(steps=12)
    before = Job(**{**base.__dict__, "causes": tuple(sorted(set(base.causes) | {cause}))})
    after = Job(**{**base.__dict__, "causes": tuple(c for c in before.causes if c != cause)})
    out: dict[str, Any] = {}
    for name, j in (("before", before), ("after", after)):
        got = make_export(d / f"{name}.sqlite", j, schema=schema, gpu_metrics=gpu_metrics)
        out[name] = {"path": got["path"], "causes": j.causes,
                     "step_ns": steady_step_ns(got["procs"][0], max(2, j.steps // 2))}
    out["speedup"] = out["before"]["step_ns"] / out["after"]["step_ns"]
    out["removed"] = cause
    return out


def make_large(path: str | Path, size_bytes: int, job: Job | None = None, *, schema: str = "3.25",
               chunk_steps: int = 50) -> dict[str, Any]:
    """An export of at least ``size_bytes``: the job's last simulated step repeated (times, correlation and
    op ids shifted), ``chunk_steps`` steps per transaction, until the file is that large."""
    job = job or Job(steps=3, ranks=2, layers=8)
    procs = simulate(job)
    w = Writer(Path(path), schema)
    period = max(e for p in procs for _, e in p.steps) - min(s for p in procs for s, _ in p.steps) + 50_000
    n = 0
    pattern = [_last_step(p) for p in procs]
    while True:
        for _ in range(chunk_steps):
            for p in pattern:
                w.process(p, offset_ns=n * period, corr_offset=n * 100_000, op_offset=n * 100_000, job=job)
            n += 1
        w.db.commit()
        if os.path.getsize(w.path) >= size_bytes:
            break
    w.finish(procs, job, None)
    return {"path": str(path), "steps": n, "ranks": len(procs), "bytes": os.path.getsize(path),
            "kernels_per_step": sum(len(p.kernels) for p in pattern), "calls_per_step": sum(len(p.calls) for p in
                                                                                           pattern),
            "ranges_per_step": sum(len(p.ranges) + 1 for p in pattern)}


def _last_step(p: Proc) -> Proc:
    """The events of a process's last step, shifted to start at its first step's start."""
    s0, e0 = p.steps[-1]
    shift = s0 - p.steps[0][0]

    def moved(rows):
        return [(r[0] - shift, r[1] - shift, *r[2:]) for r in rows]
    q = Proc(rank=p.rank, pid=p.pid, device=p.device, tid=p.tid)
    q.calls = moved(c for c in p.calls if s0 <= c[0] < e0)
    q.ranges = moved(r for r in p.ranges if s0 <= r[0] < e0)
    launched = {c[3] for c in q.calls}  # the GPU work this step launched, whenever it ran
    q.kernels = moved(k for k in p.kernels if k[4] in launched)
    q.copies = moved(k for k in p.copies if k[7] in launched)
    q.sets = moved(k for k in p.sets if k[4] in launched)
    q.steps = [(s0 - shift, e0 - shift)]
    return q


__all__ = ["SCHEMAS", "Writer", "make_export", "make_large", "make_pair", "steady_step_ns"]

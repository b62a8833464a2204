"""The torch.profiler (Kineto) trace of a job simulated by :mod:`trainperf.tracegen.nsys_job`: the same events
at the same nanoseconds as its Nsight Systems export, written as Kineto writes them (torch >= 2.4: float
microseconds with nanosecond decimals), one file per rank. So the same job read from either file must give
the same figures.

=============================  ======================================================================
simulated                      Kineto
=============================  ======================================================================
the step (NVTX ``train_step``)  ``ProfilerStep#N`` (``user_annotation``)
an op (emit_nvtx ``aten::mm``)  ``cpu_op`` with an ``External id``; its launches carry that id
an annotation                   ``user_annotation`` (DataLoader ``__next__``, ``Optimizer.step#...``)
a runtime call                  ``cuda_runtime`` (``cudaLaunchKernel``...), ``correlation``
a kernel                        ``kernel`` with grid, block, registers, shared memory and Kineto's
                                ``blocks per SM`` / ``est. achieved occupancy %`` for the job's GPU
a copy / fill                   ``gpu_memcpy`` ``Memcpy HtoD (Pinned -> Device)`` / ``gpu_memset``
NCCL's NVTX domain              nothing (Kineto does not record NVTX); ``distributedInfo`` gives the rank
=============================  ======================================================================
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from trainperf.trace.nsys.occupancy import estimate, limits
from trainperf.tracegen.nsys_job import DEVICES, Job, Proc, simulate

_MEM = {0: "Pageable", 1: "Pinned", 2: "Device"}
_COPY = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def device_properties(job: Job, device: int) -> dict[str, Any]:
    d = DEVICES[job.device]
    return {"id": device, "name": d["name"], "totalGlobalMem": d["memory"], "computeMajor": d["cc"][0],
            "computeMinor": d["cc"][1], "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": d["threads_per_sm"],
            "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
            "sharedMemPerMultiprocessor": d["smem_per_sm"], "numSms": d["num_sms"], "sharedMemPerBlockOptin": 232448}


def events(p: Proc, job: Job) -> list[dict]:
    """Every Kineto event of one process, in time order."""
    d = DEVICES[job.device]
    lim = limits(d["cc"], d["num_sms"], {"threads_per_sm": d["threads_per_sm"], "smem_per_sm": d["smem_per_sm"]})
    out: list[dict] = []
    cpu = {"pid": p.pid, "tid": p.tid}
    for n, (s, e) in enumerate(p.steps):
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", **cpu, "ts": _us(s),
                    "dur": _us(e - s), "args": {"External id": 0}})
    ext_of: dict[int, int] = {}  # correlation id -> the innermost op's External id
    ops = sorted((r for r in p.ranges if r[3] != "nccl"), key=lambda r: (r[0], -r[1]))
    for s, e, name, role, oid in ops:
        out.append({"ph": "X", "cat": "cpu_op" if role == "op" else "user_annotation", "name": name, **cpu,
                    "ts": _us(s), "dur": _us(e - s), "args": {"External id": oid}})
    op_bounds = [(s, e, oid) for s, e, _, role, oid in ops if role == "op"]
    for s, e, name, c in p.calls:
        inner = [oid for a, b, oid in op_bounds if a <= s and e <= b]
        ext_of[c] = inner[-1] if inner else 0
        out.append({"ph": "X", "cat": "cuda_runtime", "name": name, **cpu, "ts": _us(s), "dur": _us(e - s),
                    "args": {"correlation": c, "External id": ext_of[c], "cbid": 211}})
    if p.kernels:
        grid = np.array([np.prod(k[3][1]) for k in p.kernels])
        block = np.array([np.prod(k[3][2]) for k in p.kernels])
        regs = np.array([k[3][3] for k in p.kernels])
        smem = np.array([k[3][4] + k[3][5] for k in p.kernels])
        bps, occ = estimate(grid, block, regs, smem, np.zeros_like(smem), lim)
    for i, (s, e, st, k, c) in enumerate(p.kernels):
        out.append({"ph": "X", "cat": "kernel", "name": k[0], "pid": p.device, "tid": st, "ts": _us(s),
                    "dur": _us(e - s), "args": {
                        "External id": ext_of.get(c, 0), "queued": 0, "device": p.device, "context": 1, "stream": st,
                        "correlation": c, "registers per thread": k[3], "shared memory": k[4] + k[5],
                        "blocks per SM": float(bps[i]), "warps per SM": float(bps[i]) * int(block[i]) / 32.0,
                        "grid": list(k[1]), "block": list(k[2]), "est. achieved occupancy %": int(occ[i])}})
    for s, e, st, kind, src, dst, nbytes, c in p.copies:
        out.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {_COPY[kind]} ({_MEM[src]} -> {_MEM[dst]})",
                    "pid": p.device, "tid": st, "ts": _us(s), "dur": _us(e - s),
                    "args": {"External id": ext_of.get(c, 0), "device": p.device, "context": 1, "stream": st,
                             "correlation": c, "bytes": nbytes, "memory bandwidth (GB/s)": nbytes / max(e - s, 1)}})
    for s, e, st, nbytes, c in p.sets:
        out.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": p.device, "tid": st,
                    "ts": _us(s), "dur": _us(e - s), "args": {"External id": ext_of.get(c, 0), "device": p.device,
                                                              "context": 1, "stream": st, "correlation": c,
                                                              "bytes": nbytes}})
    out.sort(key=lambda ev: ev["ts"])
    return out


def make_traces(directory: str | Path, job: Job | None = None, *, procs: list[Proc] | None = None,
                gz: bool = False) -> dict[str, Any]:
    """One trace per rank in ``directory`` (``rank{r}.pt.trace.json[.gz]``); returns their paths and the events."""
    job = job or Job()
    procs = procs if procs is not None else simulate(job)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in procs:
        doc = {"schemaVersion": 1, "deviceProperties": [device_properties(job, p.device)],
               "displayTimeUnit": "ms", "traceName": f"rank{p.rank}", "baseTimeNanoseconds": 0}
        if job.ranks > 1:
            doc["distributedInfo"] = {"backend": "nccl", "rank": p.rank, "world_size": job.ranks}
        path = d / f"rank{p.rank}.pt.trace.json{'.gz' if gz else ''}"
        body = json.dumps(doc)[:-1] + ', "traceEvents": [\n' + \
            ",\n".join(json.dumps(ev) for ev in events(p, job)) + "\n]}\n"
        if gz:
            with gzip.GzipFile(path, "wb", mtime=0) as f:
                f.write(body.encode())
        else:
            path.write_text(body)
        paths.append(str(path))
    return {"paths": paths, "job": job, "procs": procs}


__all__ = ["device_properties", "events", "make_traces"]

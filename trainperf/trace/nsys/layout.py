"""What an export holds, before any event is read: its ranks (a GPU of a process; each process on a shared GPU
its own rank), each rank's device (``TARGET_INFO_GPU`` / ``TARGET_INFO_CUDA_DEVICE``), the process name,
NCCL's rank when NCCL's NVTX payloads say it, and the capture's clock (``TARGET_INFO_SESSION_START_TIME``).
Everything here is a grouped or small query: no event row reaches Python."""

from __future__ import annotations

import re
from typing import Any

from trainperf.trace.nsys.nvtx import domains
from trainperf.trace.nsys.reader import RankSpec
from trainperf.trace.nsys.schema import (CUDA_DEVICE, GPU_TABLE, KERNEL, MEMCPY, MEMSET, NVTX, Export, pid_number,
                                         process_of)

_RANK_JSON = re.compile(r'"Rank"\s*:\s*(\d+)')
_NRANKS_JSON = re.compile(r'"No\. of ranks"\s*:\s*(\d+)')
_DEV_JSON = re.compile(r'"CUDA device"\s*:\s*(\d+)')
# chip (TARGET_INFO_GPU.chipName) or product name -> compute capability, for exports that do not record it
_CHIP_CC = [(r"^GV10|V100", (7, 0)), (r"^TU10|T4\b|RTX 20", (7, 5)), (r"^GA100|A100|A800|A30\b", (8, 0)),
            (r"^GA10[2-7]|A10\b|A40|RTX 30|RTX A", (8, 6)), (r"^AD10|L4\b|L40|RTX 40", (8, 9)),
            (r"^GH100|H100|H200|H800|GH200", (9, 0)), (r"^GB10|B100|B200|GB200|B300", (10, 0)),
            (r"^GB20|RTX 50|RTX PRO", (12, 0))]
# TARGET_INFO_GPU column -> the occupancy limit it sets (values the capture recorded win over the table)
_LIMIT_COLS = {"smem_per_sm": ("maxShmemPerSm", "sharedMemPerMultiprocessor"),
               "blocks_per_sm": ("maxBlocksPerSm",), "regs_per_sm": ("maxRegistersPerSm", "regsPerMultiprocessor")}


def _table(exp: Export, name: str) -> list[dict[str, Any]]:
    if name not in exp.tables:
        return []
    cols = exp.tables[name]
    quoted = ", ".join(f'"{c}"' for c in cols)
    return [dict(zip(cols, r)) for chunk in exp.rows(f'SELECT {quoted} FROM "{name}" LIMIT 4096') for r in chunk]


def _first(row: dict, *keys: str) -> Any:
    return next((row[k] for k in keys if row.get(k) not in (None, "")), None)


def device_info(exp: Export, gpus: list[dict], cuda: list[dict], pid: int | None, dev: int | None) -> dict[str, Any]:
    """The GPU a rank ran on: {"name", "cc", "num_sms", "memory_bytes", "gpu_id", "limits", "from"}; ``from``
    None when the export does not say (its GPU tables are missing or stripped)."""
    row, how = None, None
    for c in cuda:  # the process's CUDA ordinal -> the GPU's id
        if _first(c, "cudaId", "cuDevice", "deviceId") == dev and (
                pid is None or c.get("pid") in (None, pid_number(pid), pid)):
            gid = _first(c, "gpuId", "id")
            row = next((g for g in gpus if g.get("id") == gid), None) or c
            how = CUDA_DEVICE
            break
    if row is None:
        row = next((g for g in gpus if g.get("cuDevice") == dev), None) or \
            next((g for g in gpus if g.get("id") == dev), None) or (gpus[0] if len(gpus) == 1 else None)
        how = GPU_TABLE if row is not None else None
    if row is None:
        return {"name": None, "cc": None, "num_sms": None, "memory_bytes": None, "gpu_id": dev, "limits": {},
                "from": None}
    major = _first(row, "computeMajor", "smMajor", "major")
    minor = _first(row, "computeMinor", "smMinor", "minor")
    warps = _first(row, "maxWarpsPerSm")
    limits = {k: _first(row, *cols) for k, cols in _LIMIT_COLS.items()}
    if warps:
        limits["threads_per_sm"] = int(warps) * int(_first(row, "threadsPerWarp", "warpSize") or 32)
    cc = (int(major), int(minor)) if major is not None and minor is not None else None
    if cc is None:  # an older export: the chip's or product's name says it
        text = f"{row.get('chipName') or ''}\n{row.get('name') or ''}"
        cc = next((c for pat, c in _CHIP_CC if re.search(pat, text, re.M)), None)
    return {"name": _first(row, "name", "chipName"), "cc": cc,
            "num_sms": _first(row, "smCount", "numMultiprocessors", "multiProcessorCount"),
            "memory_bytes": _first(row, "totalMemory", "totalGlobalMem"), "gpu_id": _first(row, "id", "gpuId"),
            "limits": limits, "from": how}


def _groups(exp: Export) -> dict[tuple, dict[str, float]]:
    """(globalPid or None, deviceId) -> kernel count, kernel ns, copy/fill count."""
    out: dict[tuple, dict[str, float]] = {}
    for table in (KERNEL, MEMCPY, MEMSET):
        if not exp.has(table, "start"):
            continue
        pid = "globalPid" if exp.has(table, "globalPid") else "NULL"
        dev = "deviceId" if exp.has(table, "deviceId") else "0"
        for chunk in exp.rows(f'SELECT {pid}, {dev}, count(*), sum("end" - start) FROM {table} GROUP BY 1, 2'):
            for p, d, n, ns in chunk:
                g = out.setdefault((None if p is None else int(p), int(d or 0)), {"kernels": 0, "kernel_ns": 0.0,
                                                                                  "other": 0})
                if table == KERNEL:
                    g["kernels"] += int(n)
                    g["kernel_ns"] += float(ns or 0)
                else:
                    g["other"] += int(n)
    return out


def _processes(exp: Export) -> dict[int, str]:
    if not exp.has("PROCESSES", "globalPid"):
        return {}
    return {int(r["globalPid"]): str(r.get("name") or "") for r in _table(exp, "PROCESSES") if r.get("globalPid")}


def nccl_ranks(exp: Export, nccl: dict[int, set[int]]) -> dict[tuple, tuple[int, int | None]]:
    """(globalPid, CUDA device or None) -> (NCCL rank, number of ranks), from NCCL's NVTX payloads when the export
    holds them as JSON (``jsonText``); the communicator with the most ranks wins."""
    if not nccl or not exp.has(NVTX, "jsonText") or not exp.has(NVTX, "domainId"):
        return {}
    ids = sorted({d for ds in nccl.values() for d in ds})
    sql = (f"SELECT globalTid, domainId, jsonText FROM {NVTX} WHERE jsonText LIKE '%\"Rank\"%' "
           f"AND domainId IN ({','.join('?' * len(ids))})")
    best: dict[tuple, tuple[int, int | None]] = {}
    for chunk in exp.rows(sql, tuple(ids)):
        for tid, dom, js in chunk:
            p = process_of(tid or 0)
            if dom not in nccl.get(p, ()):
                continue
            m = _RANK_JSON.search(js or "")
            if not m:
                continue
            n = _NRANKS_JSON.search(js)
            d = _DEV_JSON.search(js)
            key = (p, int(d.group(1)) if d else None)
            got = (int(m.group(1)), int(n.group(1)) if n else None)
            if key not in best or (got[1] or 0) > (best[key][1] or 0):
                best[key] = got
    return best


def session_base_us(exp: Export) -> float:
    """The epoch (us) of the export's time 0, so ranks from several captures share one clock; 0 unknown."""
    rows = _table(exp, "TARGET_INFO_SESSION_START_TIME")
    if not rows or rows[0].get("utcEpochNs") is None:
        return 0.0
    r = rows[0]
    normalized = exp.meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false") == "true"
    clock = 0 if normalized else int(r.get("systemClockNs") or 0)
    return (int(r["utcEpochNs"]) - clock) / 1000.0


def find_ranks(exp: Export) -> tuple[list[RankSpec], list[str]]:
    """The export's ranks, in (device, pid) order, and notes on how they were found."""
    notes: list[str] = []
    groups = _groups(exp)
    gpus, cuda = _table(exp, GPU_TABLE), _table(exp, CUDA_DEVICE)
    procs = _processes(exp)
    nccl_dom: dict[int, set[int]] = {}
    for (p, d), name in domains(exp).items():
        if name == "NCCL":
            nccl_dom.setdefault(p, set()).add(d)
    hints = nccl_ranks(exp, nccl_dom)
    by_pid: dict[Any, list[tuple[int, dict]]] = {}
    for (p, d), g in groups.items():
        by_pid.setdefault(p, []).append((d, g))
    if None in by_pid and len(groups) > 1:
        notes.append("the export's GPU tables have no globalPid (an older export): each GPU is one rank, whatever "
                     "processes shared it")
    specs: list[RankSpec] = []
    for p, devs in by_pid.items():
        with_k = sorted((x for x in devs if x[1]["kernels"]), key=lambda x: -x[1]["kernel_ns"])
        rest = [d for d, g in devs if not g["kernels"]]
        if not with_k and rest:  # a process that only copied: a rank on the GPU it copied to first
            with_k = [(rest.pop(0), {})]
        kdevs = [d for d, _ in with_k]
        for i, d in enumerate(kdevs):
            extra = tuple(rest) if i == 0 else ()
            specs.append(_spec(exp, p, d, (d, *extra), tuple(x for x in kdevs if x != d), i == 0, gpus, cuda, procs,
                               hints, nccl_dom))
        if rest and len(kdevs):
            notes.append(f"pid {pid_number(p) if p is not None else '?'} copied to or filled GPU(s) "
                         f"{', '.join(map(str, rest))} without running kernels there: counted with its GPU {kdevs[0]}")
    if not specs:  # no GPU activity: the processes with NVTX ranges, CPU only
        for p in _nvtx_processes(exp):
            specs.append(_spec(exp, p, None, (), (), True, gpus, cuda, procs, hints, nccl_dom))
    specs.sort(key=lambda s: (s.device if s.device is not None else -1, s.pid or 0))
    return specs, notes


def _nvtx_processes(exp: Export) -> list[int | None]:
    if not exp.has(NVTX, "globalTid"):
        return [None] if exp.has(NVTX) else []
    out: set[int] = set()
    for chunk in exp.rows(f"SELECT DISTINCT globalTid >> 24 FROM {NVTX} WHERE globalTid IS NOT NULL"):
        out.update(int(x) << 24 for (x,) in chunk)
    return sorted(out)


def _spec(exp: Export, p, d, devices, others, main, gpus, cuda, procs, hints, nccl_dom) -> RankSpec:
    dev = device_info(exp, gpus, cuda, p, d) if d is not None else {"name": None, "cc": None, "num_sms": None,
                                                                     "memory_bytes": None, "gpu_id": None,
                                                                     "limits": {}, "from": None}
    hint = hints.get((p, d)) or hints.get((p, None))
    pname = procs.get(p, "") if p is not None else ""
    where = f"GPU {d}" + (f" ({dev['name']})" if dev.get("name") else "") if d is not None else "CPU only"
    who = f"pid {pid_number(p)}" + (f" ({pname})" if pname else "") if p is not None else "process unknown"
    info = {"device": dev, "process": pname or None, "pid": pid_number(p) if p is not None else None,
            "global_pid": p, "nccl_rank": hint[0] if hint else None, "nccl_ranks": hint[1] if hint else None,
            "nccl_domain": bool(nccl_dom.get(p))}
    return RankSpec(pid=p, device=d, devices=devices, others=others, main=main,
                    label=f"{exp.path.name}: {where}, {who}", info=info)


__all__ = ["device_info", "find_ranks", "nccl_ranks", "session_base_us"]

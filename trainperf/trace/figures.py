"""The per-rank figures beyond the two peers: kernels by class, communication per step (exposed or hidden),
copies by direction (pageable or pinned), host syncs inside the steps, tensor cores by generation, the
fp32 GEMMs a tensor core could run, occupancy without the kernels whose low occupancy is by design, the
DataLoader, and the device. All over the analysed steps (the TensorBoard plugin's, see tb.py) unless said."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import intervals as iv
from trainperf.trace.patterns import COMMUNICATION, COMPUTE, MEMORY, Patterns
from trainperf.trace.timeline import GPU_KERNEL, GPU_MEMCPY, Timeline

KIND_CODE = {COMPUTE: 0, COMMUNICATION: 1, MEMORY: 2}
KIND_NAME = {v: k for k, v in KIND_CODE.items()}
HOST_SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                   "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
                   "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy"}
_COLL = [("all_to_all", r"all_?to_?all|alltoall|a2a"), ("ep_dispatch", r"dispatch"), ("ep_combine", r"combine"),
         ("allreduce", r"all_?reduce|cross_device_reduce|one_shot|two_shot"), ("allgather", r"all_?gather"),
         ("reduce_scatter", r"reduce_?scatter"), ("broadcast", r"broadcast|bcast"),
         ("send_recv", r"sendrecv|send_recv|_send|_recv|\bsend|\brecv"), ("reduce", r"reduce")]
_COLL_RE = [(k, re.compile(p, re.I)) for k, p in _COLL]
_DIR_RE = re.compile(r"memcpy\s+(\w+)", re.I)


def classify(tl: Timeline, pats: Patterns) -> dict[str, np.ndarray]:
    """Per GPU event: kind code (0 compute, 1 communication, 2 memory) and the name flags."""
    n = len(tl.names)
    table = np.zeros((max(n, 1), 5), dtype=np.int8)
    for i in unique(tl.g_name).tolist():  # the GPU events' names only (the table also names every CPU event)
        kind, tc, fp32, gemm, ws = pats.describe(tl.names[i])
        table[i] = (KIND_CODE[kind], tc, fp32, gemm, ws)
    row = table[tl.g_name] if tl.g_name.size else np.zeros((0, 5), dtype=np.int8)
    kind = row[:, 0].copy()
    kind[tl.g_kind != GPU_KERNEL] = 2  # copies and fills are memory whatever their name
    flags = row[:, 1:].astype(bool)
    flags[tl.g_kind != GPU_KERNEL] = False
    return {"kind": kind, "tc": flags[:, 0], "fp32": flags[:, 1], "gemm": flags[:, 2], "ws": flags[:, 3]}


def collective_kind(name: str, coll: str | None) -> str:
    text = f"{coll or ''} {name}"
    for k, r in _COLL_RE:
        if r.search(text):
            return k
    return "other"


def per_step_sum(ts: np.ndarray, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum of ``values`` of the events starting in each window."""
    out = np.zeros(lo.size)
    if ts.size == 0 or lo.size == 0:
        return out
    k = np.searchsorted(lo, ts, side="right") - 1
    ok = k >= 0
    ok[ok] = ts[ok] < hi[k[ok]]
    np.add.at(out, k[ok], values[ok])
    return out


def step_of(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    k = np.searchsorted(lo, ts, side="right") - 1 if lo.size else np.full(ts.size, -1)
    ok = k >= 0
    if lo.size:
        ok[ok] = ts[ok] < hi[k[ok]]
    return np.where(ok, k, -1)


def comm(tl: Timeline, cls: dict, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """Communication per step: union of comm kernels, the part not overlapped by compute kernels
    (exposed), the GPU time of non-communication events (compute + copies/fills), per kind. The collectives
    one by one, for matching across ranks: :func:`trainperf.trace.collectives.collectives`."""
    end = tl.g_ts + tl.g_dur
    isc = cls["kind"] == 1
    cu = iv.union(tl.g_ts[isc], end[isc])
    comp = cls["kind"] == 0
    pu = iv.union(tl.g_ts[comp], end[comp])
    non = ~isc
    nu = iv.union(tl.g_ts[non], end[non])
    comm_us = iv.within(cu, lo, hi)
    exposed = iv.within(iv.subtract(cu, pu), lo, hi)
    compute_us = iv.within(nu, lo, hi)
    kinds: dict[str, float] = {}
    streams: dict[str, float] = {}
    idx = np.flatnonzero(isc)
    idx = idx[step_of(tl.g_ts[idx], lo, hi) >= 0]
    names = tl.names
    kind_cache: dict[tuple, str] = {}
    for i in idx:
        key = (tl.g_name[i], tl.g_coll[i])
        k = kind_cache.get(key)
        if k is None:
            k = kind_cache[key] = collective_kind(names[key[0]], names[key[1]] if key[1] >= 0 else None)
        kinds[k] = kinds.get(k, 0.0) + float(tl.g_dur[i])
        streams[str(int(tl.g_stream[i]))] = streams.get(str(int(tl.g_stream[i])), 0.0) + float(tl.g_dur[i])
    nsteps = max(1, lo.size)
    tot_comm = float(comm_us.sum())
    return {"us_per_step": tot_comm / nsteps, "exposed_us_per_step": float(exposed.sum()) / nsteps,
            "hidden_pct": (100 * (1 - float(exposed.sum()) / tot_comm) if tot_comm > 0 else None),
            "us_per_kind": {k: v / nsteps for k, v in sorted(kinds.items(), key=lambda x: -x[1])},
            "streams": sorted(streams, key=lambda s: -streams[s]), "kernels": int(np.count_nonzero(isc)),
            "_step_comm_us": comm_us.tolist(), "_step_exposed_comm_us": exposed.tolist(),
            "_step_compute_us": compute_us.tolist()}


def cpu_comm(tl: Timeline, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    """Communication per step on a trace with no GPU events (gloo on CPU): the union of the collectives' CPU
    spans (``gloo:*`` / ``nccl:*`` ops, the TensorBoard plugin's Communication role; gloo runs them on its
    own threads). Exposed = the part no ``cpu_op`` covers (annotations do not count: one around the whole
    step would hide everything); compute = the step less its exposed communication (the time the rank did
    not wait in a collective). The ops one by one, for the waits across ranks:
    :func:`trainperf.trace.collectives.collectives`."""
    ops = sorted(tl.comm_ops)
    starts = np.array([c[0] for c in ops], dtype=np.float64)
    ends = starts + np.array([c[1] for c in ops], dtype=np.float64)
    cu = iv.union(starts, ends)
    comm_us = iv.within(cu, lo, hi)
    busy = tl.cpu_op_only if tl.cpu_op_only is not None else iv.EMPTY
    exposed = iv.within(iv.subtract(cu, busy), lo, hi)
    st = step_of(starts, lo, hi)
    kinds: dict[str, float] = {}
    for j, (ts, dur, name) in enumerate(ops):
        if st[j] >= 0:
            k = collective_kind(name, None)
            kinds[k] = kinds.get(k, 0.0) + dur
    nsteps = max(1, lo.size)
    tot_comm, tot_exp = float(comm_us.sum()), float(exposed.sum())
    return {"us_per_step": tot_comm / nsteps, "exposed_us_per_step": tot_exp / nsteps,
            "hidden_pct": (100 * (1 - tot_exp / tot_comm) if tot_comm > 0 else None),
            "us_per_kind": {k: v / nsteps for k, v in sorted(kinds.items(), key=lambda x: -x[1])},
            "streams": [], "kernels": 0, "cpu_ops": len(ops), "on": "cpu",
            "_step_comm_us": comm_us.tolist(), "_step_exposed_comm_us": exposed.tolist(),
            "_step_compute_us": np.maximum(0.0, (hi - lo) - exposed).tolist()}


def memcpy(tl: Timeline, lo: np.ndarray, hi: np.ndarray) -> dict[str, Any]:
    m = tl.g_kind == GPU_MEMCPY
    nsteps = max(1, lo.size)
    idx = np.flatnonzero(m)
    st = step_of(tl.g_ts[idx], lo, hi)
    idx = idx[st >= 0]
    by: dict[str, dict[str, float]] = {}
    pageable_us = pinned_us = 0.0
    pageable_n = 0
    names = tl.names
    for nid in unique(tl.g_name[idx]):
        sel = idx[tl.g_name[idx] == nid]
        name = names[nid]
        mm = _DIR_RE.search(name)
        d = mm.group(1) if mm else "unknown"
        us = float(tl.g_dur[sel].sum())
        b = tl.g_bytes[sel]
        row = by.setdefault(d, {"count": 0, "us": 0.0, "bytes": 0.0, "pageable_us": 0.0, "pinned_us": 0.0})
        row["count"] += int(sel.size)
        row["us"] += us
        row["bytes"] += float(np.nansum(b))
        if "pageable" in name.lower():
            row["pageable_us"] += us
            pageable_us += us
            pageable_n += int(sel.size)
        elif "pinned" in name.lower():
            row["pinned_us"] += us
            pinned_us += us
    for row in by.values():
        row["gb_per_s"] = row["bytes"] / (row["us"] * 1e3) if row["us"] > 0 and row["bytes"] > 0 else None
        row["us_per_step"] = row["us"] / nsteps
    return {"by_direction": by, "count": int(idx.size), "us_per_step": float(tl.g_dur[idx].sum()) / nsteps,
            "pageable_us_per_step": pageable_us / nsteps, "pageable_count_per_step": pageable_n / nsteps,
            "pinned_us_per_step": pinned_us / nsteps,
            "definition": "GPU copies started in the analysed steps; direction and pageable/pinned from the "
                          "copy's name (Memcpy HtoD (Pageable -> Device)); a pageable copy blocks the host"}


def host_syncs(tl: Timeline, lo: np.ndarray, hi: np.ndarray) -> tuple[list[dict], dict]:
    """Rows per sync call/op inside the steps, and the blocked time (their union: aten::item contains
    _local_scalar_dense, which contains cudaStreamSynchronize, so the rows overlap)."""
    nsteps = max(1, lo.size)
    rows: dict[str, list] = {}
    spans_s, spans_e = [], []
    names = tl.names
    sync_ids = [i for i, n in enumerate(names) if n in HOST_SYNC_CALLS]
    if sync_ids and tl.r_ts.size:
        m = np.isin(tl.r_name, sync_ids)
        idx = np.flatnonzero(m)
        idx = idx[step_of(tl.r_ts[idx], lo, hi) >= 0]
        for i in idx:
            rows.setdefault(names[tl.r_name[i]], []).append(float(tl.r_dur[i]))
        spans_s.append(tl.r_ts[idx])
        spans_e.append(tl.r_ts[idx] + tl.r_dur[idx])
    if tl.sync_ops:
        ts = np.array([a for a, _, _ in tl.sync_ops])
        du = np.array([d for _, d, _ in tl.sync_ops])
        ok = step_of(ts, lo, hi) >= 0
        for (a, d, n), k in zip(tl.sync_ops, ok):
            if k:
                rows.setdefault(n, []).append(d)
        spans_s.append(ts[ok])
        spans_e.append(ts[ok] + du[ok])
    out = [{"name": n, "count": len(v), "us": float(sum(v)), "count_per_step": len(v) / nsteps,
            "us_per_step": float(sum(v)) / nsteps} for n, v in rows.items()]
    out.sort(key=lambda r: -r["us"])
    blocked = iv.total(iv.union(np.concatenate(spans_s), np.concatenate(spans_e))) if spans_s else 0.0
    return out, {"blocked_us_per_step": blocked / nsteps, "calls": sorted(HOST_SYNC_CALLS),
                 "ops": ["aten::item", "aten::_local_scalar_dense"],
                 "note": "rows overlap (aten::item holds _local_scalar_dense, which holds the stream sync): "
                         "blocked_us_per_step is their union"}


def tensor_cores(tl: Timeline, cls: dict, lo: np.ndarray, hi: np.ndarray, tc_tb: np.ndarray) -> dict[str, Any]:
    nsteps = max(1, lo.size)
    kern = (tl.g_kind == GPU_KERNEL) & (step_of(tl.g_ts, lo, hi) >= 0)
    dur = tl.g_dur
    k_us = float(dur[kern].sum())
    tc_us = float(dur[kern & cls["tc"]].sum())
    fp32 = kern & cls["fp32"]
    gemm = kern & cls["gemm"]
    g_us = float(dur[gemm].sum())
    top: dict[str, float] = {}
    for nid in unique(tl.g_name[fp32]):
        top[tl.names[nid]] = float(dur[fp32 & (tl.g_name == nid)].sum())
    return {"kernel_pct": 100 * tc_us / k_us if k_us > 0 else None,
            "tb_list_pct": 100 * float(dur[kern & tc_tb].sum()) / k_us if k_us > 0 else None,
            "tensor_core_us_per_step": tc_us / nsteps,
            "fp32_eligible_us_per_step": float(dur[fp32].sum()) / nsteps,
            "top_fp32": sorted(top, key=lambda n: -top[n])[:5],
            "gemm_us_per_step": g_us / nsteps,
            "gemm_low_precision_pct": 100 * float(dur[gemm & cls["tc"]].sum()) / g_us if g_us > 0 else None,
            "definition": "kernel time inside the analysed steps; tensor-core and fp32 GEMM/conv kernels by the "
                          "pattern table (trainperf.trace.patterns); tb_list_pct: the TensorBoard plugin's "
                          "Volta/Ampere list alone"}


def occupancy(tl: Timeline, cls: dict, lo: float, hi: float) -> dict[str, Any]:
    """Kernel-time weighted estimated achieved occupancy over the compute kernels that are not
    warp-specialized tensor-core kernels (one large block per SM by design: their low figure is no fault)."""
    kern = (tl.g_kind == GPU_KERNEL) & (cls["kind"] == 0)
    end = tl.g_ts + tl.g_dur
    cd = np.clip(np.minimum(end, hi) - np.maximum(tl.g_ts, lo), 0, None)
    bps = tl.g_bps.astype(np.float64)
    # at most one block per SM: a persistent tensor-core kernel (DeepGEMM's grouped GEMMs run 112 blocks on
    # 132 SMs, 384 threads and 200 KB of shared memory each)
    ws = kern & (cls["ws"] | (cls["tc"] & (bps > 0) & (bps <= 1.05)))
    occ = tl.g_occ.astype(np.float64)
    # Kineto writes 0 when its occupancy calculator fails (opt-in shared memory beyond its limit): a kernel
    # that ran had a block resident, so 0 is "not estimated", not "no warps"
    base = kern & ~ws & np.isfinite(occ) & (occ > 0)
    all_k = float(cd[tl.g_kind == GPU_KERNEL].sum())
    comp = float(cd[kern].sum())
    w = float(cd[base].sum())
    return {"pct": float(np.sum(occ[base] * cd[base]) / w) if w > 0 else None,
            "kernel_share": w / all_k if all_k > 0 else None,
            "warp_specialized_share": float(cd[ws].sum()) / comp if comp > 0 else None,
            "definition": "est. achieved occupancy %, kernel-time weighted, over compute kernels inside the "
                          "steps; communication kernels, warp-specialized tensor-core kernels (wgmma / sm90 / "
                          "sm100 / nvjet / FA3, or a tensor-core kernel at no more than one block per SM) and "
                          "kernels Kineto could not estimate (0) left out"}


def top_kernels(tl: Timeline, cls: dict, mask: np.ndarray, n: int, nsteps: int) -> list[dict]:
    kern = mask & (tl.g_kind == GPU_KERNEL)
    if not kern.any() or n <= 0:
        return []
    ids = tl.g_name[kern]
    dur = tl.g_dur[kern]
    sums = np.bincount(ids, weights=dur, minlength=len(tl.names))
    cnt = np.bincount(ids, minlength=len(tl.names))
    total = float(dur.sum())
    order = np.argsort(-sums)[:n]
    kind = np.zeros(len(tl.names), dtype=np.int8)
    tc = np.zeros(len(tl.names), dtype=bool)
    kind[tl.g_name[kern]] = cls["kind"][kern]
    tc[tl.g_name[kern]] = cls["tc"][kern]
    out = []
    for i in order:
        if cnt[i] == 0:
            break
        sel = dur[ids == i]
        out.append({"name": tl.names[i], "kind": KIND_NAME[int(kind[i])], "tensor_core": bool(tc[i]),
                    "count": int(cnt[i]), "us": float(sums[i]), "us_per_step": float(sums[i]) / max(1, nsteps),
                    "pct": 100 * float(sums[i]) / total if total else None, "mean_us": float(sel.mean()),
                    "min_us": float(sel.min()), "max_us": float(sel.max())})
    return out


_ARCH = [(r"sm_?1[0-2]0[a-z]?_|tcgen05", "10.0"), (r"sm_?90[a-z]?_|wgmma|nvjet|Sm90", "9.0"),
         (r"sm_?89_", "8.9"), (r"sm_?86_", "8.6"), (r"sm_?80_|(?:^|[^a-z])ampere_", "8.0"),
         (r"sm_?75_|(?:^|[^a-z])turing_", "7.5"), (r"sm_?70_|(?:^|[^a-z])volta_", "7.0"),
         (r"(?:^|[^a-z])maxwell_|(?:^|[^a-z])pascal_", "6.0")]


def device(tl: Timeline, dev_id: int | None) -> dict[str, Any] | None:
    props = tl.meta.get("deviceProperties") or tl.meta.get("computeProperties")  # the latter: early Kineto
    if isinstance(props, list) and props:
        pick = next((p for p in props if isinstance(p, dict) and p.get("id") == dev_id), None)
        pick = pick or next((p for p in props if isinstance(p, dict)), None)
        if pick:
            mj, mn = pick.get("computeMajor", pick.get("major")), pick.get("computeMinor", pick.get("minor"))
            cc = f"{mj}.{mn}" if isinstance(mj, int) and isinstance(mn, int) else None
            name = pick.get("name")
            if isinstance(name, str) and ("AMD" in name or "Instinct" in name or "Radeon" in name):
                cc = None  # ROCm reports a gfx version there, not a CUDA compute capability
            return {"id": pick.get("id"), "name": name, "compute_capability": cc, "num_sms": pick.get("numSms", pick.get("multiProcessorCount")),
                    "memory_bytes": pick.get("totalGlobalMem"), "vendor": "AMD" if cc is None and name else "NVIDIA",
                    "from": "deviceProperties", "count": len(props)}
    kern = tl.g_kind == GPU_KERNEL
    if not kern.any():
        return None
    text = "\n".join(tl.names[i] for i in unique(tl.g_name[kern]))
    for pat, cc in _ARCH:
        if re.search(pat, text, re.M):
            return {"id": dev_id, "name": None, "compute_capability": cc, "num_sms": None, "memory_bytes": None,
                    "vendor": "NVIDIA", "from": "kernel names"}
    return {"id": dev_id, "name": None, "compute_capability": None, "num_sms": None, "memory_bytes": None,
            "vendor": None, "from": None}


def dataloader(tl: Timeline, lo: np.ndarray, hi: np.ndarray, role_us: list[float]) -> dict[str, Any]:
    iters = sorted({n.split("#", 1)[1].rsplit(".", 1)[0] for _, _, n in tl.dataloader if "#" in n})
    return {"us_per_step": role_us, "spans": len(tl.dataloader), "iterators": iters,
            "single_process": any("SingleProcess" in i for i in iters),
            "definition": "the TensorBoard plugin's DataLoader role: enumerate(DataLoader)#...__next__ spans "
                          "not covered by GPU work or runtime calls, per step"}


__all__ = ["classify", "collective_kind", "comm", "dataloader", "device", "host_syncs", "memcpy", "occupancy",
           "per_step_sum", "step_of", "tensor_cores", "top_kernels"]

"""The figures the PyTorch Profiler TensorBoard plugin (``torch-tb-profiler`` 0.4.3) shows in its Overview,
by its definitions (read from its ``event_parser.py``, ``overall_parser.py``, ``gpu_metrics_parser.py``,
``tensor_cores_parser.py``), computed on interval arrays:

* **steps**: each ``ProfilerStep#N`` span on the CPU, then moved to the GPU work it launched: a launch
  (runtime/driver call) wholly inside the step's CPU span brings in its kernels/copies; the step ends at
  the later of its CPU end and its last launched GPU event's end, and starts no earlier than the previous
  step's (extended) end (the first: no earlier than the last GPU event launched before any step, when the
  first step launched some). Trailing steps that launched nothing, or under 80% of the previous step's GPU
  events, are dropped (the profiler may have missed their kernels). No ProfilerStep: the CPU span of the
  trace is one step.
* **step-time breakdown**: every instant of a step goes to the first role that covers it, in the order
  Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CPU Exec; the rest is Other. Averages over the
  steps, in % of the average step time. The Kernel role is reported in two parts, ``kernel`` (compute
  kernels) and ``communication`` (time only communication kernels cover, plus the plugin's own
  Communication role: nccl:* CPU ops); their sum is the plugin's Kernel (+ Communication).
* **GPU utilization**: the union of kernel intervals on the device inside [first step start, last step
  end], over that span. **Estimated SM efficiency**: over the same span, each instant weighted by
  min(1, sum of ``blocks per SM`` of the kernels running). **Estimated achieved occupancy**: kernel-time
  weighted mean of ``est. achieved occupancy %``, kernel time clipped to the span. **Tensor-core kernel
  share**: time of kernels on tensor cores over the time of the kernels launched from inside a CPU op (a
  launch call whose External id is an op's), as the plugin walks its op tree.

Two deliberate departures, each making the plugin's intent hold on torch 2.x traces, which 0.4.3 predates:
``cuda_runtime`` / ``cuda_driver`` are its ``Runtime`` (0.4.3 ignores them, so on 2.x traces it sees no
launches), ``user_annotation`` spans are CPU ops (as 1.8's record_function ``Operator`` spans were), and GPU
``gpu_user_annotation`` copies of ``ProfilerStep#N`` are not steps. Communication kernels are those of the
pattern table (the plugin recognises only kernels launched under ``nccl:*`` ops).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainperf.trace.columns import unique

from trainperf.trace import intervals as iv
from trainperf.trace.timeline import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Timeline

ROLES = ("kernel", "communication", "memcpy", "memset", "communication_cpu", "runtime", "dataloader", "cpu_exec")


def launch_index(tl: Timeline) -> np.ndarray:
    """For each GPU event, the index of the runtime/driver call with its correlation id (-1: none)."""
    n = tl.g_ts.size
    out = np.full(n, -1, dtype=np.int64)
    if n == 0 or tl.r_ts.size == 0:
        return out
    order = np.argsort(tl.r_corr, kind="stable")
    rc = tl.r_corr[order]
    pos = np.searchsorted(rc, tl.g_corr, side="right") - 1  # the last call with that id, as the plugin keeps
    ok = (pos >= 0) & (tl.g_corr >= 0)
    ok[ok] = rc[pos[ok]] == tl.g_corr[ok]
    out[ok] = order[pos[ok]]
    return out


def steps(tl: Timeline, launch: np.ndarray) -> dict[str, Any]:
    """The plugin's steps: {"spans": [(start, end)], "numbers", "host": [(start, end)], "found", "notes"}."""
    notes: list[str] = []
    host = [(ts, ts + dur) for ts, dur, _ in tl.steps]
    numbers = [n for _, _, n in tl.steps]
    # one span per ProfilerStep: torch writes each once on the CPU; drop exact repeats
    seen, h2, n2 = set(), [], []
    for span, num in zip(host, numbers):
        if (span, num) not in seen:
            seen.add((span, num))
            h2.append(span)
            n2.append(num)
    host, numbers = h2, n2
    found = "ProfilerStep#N" if host else None
    if not host:
        lo, hi = (tl.cpu_min, tl.cpu_max) if np.isfinite(tl.cpu_min) else (tl.all_min, tl.all_max)
        if not np.isfinite(lo):
            return {"spans": [], "numbers": [], "host": [], "found": None, "notes": ["the trace has no timed events"]}
        host, numbers = [(lo, hi)], [None]
        what = ("no usable ProfilerStep#N (below)" if tl.bad_steps or tl.overlapping_steps or tl.empty_steps
                else "no ProfilerStep#N in the trace")
        notes.append(f"{what}: the whole trace (its CPU span) is one step")
    spans = list(host)
    g_end = tl.g_ts + tl.g_dur
    n = len(spans)
    if tl.g_ts.size and tl.r_ts.size:
        has = launch >= 0
        r_ts = tl.r_ts[launch[has]]
        r_end = r_ts + tl.r_dur[launch[has]]
        starts = np.array([s for s, _ in spans])
        ends = np.array([e for _, e in spans])
        k = np.searchsorted(starts, r_ts, side="right") - 1
        inside = k >= 0
        inside[inside] = r_end[inside] <= ends[k[inside]]
        step_of = np.full(tl.g_ts.size, -1, dtype=np.int64)
        idx = np.flatnonzero(has)
        step_of[idx[inside]] = k[inside]
        m = step_of >= 0
        dev_min = np.full(n, np.inf)
        dev_max = np.full(n, -np.inf)
        np.minimum.at(dev_min, step_of[m], tl.g_ts[m])
        np.maximum.at(dev_max, step_of[m], g_end[m])
        matched = np.bincount(step_of[m], minlength=n)
        if m.any():
            prev = spans[0][0]
            if np.isfinite(dev_min[0]):
                early = (~m) & (g_end < dev_min[0])
                if early.any():
                    prev = max(prev, float(g_end[early].max()))
            for i in range(n):
                s = max(prev, spans[i][0])
                e = spans[i][1]
                e = max(e, s) if not np.isfinite(dev_max[i]) else max(e, float(dev_max[i]), s)
                spans[i] = (s, e)
                prev = e
            if n > 1:
                last = int(np.flatnonzero(matched > 0)[-1])
                keep = last + 1
                if last > 0 and matched[last - 1] * 0.8 > matched[last]:
                    keep = last
                if keep < n:
                    notes.append(f"the last {n - keep} profiler step(s) left out, as the TensorBoard plugin does: "
                                 "they launched no GPU work or under 80% of the previous step's (the profiler "
                                 "stopped before their kernels were recorded)")
                    spans, numbers = spans[:keep], numbers[:keep]
    return {"spans": spans, "numbers": numbers, "host": host[:len(spans)], "found": found, "notes": notes}


def role_sets(tl: Timeline, comm_gpu: np.ndarray) -> list[iv.Set]:
    """The role interval sets, in the plugin's priority order. Its Kernel role (every kernel) is split in two:
    compute kernels first, then communication kernels (the time only they cover); so kernel + communication
    is the plugin's Kernel, and every role below it is the plugin's. The plugin's own Communication role (the
    CPU spans of nccl:* / gloo:* ops, below Memset) is added to communication."""
    end = tl.g_ts + tl.g_dur
    kern = tl.g_kind == GPU_KERNEL

    def u(mask):
        return iv.union(tl.g_ts[mask], end[mask])

    cpu_comm = iv.union([c[0] for c in tl.comm_ops], [c[0] + c[1] for c in tl.comm_ops])
    return [u(kern & ~comm_gpu), u(kern & comm_gpu), u(tl.g_kind == GPU_MEMCPY), u(tl.g_kind == GPU_MEMSET), cpu_comm,
            iv.union(tl.r_ts, tl.r_ts + tl.r_dur),
            iv.union([a for a, _, _ in tl.dataloader], [a + d for a, d, _ in tl.dataloader]), tl.cpu_ops]


def breakdown(spans: list[tuple[float, float]], roles: list[iv.Set]) -> dict[str, Any]:
    """Per-step role costs (us) and the averages, as OverallParser.aggregate."""
    if not spans:
        return {"per_step_us": [], "avg_us": None, "pct": None, "step_time_us": None}
    lo = np.array([s for s, _ in spans])
    hi = np.array([e for _, e in spans])
    slots = iv.union(lo, hi)
    costs = []
    for i, role in enumerate(roles):
        rng = role if i == 0 else iv.intersect(slots, role)
        costs.append(iv.within(rng, lo, hi))
        slots = iv.subtract(slots, rng)
    costs.append(iv.within(slots, lo, hi))  # other
    total = hi - lo
    names = list(ROLES) + ["other"]
    i_gpu, i_cpu = names.index("communication"), names.index("communication_cpu")
    costs[i_gpu] = costs[i_gpu] + costs[i_cpu]
    del costs[i_cpu], names[i_cpu]
    per_step = [{k: float(c[j]) for k, c in zip(names, costs)} | {"total": float(total[j])} for j in range(len(spans))]
    avg = {k: float(np.mean(c)) for k, c in zip(names, costs)}
    avg_total = float(np.mean(total))
    pct = {k: (100.0 * v / avg_total if avg_total > 0 else None) for k, v in avg.items()}
    return {"per_step_us": per_step, "avg_us": avg, "pct": pct, "step_time_us": avg_total}


def _sm_efficiency(ts, end, bps, lo, hi) -> float | None:
    ok = np.isfinite(bps) & (bps > 0)
    if not ok.any():
        return None
    t = np.concatenate([ts[ok], end[ok]])
    b = bps[ok].astype(np.float64)
    val = np.concatenate([b, -b])
    del b
    o = np.argsort(t, kind="stable")  # at one instant the starts (the first half) come before the ends
    t = t[o]
    val = val[o]
    del o
    np.cumsum(val, out=val)  # in place: the level after each endpoint
    level = val[:-1]  # the level between endpoint j and j+1
    a, b = t[:-1], t[1:]
    seg = (b > a) & (level > 0)
    a, b, w = np.maximum(a[seg], lo), np.minimum(b[seg], hi), np.minimum(level[seg], 1.0)
    del t, level, val, seg
    keep = b > a
    if not keep.any():
        return None
    return float(np.sum(w[keep] * (b[keep] - a[keep])) / (hi - lo))


def gpu_metrics(tl: Timeline, spans: list, launch: np.ndarray, tc_tb: np.ndarray, tc_ext: np.ndarray) -> dict:
    """GPU utilization, SM efficiency, occupancy and tensor-core share per device (ratios 0..1), and which
    device is the rank's (the most kernel time)."""
    kern = tl.g_kind == GPU_KERNEL
    out: dict[str, Any] = {"devices": {}, "main": None}
    if not spans or not kern.any():
        return out
    # the plugin's tensor-core share counts the kernels launched from inside a CPU op (a launch whose
    # External id is an op's); without External ids, every launched kernel
    by_op = launch >= 0
    if tl.op_ext.size and tl.r_ext.size:
        rext = np.full(launch.size, -1, dtype=np.int64)
        rext[by_op] = tl.r_ext[launch[by_op]]
        pos = np.clip(np.searchsorted(tl.op_ext, rext), 0, tl.op_ext.size - 1)
        under = by_op & (tl.op_ext[pos] == rext)
        if under.any():
            by_op = under
    lo, hi = spans[0][0], spans[-1][1]
    end = tl.g_ts + tl.g_dur
    best, best_t = None, -1.0
    for dev in unique(tl.g_device[kern]):
        m = kern & (tl.g_device == dev)
        d: dict[str, Any] = {}
        u = iv.clip(iv.union(tl.g_ts[m], end[m]), lo, hi)
        d["utilization"] = iv.total(u) / (hi - lo) if hi > lo else None
        d["sm_efficiency"] = _sm_efficiency(tl.g_ts[m], end[m], tl.g_bps[m].astype(np.float64), lo, hi) \
            if hi > lo else None
        occ = tl.g_occ[m].astype(np.float64)
        has = np.isfinite(occ) & (occ >= 0)
        cd = np.clip(np.minimum(end[m], hi) - np.maximum(tl.g_ts[m], lo), 0, None)
        w = cd * has
        d["occupancy_pct"] = float(np.sum(occ[has] * w[has]) / np.sum(w)) if np.sum(w) > 0 else None
        launched = m & by_op
        tot = float(np.sum(tl.g_dur[launched]))
        d["tensor_core_tb"] = float(np.sum(tl.g_dur[launched & tc_tb])) / tot if tot > 0 else (0.0 if launched.any() else None)
        d["tensor_core"] = float(np.sum(tl.g_dur[launched & tc_ext])) / tot if tot > 0 else (0.0 if launched.any() else None)
        if not launched.any():  # no launches recorded: every kernel of the device
            tot = float(np.sum(tl.g_dur[m]))
            d["tensor_core_tb"] = float(np.sum(tl.g_dur[m & tc_tb])) / tot if tot > 0 else None
            d["tensor_core"] = float(np.sum(tl.g_dur[m & tc_ext])) / tot if tot > 0 else None
        d["kernel_us"] = float(np.sum(tl.g_dur[m]))
        out["devices"][int(dev)] = d
        if d["kernel_us"] > best_t:
            best, best_t = int(dev), d["kernel_us"]
    out["main"] = best
    return out


__all__ = ["ROLES", "breakdown", "gpu_metrics", "launch_index", "role_sets", "steps"]

"""Measured GPU activity from nsys's GPU metrics sampling (``nsys profile --gpu-metrics-devices=all``):
``GPU_METRICS`` (typeId, timestamp, metricId, value) named by ``TARGET_INFO_GPU_METRICS`` (metricId,
metricName), one sample of every metric per interval per GPU (the GPU: ``typeId & 0xFF``).

Each figure is the mean of its samples inside the analysed window (the steps, first start to last end): the
time-average of a uniformly sampled percentage, aggregated by SQLite (``GROUP BY metricId``), never a row
in Python. Metric names differ between GPU generations and nsys versions (``SM Active``, ``SMs Active
[Throughput %]``...): they are matched by the patterns below, and every metric found is also listed by its
own name. These figures are *measured* by the GPU's counters; the trace figures they stand beside
(estimated SM efficiency, estimated achieved occupancy, tensor-core kernel share) are *estimated* from
kernel names and launch parameters.
"""

from __future__ import annotations

import re
from typing import Any

from trainperf.trace.nsys.schema import METRIC_NAMES, METRICS, Export

SOURCE = "measured (nsys GPU_METRICS)"
NO_TABLE = ("not measured: the capture has no GPU_METRICS table (capture with nsys profile "
            "--gpu-metrics-devices=all)")
# our key -> the metric names it takes (re.match, case-insensitive), the first found wins
KEYS = {
    "sm_active_pct": [r"SMs? Active"],
    "sm_issue_pct": [r"SM Issue"],
    "tensor_active_pct": [r"Tensor Active", r"Tensor Pipe Active", r"Tensor .*Active"],
    "dram_read_pct": [r"DRAM Read"],
    "dram_write_pct": [r"DRAM Write"],
    "dram_bw_pct": [r"DRAM (?:Bandwidth|Active|Throughput)"],
    "gr_active_pct": [r"GR Active"],
    "warps_in_flight_pct": [r"Compute Warps in Flight", r"Warps in Flight"],
    "pcie_rx_pct": [r"PCIe RX Throughput", r"PCIe Read"],
    "pcie_tx_pct": [r"PCIe TX Throughput", r"PCIe Write"],
}
FIGURES = ("sm_active_pct", "sm_issue_pct", "tensor_active_pct", "dram_bw_pct")


def empty(reason: str) -> dict[str, Any]:
    return {"source": None, "not_measured": reason, **{k: None for k in KEYS}, "samples": 0, "metrics": {},
            "gpu_id": None, "window_us": None, "sample_interval_us": None}


def _key(name: str) -> str | None:
    for k, pats in KEYS.items():
        if any(re.match(p, name, re.I) for p in pats):
            return k
    return None


def gpu_ids(exp: Export) -> set[int]:
    """The GPU ids (``typeId & 0xFF``) the metrics were sampled on."""
    if not exp.has(METRICS, "typeId"):
        return set()
    ids: set[int] = set()
    src = METRIC_NAMES if exp.has(METRIC_NAMES, "typeId") else METRICS
    for chunk in exp.rows(f"SELECT DISTINCT typeId & 255 FROM {src}"):
        ids.update(int(i) for (i,) in chunk if i is not None)
    return ids


def measure(exp: Export, gpu_id: int | None, lo_ns: float | None, hi_ns: float | None) -> dict[str, Any]:
    """The mean of each metric on GPU ``gpu_id`` over [lo_ns, hi_ns] (the whole capture when None)."""
    if not (exp.has(METRICS, "metricId") and exp.has(METRICS, "value")):
        return empty(NO_TABLE)
    if not exp.has(METRIC_NAMES, "metricName"):
        return empty("not measured: the capture has GPU_METRICS but no TARGET_INFO_GPU_METRICS to name them")
    names: dict[int, str] = {}
    for chunk in exp.rows(f"SELECT DISTINCT metricId, metricName FROM {METRIC_NAMES}"):
        for i, n in chunk:
            names.setdefault(int(i), str(n))
    where, args = [], []
    if gpu_id is not None and exp.has(METRICS, "typeId"):
        where.append("(typeId & 255) = ?")
        args.append(int(gpu_id))
    if lo_ns is not None and hi_ns is not None and exp.has(METRICS, "timestamp"):
        where.append("timestamp >= ? AND timestamp <= ?")
        args += [int(lo_ns), int(hi_ns)]
    ts = ("min(timestamp), max(timestamp)" if exp.has(METRICS, "timestamp") else "NULL, NULL")
    sql = (f"SELECT metricId, avg(value), count(*), {ts} FROM {METRICS}"
           f"{' WHERE ' + ' AND '.join(where) if where else ''} GROUP BY metricId")
    rows = [r for chunk in exp.rows(sql, tuple(args)) for r in chunk]
    if not rows:
        why = f"on GPU {gpu_id}" if gpu_id is not None else ""
        return empty(f"not measured: GPU_METRICS has no sample {why} inside the analysed window (the sampling "
                     "covered other GPUs or other times; --gpu-metrics-devices names the GPUs sampled)")
    out = empty("")
    out["not_measured"] = None
    out["source"] = SOURCE
    out["gpu_id"] = gpu_id
    counts = []
    for mid, avg, n, t0, t1 in rows:
        name = names.get(int(mid), f"metric {mid}")
        out["metrics"][name] = float(avg)
        k = _key(name)
        if k and out[k] is None:
            out[k] = float(avg)
        counts.append(int(n))
        if t0 is not None and n > 1:
            out["sample_interval_us"] = (float(t1) - float(t0)) / (n - 1) / 1000.0
    if out["dram_bw_pct"] is None and out["dram_read_pct"] is not None:
        out["dram_bw_pct"] = out["dram_read_pct"] + (out["dram_write_pct"] or 0.0)
    out["samples"] = max(counts)
    if lo_ns is not None and hi_ns is not None:
        out["window_us"] = (hi_ns - lo_ns) / 1000.0
    missing = [k for k in FIGURES if out[k] is None]
    if missing:
        out["not_measured"] = (f"the sampled metric set has no {', '.join(missing)} (its metrics: "
                               f"{', '.join(sorted(out['metrics'])[:8])})")
    return out


__all__ = ["FIGURES", "KEYS", "NO_TABLE", "SOURCE", "empty", "gpu_ids", "measure"]

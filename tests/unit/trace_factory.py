"""A small generated torch 2.x rank (CPU ops, runtime launches, ac2g flows, kernels on a compute stream,
NCCL all-reduce buckets on their own stream overlapping backward) for the multi-rank tests, and the raw
reading those tests use to check the generator's answers without the reader (trainperf.trace)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from trainperf.tracegen import synth

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def base_rank(path: Path, *, steps: int = 3, fwd: int = 20, bwd: int = 20, buckets: int = 4,
              pg: bool = True) -> Path:
    """Write one rank: per step a forward (``fwd`` kernels of 150 us), a backward (``bwd`` of 200 us) with an
    all-reduce bucket (400 us, stream 40) launched every ``bwd // buckets`` kernels, then an optimizer
    kernel after the last bucket. Timestamps in us from 1_000_000."""
    ev: list[dict] = []
    corr = [0]
    t = 1_000_000.0
    pid, tid = 100, 100

    def launch(ts: float, name: str, dur: float, stream: int, args: dict | None = None) -> float:
        corr[0] += 1
        c = corr[0]
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": ts,
                   "dur": 5.0, "args": {"correlation": c, "External id": c}})
        ev.append({"ph": "s", "id": c, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"})
        a = {"External id": c, "queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": c,
             "registers per thread": 32, "shared memory": 0, "blocks per SM": 4.0, "warps per SM": 32.0,
             "grid": [432, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": 50}
        a.update(args or {})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": kts[stream], "dur": dur,
                   "args": a})
        ev.append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": kts[stream], "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
        kts[stream] += dur
        return kts[stream]

    kts = {7: t + 20.0, 40: t}
    for s in range(steps):
        start = t
        kts[7] = max(kts[7], t + 20.0)
        cpu = t + 10
        for i in range(fwd):
            launch(cpu, "void at::native::vectorized_elementwise_kernel<4>(...)" if i % 2 else
                   "ampere_sgemm_128x64_nn", 150.0, 7)
            kts[7] += 50.0  # a gap between kernels
            cpu += 20
        per = max(1, bwd // buckets)
        for i in range(bwd):
            launch(cpu, "ampere_sgemm_64x64_tn", 200.0, 7)
            kts[7] += 50.0
            cpu += 20
            if (i + 1) % per == 0:
                kts[40] = max(kts[40], kts[7])
                extra = {"Collective name": "allreduce", "Process Group Name": "0"} if pg else {}
                launch(cpu, NCCL, 400.0, 40, extra)
        kts[7] = max(kts[7], kts[40])  # the optimizer waits for the last bucket
        launch(cpu, "void at::native::multi_tensor_apply_kernel<...>(...)", 300.0, 7)
        end = max(kts[7], kts[40]) + 100.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": pid, "tid": tid,
                   "ts": start, "dur": end - start, "args": {"External id": 10_000 + s}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": start + 10,
                   "dur": cpu - start - 10, "args": {"External id": 20_000 + s}})
        t = end + 50.0
    ev.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}})
    meta = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                                        "computeMinor": 0, "numSms": 108,
                                                        "maxThreadsPerMultiprocessor": 2048}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    return synth.write_trace(path, meta, sorted(ev, key=lambda e: e.get("ts", 0)))


def comm_rows(path: Path) -> list[list]:
    """The communication kernels of a trace as ranks.py reads them ([ts, dur, stream, name, step, collective,
    process group]), read from the raw JSON (step: the ProfilerStep whose span holds the kernel's start)."""
    meta, ev = synth.load_trace(path)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("cat") != "gpu_user_annotation")
    out = []
    for e in ev:
        if e.get("cat") in ("kernel", "Kernel") and synth.default_is_comm(e["name"]):
            a = e.get("args") or {}
            step = next((i for i, (s, end) in enumerate(steps) if s <= e["ts"] < end), None)
            out.append([e["ts"], e["dur"], a.get("stream"), e["name"], step, a.get("Collective name"),
                        a.get("Process Group Name")])
    return out


def read_json(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)

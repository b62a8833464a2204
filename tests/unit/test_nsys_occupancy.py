"""The per-kernel estimates an nsys capture gets from launch parameters are Kineto's own: checked against the
``blocks per SM`` and ``est. achieved occupancy %`` Kineto wrote for every kernel of the real V100 and A100
traces in tests/data/real, then on the calculator's limits."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from trainperf.trace.nsys import occupancy as oc

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
TRACES = ["tb-data/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
          "hta-data/tests/data/nccl_parser_config/nccl_data.json.gz",
          "hta-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"]


@pytest.mark.parametrize("rel", TRACES)
def test_kinetos_estimates_on_real_traces(rel):
    doc = json.load(gzip.open(REAL / rel))
    p = doc["deviceProperties"][0]
    lim = oc.limits((p["computeMajor"], p["computeMinor"]), p["numSms"],
                    {"threads_per_sm": p["maxThreadsPerMultiprocessor"], "smem_per_sm": p["sharedMemPerMultiprocessor"]})
    ks = [e["args"] for e in doc["traceEvents"] if str(e.get("cat")).lower() == "kernel" and "grid" in (e.get("args") or {})]
    assert len(ks) > 1000
    grid = np.array([np.prod(a["grid"]) for a in ks])
    block = np.array([np.prod(a["block"]) for a in ks])
    regs = np.array([a["registers per thread"] for a in ks])
    smem = np.array([a["shared memory"] for a in ks])  # Kineto writes static + dynamic: only the sum counts
    bps, occ = oc.estimate(grid, block, regs, smem, np.zeros_like(smem), lim)
    assert np.array_equal(occ, np.array([a["est. achieved occupancy %"] for a in ks], dtype=np.float32))
    assert bps == pytest.approx(np.array([a["blocks per SM"] for a in ks]), rel=1e-4)  # Kineto prints 6 digits


def test_the_calculators_limits():
    h100 = oc.limits((9, 0), 132)
    one = np.array([1])

    def occ(grid, block, regs, smem):
        return float(oc.estimate(one * grid, one * block, one * regs, one * smem, one * 0, h100)[1][0])
    assert occ(132 * 8, 256, 32, 0) == 100.0  # 8 blocks of 256 threads fill an SM's 2048
    assert occ(132 * 8, 256, 64, 0) == 50.0  # 64 registers: 65,536 / 64 = 1024 threads (4 blocks) fit
    assert occ(132 * 8, 256, 128, 0) == 25.0  # 128 registers: 512 threads
    assert occ(132 * 8, 128, 32, 40 * 1024) == 31.0  # 41 KB a block (1 KB reserved): 5 of 228 KB -> 640 threads
    assert occ(132 * 8, 128, 32, 60 * 1024) == 0.0  # above the default 48 KB without opt-in: Kineto's 0
    assert occ(66, 256, 32, 0) == 6.0  # half a block per SM: the grid caps it (0.5 x 256 / 2048)
    assert occ(132, 2048, 32, 0) == 0.0  # more threads than a block may have
    assert np.isnan(oc.estimate(one, one * 256, one * 32, one * 0, one * 0, oc.limits((9, 0), None))[1][0])
    assert oc.limits(None, 132) is None and oc.limits((3, 0), 10) is None

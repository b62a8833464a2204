"""Generated before/after pairs (one cause removed): the steps measured from the two exports give the speed-up
the simulation knows, within 2%, and the removed cause's own figure goes away. (``compare`` is built on them.)"""

from __future__ import annotations

import statistics

import pytest

from trainperf.trace.nsys import analyze_capture
from trainperf.tracegen.nsys import make_pair
from trainperf.tracegen.nsys_job import CAUSES

# the figure each cause shows in the "before" capture and not in the "after" one
SIGNATURE = {
    "pageable_copies": lambda r: r["memcpy"]["pageable_us_per_step"],
    "host_sync": lambda r: r["host_sync"]["blocked_us_per_step"],
    "fp32_gemm": lambda r: r["tensor_cores"]["fp32_eligible_us_per_step"],
    "launch_bound": lambda r: r["launch"]["short_kernel_pct"] - 50.0,
    "dataloader": lambda r: r["step_breakdown_pct"]["dataloader"] - 5.0,
    "allocator": lambda r: r["allocator"]["us_per_step"],
}


def _median_step(r: dict, last: int) -> float:
    return statistics.median(s["dur_us"] for s in r["per_step"][-last:])


@pytest.mark.parametrize("cause", CAUSES)
def test_pair_speedup_and_the_cause_removed(tmp_path, cause):
    pair = make_pair(tmp_path, cause)
    (before,) = analyze_capture(pair["before"]["path"])
    (after,) = analyze_capture(pair["after"]["path"])
    measured = _median_step(before, 6) / _median_step(after, 6)
    assert measured == pytest.approx(pair["speedup"], rel=0.02)
    assert pair["speedup"] > 1.0
    assert SIGNATURE[cause](before) > 0 >= SIGNATURE[cause](after)
    assert cause in pair["before"]["causes"] and cause not in pair["after"]["causes"]

"""The figures across ranks, piece by piece (trainperf/trace/clocks.py, blame.py, across.py, collectives.py): the
clock fit, the wait / transfer split, the late episodes and their causes, the wait matrix, a job whose traces
are not all here, and the window causes each rank exports. Hand-built tables, so each expected figure is
worked out in the test; the generated jobs with known truth are in test_across_ranks_generated.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainperf.trace.across import PARTIAL_NOTE, across_ranks, comm_waits, match
from trainperf.trace.blame import LATE_MIN_US, lag_causes
from trainperf.trace.clocks import estimate_offsets, group_median
from trainperf.trace.collectives import CAUSES, compact, table, window_causes, windows
from trainperf.trace.timeline import Collector

K = len(CAUSES)
C = {c: i for i, c in enumerate(CAUSES)}


def test_group_median_is_numpys_median_per_group():
    rng = np.random.default_rng(0)
    v, g = rng.normal(size=500), rng.integers(0, 7, size=500)
    got = group_median(v, g, 9)
    for k in range(7):
        assert got[k] == pytest.approx(np.median(v[g == k]))
    assert np.isnan(got[7]) and np.isnan(got[8])  # empty groups


def test_clock_offsets_come_back_from_noisy_ends_with_the_residual():
    """Three hosts, clocks off by 0 / +2.5 ms / -40 ms; every collective ends on every rank within 0..6 us of
    its true end, and one end is an outlier (a kernel held back 900 us): the median fit ignores it."""
    rng = np.random.default_rng(1)
    true_off = np.array([0.0, 2500.0, -40_000.0])
    n = 60
    ends = np.cumsum(rng.uniform(500, 5000, size=n))
    rank = np.repeat(np.arange(3), n)
    coll = np.tile(np.arange(n), 3)
    e = ends[coll] + true_off[rank] + rng.uniform(0, 6.0, size=3 * n)
    e[5] += 900.0  # rank 0, collective 5
    got = estimate_offsets(rank, coll, e, 3)
    assert got["offset_us"] == pytest.approx(true_off, abs=3.0)
    assert got["residual_us"] < 6.0 and got["residual_max_us"][0] > 800  # the outlier shows in the max only
    assert list(got["reference"]) == [0, 0, 0] and got["rounds"] >= 1


def test_ranks_that_share_no_collective_have_their_own_reference():
    # ranks 0-1 share collectives 0..9, ranks 2-3 share 10..19 (two process groups, no common one)
    rank = np.array([0] * 10 + [1] * 10 + [2] * 10 + [3] * 10)
    coll = np.array(list(range(10)) * 2 + list(range(10, 20)) * 2)
    e = coll * 100.0 + np.array([0.0, 7.0, 50.0, 20.0])[rank]
    got = estimate_offsets(rank, coll, e, 5)  # rank 4: no collective at all
    assert got["offset_us"][:4] == pytest.approx([0.0, 7.0, 0.0, -30.0])
    assert np.isnan(got["offset_us"][4]) and list(got["reference"][:4]) == [0, 0, 2, 2]


def _tab(starts, durs, *, steps=None, causes=None, pg="0", name="ncclKernel_AllReduce", coll="allreduce"):
    n = len(starts)
    t = compact(table(starts, durs, [40] * n, steps if steps is not None else [0] * n, [name] * n, [coll] * n,
                      [pg] * n))
    if causes is not None:
        t["causes"] = np.asarray(causes, dtype=np.float32)
        t["attribution"] = "test"
    return t


def _result(rank, tab, *, steps=1, world=None, pg_size=None):
    di = {"rank": rank, "world_size": world} if world else None
    if di and pg_size:
        di["pg_config"] = [{"pg_name": "0", "pg_size": pg_size}]
    return {"rank": rank, "path": f"rank{rank}.json", "steps": steps, "step_time_us": 10_000.0,
            "_step_compute_us": [5000.0] * steps, "_comm": tab, "distributed_info": di}


def test_wait_is_the_last_arrivals_start_minus_ones_own_on_corrected_clocks():
    """Rank 1's clock is 1 ms ahead; rank 2 arrives 300 us late at the first collective and 100 us late at the
    second; each collective ends together (transfer 200 us). Raw starts would say rank 1 is the late one."""
    off = {0: 0.0, 1: 1000.0, 2: 0.0}
    late = {0: [0.0, 0.0], 1: [0.0, 0.0], 2: [300.0, 100.0]}
    t0 = [10_000.0, 20_000.0]
    tabs = {}
    for r in range(3):
        starts = [t0[j] + late[r][j] + off[r] for j in range(2)]
        ends = [t0[j] + [300.0, 100.0][j] + 200.0 + off[r] for j in range(2)]
        tabs[r] = _tab(starts, [e - s for s, e in zip(starts, ends)])
    out = across_ranks([_result(r, tabs[r]) for r in range(3)])
    per = {p["rank"]: p for p in out["per_rank"]}
    assert per[1]["clock_offset_us"] == pytest.approx(1000.0) and per[0]["clock_offset_us"] == 0.0
    assert per[0]["comm_wait_us_per_step"] == pytest.approx(400.0)  # 300 + 100, one step
    assert per[1]["comm_wait_us_per_step"] == pytest.approx(400.0) and per[2]["comm_wait_us_per_step"] == 0.0
    assert per[2]["transfer_us_per_step"] == pytest.approx(400.0) == per[0]["transfer_us_per_step"]
    assert out["clocks"]["residual_us"] == pytest.approx(0.0, abs=1e-6)
    late_ranks = [x["rank"] for x in out["late_arrivals"]]
    assert late_ranks == [2] and out["late_arrivals"][0]["last_at"] == 2
    wm = out["wait_matrix"]
    assert wm["late"] == [2] and wm["ms_per_step"][wm["waiting"].index(0)] == [pytest.approx(0.4)]
    assert not out["partial"] and out["late_threshold_us"] == LATE_MIN_US
    json.dumps(out, allow_nan=False)


def test_with_ranks_missing_a_collective_is_not_split_into_transfer():
    tabs = {r: _tab([100.0 + 50 * r], [500.0 - 50 * r]) for r in range(2)}
    out = across_ranks([_result(r, tabs[r], world=4) for r in range(2)])
    per = out["per_rank"]
    assert out["partial"] and all(p["transfer_us_per_step"] is None for p in per)
    assert per[0]["comm_wait_us_per_step"] == pytest.approx(50.0)  # the wait among these two is still measured
    assert per[0]["comm_incl_absent_wait_us_per_step"] == pytest.approx(450.0)  # its 500 us less the 50 of wait
    assert PARTIAL_NOTE in out["notes"] and any("rank(s) 2, 3 missing" in n for n in out["notes"])
    assert "among the ranks in these traces" in out["late_arrivals"][0]["summary"]
    # a process group of two, both here, in a job of four: its collectives split as usual
    whole = across_ranks([_result(r, tabs[r], world=4, pg_size=2) for r in range(2)])
    assert not whole["partial"] and whole["per_rank"][0]["transfer_us_per_step"] == pytest.approx(450.0)


def test_lag_carried_over_keeps_its_cause_and_new_lag_gets_the_windows_excess():
    untraced = C["untraced"]
    ex = np.zeros((5, K))
    ex[0, C["dataloader"]] = 20.0  # late by 20 at the first collective: its DataLoader
    ex[1, C["cpu_op"]] = 7.0  # noise in a window where it was already behind: no new lag
    ex[3, C["compute"]] = 6.0  # falls 5 further behind at the 4th: its compute
    ex[3, C["cpu_op"]] = 4.0
    lag = np.array([20.0, 3.0, 20.0, 25.0, -1.0])  # dips at the 2nd (queued behind the 1st), caught up at the 5th
    got = lag_causes(lag, ex, untraced)
    assert got[0, C["dataloader"]] == pytest.approx(20.0) and got[1].sum() == pytest.approx(3.0)
    assert got[1, C["dataloader"]] == pytest.approx(3.0) and got[2, C["dataloader"]] == pytest.approx(20.0)
    assert got[3, C["dataloader"]] == pytest.approx(20.0)
    assert got[3, C["compute"]] == pytest.approx(3.0) and got[3, C["cpu_op"]] == pytest.approx(2.0)
    assert got[4].sum() == 0.0
    # no positive excess: the new lag is untraced
    assert lag_causes(np.array([5.0]), np.zeros((1, K)), untraced)[0, untraced] == pytest.approx(5.0)


def test_the_late_ranks_wait_is_charged_to_its_own_cause_and_a_straggler_by_compute_is_one_case():
    def causes(extra: dict):
        row = np.zeros(K)
        row[C["compute"]], row[C["cpu_op"]] = 4000.0, 1000.0
        for k, v in extra.items():
            row[C[k]] += v
        return [row, row]

    tabs = {r: _tab([5000.0, 15_000.0], [600.0, 600.0], steps=[0, 1], causes=causes({})) for r in (0, 2)}
    tabs[1] = _tab([5400.0, 15_400.0], [200.0, 200.0], steps=[0, 1], causes=causes({"allocator": 400.0}))
    out = across_ranks([_result(r, tabs[r], steps=2) for r in range(3)])
    (late,) = out["late_arrivals"]
    assert late["rank"] == 1 and late["cause"] == "allocator" and late["cause_share"] == pytest.approx(1.0)
    assert late["steps_last"] == 2 == late["steps"] and late["last_at"] == 2 == late["collectives"]
    assert late["delay_us_per_step"] == pytest.approx(400.0)  # the others' median wait, per step
    assert late["wait_caused_us_per_step"] == pytest.approx(800.0)  # both other ranks' waits
    assert late["causes_us_per_step"] == {"allocator": pytest.approx(800.0)}
    assert "rank 1 last in 2 of 2 step(s)" in late["summary"] and "allocator" in late["summary"]
    assert not late["straggler_by_compute"]
    per = {p["rank"]: p for p in out["per_rank"]}
    assert per[0]["wait_us_by_step"] == [pytest.approx(400.0)] * 2 and per[1]["last_at"] == 2


def test_no_late_arrival_below_the_threshold():
    tabs = {r: _tab([1000.0 + 5 * r], [300.0 - 5 * r]) for r in range(3)}  # 10 us of skew: noise
    out = across_ranks([_result(r, tabs[r]) for r in range(3)])
    assert out["late_arrivals"] == [] and out["wait_matrix"] is None
    assert out["per_rank"][0]["comm_wait_us_per_step"] == pytest.approx(10.0)  # still each rank's wait


def test_matching_by_name_stops_at_the_first_disagreement_and_by_sequence():
    a = _tab([0.0, 20.0], [10.0, 10.0])
    b = compact(table([0.0, 20.0], [30.0, 10.0], [40, 40], [0, 0], ["ncclAllReduce", "ncclAllGather"],
                      ["allreduce", "allgather"], ["0", "0"]))
    m = match({0: a, 1: b})
    assert m["matched"] == 1 and m["unmatched"] == 2 and m["by"] == ["process group"]
    other_pg = _tab([0.0], [10.0], pg="7")  # a group of one rank: nothing to match it with
    assert match({0: a, 1: other_pg})["matched"] == 0
    w = comm_waits({0: [[0, 10, 40, "ncclAllReduce", 0, "allreduce", "0"]],  # the older list-of-rows form
                    1: [[0, 30, 40, "ncclAllReduce", 0, "allreduce", "0"]]})
    assert w["waits"] == {0: [(0, 0.0)], 1: [(0, 20.0)]} and w["clock_offset_us"] == {0: 0.0, 1: 20.0}


def test_each_collectives_window_runs_from_the_previous_arrival_in_its_sequence():
    ts = np.array([10.0, 20.0, 30.0, 45.0])
    seq = np.array([0, 1, 0, 0], dtype=np.int32)
    assert list(windows(ts, seq, np.array([5.0, 5.0, 5.0, 5.0]))) == [5.0, 5.0, 10.0, 30.0]


def _timeline(gpu=(), runtime=(), ops=(), annos=()):
    """A timeline from (ts, dur, name) tuples: GPU kernels, runtime calls, cpu_ops, annotations."""
    from trainperf.trace.reader import Args, Event

    evs = [Event(ph="X", cat="kernel", name=n, ts=t, dur=d, pid=0, tid=7, args=Args(stream=7, device=0))
           for t, d, n in gpu]
    evs += [Event(ph="X", cat="cuda_runtime", name=n, ts=t, dur=d, pid=1, tid=1) for t, d, n in runtime]
    evs += [Event(ph="X", cat="cpu_op", name=n, ts=t, dur=d, pid=1, tid=1) for t, d, n in ops]
    evs += [Event(ph="X", cat="user_annotation", name=n, ts=t, dur=d, pid=1, tid=1) for t, d, n in annos]
    c = Collector()
    c.feed(evs)
    return c.finish({})


def test_window_causes_partition_the_window_gpu_work_then_the_host_then_communication():
    dl = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    tl = _timeline(gpu=[(1000, 100, "ampere_sgemm_128x64_nn"), (1300, 200, "ncclKernel_AllReduce_RING_LL_Sum_float")],
                   runtime=[(1100, 50, "cudaFree"), (1160, 10, "cudaLaunchKernel"), (1400, 50, "cudaStreamSynchronize")],
                   ops=[(1100, 300, "aten::empty")], annos=[(900, 100, dl)])
    b = tl.base_us
    lo, hi = np.array([900.0 - b, 1000.0 - b]), np.array([1600.0 - b, 1100.0 - b])
    got = window_causes(tl, lo, hi)
    assert got.sum(axis=1) == pytest.approx(hi - lo)  # a partition
    row = dict(zip(CAUSES, got[0]))
    assert row["dataloader"] == pytest.approx(100) and row["compute"] == pytest.approx(100)
    assert row["allocator"] == pytest.approx(50) and row["launch"] == pytest.approx(10)
    # the host op covers the communication kernel's first 100 us (it counts as the host's), the sync 50 more
    assert row["cpu_op"] == pytest.approx(300 - 50 - 10) and row["sync"] == pytest.approx(50)
    assert row["communication"] == pytest.approx(50) and row["untraced"] == pytest.approx(100)
    assert dict(zip(CAUSES, got[1]))["compute"] == pytest.approx(100)


def test_ends_that_do_not_line_up_are_said_and_raise_the_late_threshold():
    """Send/recv with peers not in the traces does not end together: a clock fit 1 ms off is said, and
    arrivals closer than 3x that are not called late."""
    rng = np.random.default_rng(2)
    tabs = {}
    for r in range(2):
        starts = np.arange(8) * 10_000.0 + (500.0 if r else 0.0)
        tabs[r] = _tab(starts, rng.uniform(1000.0, 3000.0, size=8))
    out = across_ranks([_result(r, tabs[r]) for r in range(2)])
    assert out["clocks"]["residual_us"] > 50 and out["late_threshold_us"] == pytest.approx(3 * out["clocks"]["residual_us"])
    assert any("ends disagree" in n for n in out["notes"])

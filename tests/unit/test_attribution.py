"""Attribution of a rank's step (trainperf.trace.attribution): every microsecond charged to one cause, the
precedence of the host causes, the refill after a wait, gpu_wait, the what-if gains, and the properties that
hold on every committed trace (the causes sum to the step and to any window; the dependency replay with
nothing changed gives back every GPU event's time; strict JSON). The small traces here are written event by
event so that each expected figure can be worked out by hand (the comments do it)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tests.unit.trace_fixtures import REAL, TRACES
from trainperf.trace import replay, tb
from trainperf.trace.analyze import analyze_file, read_timeline
from trainperf.trace.attribution import CAUSES, attribute_windows, charges
from trainperf.trace.hostmap import innermost, name_classes
from trainperf.trace.patterns import host_kind

NSYS = REAL.parent / "nsys/h100_2gpu_1s.sqlite.gz"
COMMITTED = sorted([p for p in TRACES.glob("*.json*")] + [p for p in REAL.rglob("*.json*") if p.is_file()])


class Trace:
    """Kineto 2.x events written by hand: one host thread (tid 1), one stream (7)."""

    def __init__(self):
        self.ev: list[dict] = []
        self.corr = 0

    def cpu(self, name, a, b, cat="cpu_op", tid=1):
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": a, "dur": b - a})

    def launch(self, a, b, k0, k1, name="cudaLaunchKernel", kernel="void my_kernel<float>()", stream=7, tid=1):
        self.corr += 1
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": a,
                        "dur": b - a, "args": {"correlation": self.corr}})
        self.ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": k0,
                        "dur": k1 - k0, "args": {"correlation": self.corr, "stream": stream, "device": 0}})

    def runtime(self, name, a, b, tid=1):
        self.corr += 1
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": a,
                        "dur": b - a, "args": {"correlation": self.corr}})

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": self.ev}))
        return path


def by_cause(tl, lo, hi) -> dict:
    """The causes in [lo, hi) of the trace's own microseconds (the Timeline's are relative to its base)."""
    row = attribute_windows(tl, [lo - tl.base_us], [hi - tl.base_us])[0]
    return {k: round(v, 6) for k, v in row.items() if v > 1e-9}


def _precedence_trace(tmp_path: Path) -> Path:
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 1000, cat="user_annotation")
    t.cpu("aten::mm", 0, 9)
    t.launch(2, 8, 10, 110)  # K1: the GPU waits [0, 10): aten::mm until the launch, then the launch
    t.cpu("Optimizer.step#SGD.step", 200, 600, cat="user_annotation")
    t.cpu("aten::empty", 210, 400)
    t.runtime("cudaFree", 220, 380)  # inside aten::empty inside the optimizer: the allocator wins
    t.cpu("aten::add_", 585, 598)
    t.launch(590, 595, 600, 650)  # K2, launched inside the optimizer step
    t.cpu("train.py(5): f", 700, 800, cat="python_function")
    t.cpu("aten::relu", 895, 910)
    t.launch(900, 905, 915, 990)  # K3
    return t.write(tmp_path / "precedence.json")


def test_each_idle_instant_goes_to_the_first_cause_that_covers_it_on_the_launching_thread(tmp_path):
    tl = read_timeline(_precedence_trace(tmp_path))
    got = by_cause(tl, 0, 1000)
    # compute: K1 100 + K2 50 + K3 75. Gap [110, 600) ends at K2, launched at 590 inside the optimizer step:
    # [590, 600) is the launch, inside the optimizer; before it the thread was in the optimizer [200, 220),
    # cudaFree [220, 380), the optimizer again [380, 590), and nothing at all [110, 200). Gap [650, 915):
    # untraced [650, 700) and [800, 895), the Python function [700, 800), aten::relu [895, 900), the launch
    # [900, 915). [0, 10): aten::mm [0, 2), the launch [2, 10). [990, 1000): nothing.
    assert got == {"compute": 225.0, "allocator": 160.0, "optimizer": 240.0, "untraced": 245.0,
                   "cpu_op": 107.0, "launch": 23.0}
    assert sum(got.values()) == pytest.approx(1000.0)


def test_the_attribution_names_calls_and_their_callers_and_the_what_if_gains(tmp_path):
    a = analyze_file(_precedence_trace(tmp_path))["attribution"]
    causes = {c["cause"]: c for c in a["idle_causes"]}
    assert causes["allocator"]["detail"] == "cudaFree" and causes["allocator"]["callers"] == [["aten::empty", 160.0]]
    assert causes["allocator"]["calls_per_step"] == 1
    assert causes["optimizer"]["detail"] == "Optimizer.step#SGD.step"
    assert [n for n, _ in causes["cpu_op"]["names"]] == ["train.py(5): f", "aten::relu", "aten::mm"]
    assert sum(a["gpu_pct"].values()) == pytest.approx(100.0)
    assert a["gpu_us"] == {"compute": 225.0, "communication": 0.0, "memcpy": 0.0, "memset": 0.0, "idle": 775.0}
    # without the cudaFree every later host event is 160 us earlier, the GPU's work too: the step ends
    # 160 us sooner. Without the optimizer's own 240 us the same holds for 240 us.
    assert causes["allocator"]["gain_us"] == pytest.approx(160.0)
    assert causes["optimizer"]["gain_us"] == pytest.approx(240.0)
    assert causes["allocator"]["whatif_step_us"] == pytest.approx(a["step_us"] - 160.0)
    json.dumps(a, allow_nan=False)


def _drain_trace(tmp_path: Path) -> Path:
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 980, cat="user_annotation")
    for i in range(4):  # four 200-us kernels queued back to back: the host is 780 us ahead
        t.launch(10 * i, 10 * i + 5, 20 + 200 * i, 220 + 200 * i)
    t.cpu("aten::item", 50, 830)
    t.cpu("aten::_local_scalar_dense", 52, 828)
    t.runtime("cudaStreamSynchronize", 55, 825)  # returns 5 us after the queue drained at 820
    t.cpu("aten::add", 830, 880)
    t.launch(870, 875, 880, 980)
    return t.write(tmp_path / "drain.json")


def test_a_sync_drain_is_the_syncs_cost_not_the_next_ops(tmp_path):
    tl = read_timeline(_drain_trace(tmp_path))
    got = by_cause(tl, 0, 980)
    # the gap [820, 880): the sync [820, 830) by instant; without the sync the host would have launched the
    # next kernel while the queue ran, so the gap shrinks by all 60 us: aten::add's [830, 870) and the launch
    # [870, 880) are the sync's refill. Before the first kernel [0, 20): the launch call and its latency.
    assert got == {"compute": 900.0, "launch": 20.0, "sync": 60.0}
    a = analyze_file(tmp_path / "drain.json")["attribution"]
    sync = next(c for c in a["idle_causes"] if c["cause"] == "sync")
    assert sync["detail"] == "cudaStreamSynchronize" and sync["callers"][0][0] == "aten::item"
    assert a["refill_us"] == pytest.approx(50.0)
    # replayed without the sync, the fifth kernel queues behind the fourth: the step ends at 920, not 980
    assert sync["gain_us"] == pytest.approx(60.0)


def test_queued_work_that_does_not_start_on_an_idle_device_is_gpu_wait(tmp_path):
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 600, cat="user_annotation")
    t.launch(0, 5, 500, 550)  # launched at once, started 495 us after its call returned, nothing running
    tl = read_timeline(t.write(tmp_path / "wait.json"))
    got = by_cause(tl, 0, 600)
    # the launch owns [0, 35) (the call and 30 us of latency); [35, 500) waited on what the trace does not show
    assert got == {"compute": 50.0, "launch": 35.0, "gpu_wait": 465.0, "untraced": 50.0}


def test_windows_sum_to_their_length_everywhere_and_outside_the_trace_is_untraced():
    tl = read_timeline(REAL / "hta-data/tests/data/nccl_parser_config/nccl_data.json.gz")
    lo = np.linspace(tl.all_min - 5e4, tl.all_max, 37)  # Timeline microseconds
    hi = lo + np.linspace(1.0, 3e5, 37)
    rows = attribute_windows(tl, lo, hi)
    assert len(rows) == 37 and all(set(r) == set(CAUSES) for r in rows)
    for r, a, b in zip(rows, lo, hi):
        assert sum(r.values()) == pytest.approx(b - a, rel=1e-9, abs=1e-6)
        assert min(r.values()) >= 0
    before = attribute_windows(tl, [tl.all_min - 5e4], [tl.all_min - 1e4])[0]
    assert before["untraced"] == pytest.approx(4e4) and sum(before.values()) == pytest.approx(4e4)
    with pytest.raises(ValueError, match="one end per start"):
        attribute_windows(tl, [0.0, 1.0], [2.0])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_committed_trace_sums_to_its_steps_and_replays_to_itself(path):
    r = analyze_file(path)
    a = r["attribution"]
    if r["cpu_only"]:
        assert a is None
        return
    json.dumps(a, allow_nan=False)
    assert sum(a["gpu_pct"].values()) == pytest.approx(100.0, abs=1e-6)
    assert a["gpu_us"]["idle"] == pytest.approx(sum(c["us_per_step"] for c in a["idle_causes"]), rel=1e-9, abs=1e-6)
    assert all(c["gain_us"] >= 0 and c["whatif_step_us"] <= a["step_us"] + 1e-6 for c in a["idle_causes"])
    assert a["unreplayable"] is None and all(c["gain_us"] is not None for c in a["idle_causes"])
    assert_replays_to_itself(read_timeline(path))


def assert_replays_to_itself(tl) -> None:
    g = replay.build(tl, tb.launch_index(tl), replay.wait_calls(tl, name_classes(tl)))
    starts, _ = replay.run(g)
    assert np.allclose(starts, tl.g_ts, rtol=0, atol=1e-6)  # nothing changed: every GPU event where it was


def test_the_committed_nsys_export_replays_to_itself(tmp_path):
    from trainperf.trace.nsys import read_capture

    out = tmp_path / "h100_2gpu_1s.sqlite"
    out.write_bytes(gzip.decompress(NSYS.read_bytes()))
    ranks = read_capture(out)
    assert len(ranks) == 2
    for _, tl in ranks:
        assert_replays_to_itself(tl)


def _gpu(t: Trace, name, a, b, stream, cat="kernel", corr=None):
    """A GPU event with no launch call in the trace (``corr``: an id no call has; None: none at all)."""
    args = {"stream": stream, "device": 0} | ({"correlation": corr} if corr is not None else {})
    t.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": a, "dur": b - a, "args": args})


def test_work_without_a_launch_overlapping_work_and_late_launched_neighbours_replay_to_themselves(tmp_path):
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 500, cat="user_annotation")
    # stream 7: A was launched before the trace began (its call is not in it); B, launched at 20, queued behind
    # it; a sync at [50, 60) on stream 8 comes between B's launch and A's start
    _gpu(t, "A", 100, 110, 7, corr=99)
    t.launch(20, 25, 112, 130, stream=7)
    t.launch(10, 15, 30, 58, stream=8)
    t.runtime("cudaStreamSynchronize", 50, 60)
    # stream 9: device-side copies without correlation ids that overlap each other (MTIA's dma_request)
    _gpu(t, "dma_request", 200, 220, 9)
    _gpu(t, "dma_request", 205, 230, 9)
    # stream 10: F launched at 300 starts at 400 (launch-bound); G on stream 11, launched at 310 (after a sync at
    # [306, 308)), ends just before F starts: not F's dependency, it was launched after F
    t.launch(300, 305, 400, 420, stream=10)
    t.runtime("cudaStreamSynchronize", 306, 308)
    t.launch(310, 315, 320, 399.8, stream=11)
    tl = read_timeline(t.write(tmp_path / "pre.json"))
    assert_replays_to_itself(tl)
    a = analyze_file(tmp_path / "pre.json")["attribution"]
    assert a["unreplayable"] is None


def test_a_chain_of_cross_stream_dependencies_longer_than_a_pass_settles(tmp_path):
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 10_000, cat="user_annotation")
    # 200 kernels queued at once, alternating between two streams, each starting 2 us after the previous one
    # (on the other stream) ends: a chain of 199 cross-stream dependencies in one batch, more than the 64
    # passes one relaxation makes
    for i in range(200):
        k0 = 1000 + 42 * i
        t.launch(2 * i, 2 * i + 1, k0, k0 + 40, stream=7 + i % 2)
    tl = read_timeline(t.write(tmp_path / "chain.json"))
    g = replay.build(tl, tb.launch_index(tl), replay.wait_calls(tl, name_classes(tl)))
    assert g.d_at.size == 199
    assert_replays_to_itself(tl)


def test_gpu_work_before_its_launch_call_is_detected_and_gets_no_gain(tmp_path):
    t = Trace()
    t.cpu("ProfilerStep#1", 0, 1000, cat="user_annotation")
    t.cpu("aten::mm", 0, 400)
    t.launch(100, 105, 300, 400)
    t.launch(500, 505, 440, 460)  # starts 60 us before its launch call: the GPU's clock is behind the host's
    t.runtime("cudaFree", 600, 900)
    t.launch(950, 955, 960, 990)
    r = analyze_file(t.write(tmp_path / "clock.json"))
    a = r["attribution"]
    assert a["unreplayable"].startswith("1 of 3 launched GPU event(s) start before their launch call (by up to 60.0")
    assert a["unreplayable"] in r["notes"]
    assert a["idle_causes"] and all(c["gain_us"] is None and c["whatif_step_us"] is None for c in a["idle_causes"])
    assert a["refill_us"] == 0
    assert sum(a["gpu_pct"].values()) == pytest.approx(100.0)  # the charges still sum to the step
    json.dumps(a, allow_nan=False)


@pytest.mark.parametrize("name", ["hta-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
                                  "tb-data/resnet50_num_workers_0/worker0.pt.trace.json.gz"])
def test_the_attribution_is_the_same_in_small_pieces(name, monkeypatch):
    """The host map and the replay work a bounded number of events at a time: cut into pieces of 97 events (ties
    and events open across the cuts everywhere), they give the same attribution, to the bit."""
    from trainperf.trace import hostmap

    whole = analyze_file(REAL / name)
    monkeypatch.setattr(hostmap, "CHUNK", 97)
    monkeypatch.setattr(replay, "CHUNK", 97)
    cut = analyze_file(REAL / name)
    assert cut["attribution"] == whole["attribution"] and cut["_comm"] == whole["_comm"]
    assert whole["attribution"]["idle_causes"]


def test_the_charges_are_computed_once_per_timeline_and_table():
    tl = read_timeline(TRACES / "a100_ddp_gen_lines_ns.json.gz")
    assert charges(tl) is charges(tl)
    assert charges(tl, ["my_all_to_all"]) is not charges(tl)


def test_an_attribution_again_on_the_same_charges_gives_the_same():
    from trainperf.trace.attribution import attribute

    tl = read_timeline(REAL / "tb-data/resnet50_num_workers_0/worker0.pt.trace.json.gz")
    st = tb.steps(tl, tb.launch_index(tl))
    first = attribute(tl, st["spans"], st["host"])
    assert charges(tl).hmap.r_lo is None and charges(tl).graph is None  # released once the gains are known
    assert attribute(tl, st["spans"], st["host"]) == first


def test_innermost_labels_nested_intervals():
    lo = np.array([0, 1, 2, 5, 5, 8.0])
    hi = np.array([10, 4, 3, 7, 6, 9.0])
    a, b, i = innermost(lo, hi)
    assert list(zip(a, b, i)) == [(0, 1, 0), (1, 2, 1), (2, 3, 2), (3, 4, 1), (4, 5, 0), (5, 6, 4), (6, 7, 3),
                                  (7, 8, 0), (8, 9, 5), (9, 10, 0)]


def test_innermost_gives_an_instant_to_the_latest_starting_cover_when_intervals_do_not_nest():
    # [3, 8) starts inside [2, 4) and ends after it; [5, 12) ends after its parent [0, 10); two alike: the tie
    lo = np.array([0, 2, 3, 5, 20, 20.0])
    hi = np.array([10, 4, 8, 12, 21, 21.0])
    a, b, i = innermost(lo, hi, np.array([0, 1, 2, 3, 9, 8]))
    assert list(zip(a, b, i)) == [(0, 2, 0), (2, 3, 1), (3, 5, 2), (5, 12, 3), (20, 21, 4)]


def test_innermost_matches_a_brute_force_on_random_intervals():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        lo = rng.integers(0, 60, n).astype(float)
        hi = lo + rng.integers(0, 25, n)
        tie = rng.permutation(n)
        a, b, lab = innermost(lo, hi, tie)
        for s, e, i in zip(a, b, lab):
            x = (s + e) / 2
            cover = [j for j in range(n) if lo[j] <= x < hi[j]]
            want = max(cover, key=lambda j: (lo[j], -hi[j], tie[j]))  # latest start, then shorter, then the tie
            assert i == want
        covered = sum(b - a)
        grid = np.arange(0, 100, 0.5) + 0.25
        assert covered == pytest.approx(0.5 * sum(any(lo[j] <= x < hi[j] for j in range(n)) for x in grid))


@pytest.mark.parametrize("name,kind", [
    ("cudaFree", "allocator"), ("hipFree", "allocator"), ("cudaMallocAsync", "allocator"),
    ("cudaHostAlloc", "allocator"), ("hipHostMalloc", "allocator"), ("cuMemFree_v2", "allocator"),
    ("cudaFreeHost", "allocator"), ("cuMemMap", "allocator"),
    ("cudaStreamSynchronize", "sync"), ("hipDeviceSynchronize", "sync"), ("cudaEventSynchronize", "sync"),
    ("cudaMemcpy", "sync"), ("hipMemcpyWithStream", "sync"), ("aten::item", "other"),
    ("cudaLaunchKernel", "launch"), ("hipExtModuleLaunchKernel", "launch"), ("cuLaunchKernelEx", "launch"),
    ("cudaMemcpyAsync", "launch"), ("hipMemsetD32Async", "launch"), ("cudaGraphLaunch", "launch"),
    ("Python GC", "gc"), ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "dataloader"),
    ("Optimizer.step#AdamW.step", "optimizer"), ("Optimizer.zero_grad#SGD.zero_grad", "optimizer"),
    ("ProfilerStep#12", "step"), ("cudaEventRecord", "other"), ("aten::mm", "other"),
])
def test_host_calls_and_phases_come_from_the_one_table(name, kind):
    assert host_kind(name) == kind

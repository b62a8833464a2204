"""The HybridLoader's prefetch depth and IO threads come from measured rates, not fixed defaults.

The derivation is arithmetic (checked exactly); the loader's part is behaviour: it measures the read
latency and the consumer's step, grows its settings from them, and a re-plan (a restart of the prefetch)
loses and repeats no batch. No assertion on a speed: the bounds below hold on a busy machine.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from trainperf.data.hybrid import HybridLoader
from trainperf.data.loader import SimpleLoader
from trainperf.data.prefetch_plan import plan_prefetch
from trainperf.data.sampler import GlobalBatchSampler
from trainperf.data.sources import SlowStorage
from tests.unit.data_fixtures import Ids

T = 8


def test_io_threads_follow_littles_law_on_the_read_latency():
    # 32 samples per 100 ms step on 2 workers: 160 samples/s each; 7 ms reads: 1.12 in flight, x2 headroom
    p = plan_prefetch(batch=32, read_s=0.007, serial_s=0.0005, workers=2, step_s=0.100)
    assert p.need_samples_s == pytest.approx(320)
    assert p.io_threads == math.ceil(2 * 160 * 0.007) == 3
    # ten times the latency: ten times the reads in flight
    slow = plan_prefetch(batch=32, read_s=0.070, serial_s=0.0005, workers=2, step_s=0.100)
    assert slow.io_threads == math.ceil(2 * 160 * 0.070) == 23
    # a cache that serves half the reads halves them
    assert plan_prefetch(batch=32, read_s=0.070, serial_s=0.0005, workers=2, step_s=0.100,
                         miss_fraction=0.5).io_threads == math.ceil(2 * 160 * 0.070 * 0.5)


def test_slots_cover_a_batch_latency_and_ready_batches_cover_a_late_worker():
    p = plan_prefetch(batch=32, read_s=0.070, serial_s=0.0005, workers=2, step_s=0.100)
    batch_s = math.ceil(32 / p.io_threads) * 0.070 + 32 * 0.0005  # reads in waves of io_threads, then decode
    assert p.batch_s == pytest.approx(batch_s)
    assert p.slots == max(4, math.ceil(2 * batch_s / 0.100) + 1)
    assert p.depth == max(2, math.ceil(2 * batch_s / (2 * 0.100)))
    # a faster step needs more batches in production at once
    fast = plan_prefetch(batch=32, read_s=0.070, serial_s=0.0005, workers=2, step_s=0.020)
    assert fast.slots > p.slots and fast.io_threads > p.io_threads and fast.depth >= p.depth
    # at least 2 slots per worker: each always has one batch queued behind the one it works on
    assert plan_prefetch(batch=4, read_s=0.0, serial_s=1e-5, workers=8, step_s=1.0).slots == 16


def test_an_unknown_or_too_fast_step_is_sized_for_what_the_workers_can_deliver():
    unknown = plan_prefetch(batch=32, read_s=0.007, serial_s=0.0005, workers=2)
    assert not unknown.measured_step and unknown.step_s == pytest.approx(32 * 0.0005 / 2)
    assert unknown.utilization == pytest.approx(1.0) and unknown.cpu_bound
    too_fast = plan_prefetch(batch=32, read_s=0.007, serial_s=0.0005, workers=2, step_s=1e-4)
    assert too_fast.measured_step and too_fast.step_s == unknown.step_s
    assert (too_fast.io_threads, too_fast.slots, too_fast.depth) == (unknown.io_threads, unknown.slots, unknown.depth)
    # the bench data default case, 7 ms reads and 0.5 ms decode on 2 workers, a 12 ms step
    p = plan_prefetch(batch=32, read_s=0.007, serial_s=0.0005, workers=2, step_s=0.012)
    assert p.utilization == pytest.approx(32 * 0.0005 / 2 / 0.012) and p.cpu_bound  # 0.67 > 1 / headroom
    assert not plan_prefetch(batch=32, read_s=0.007, serial_s=0.0005, workers=4, step_s=0.012).cpu_bound


def test_bounds_and_bad_input():
    huge = plan_prefetch(batch=4096, read_s=1.0, serial_s=1e-6, workers=1, step_s=0.01)
    assert huge.io_threads == 64 and huge.slots == 64 and huge.depth == 64
    assert plan_prefetch(batch=8, read_s=0.01, serial_s=0.001, workers=0, step_s=0.1).slots >= 2  # in-process
    with pytest.raises(ValueError, match="batch >= 1"):
        plan_prefetch(batch=0, read_s=0.01, serial_s=0.0, workers=1)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_plans_from_its_measurements_and_a_replan_loses_no_batch(workers):
    """40 ms reads, a consumer that takes 20 ms a step on 16 samples: the loader measures both and grows its
    IO threads past the 8 it starts with to what Little's law asks for (2 x 16 / 0.020 x 0.040 / workers
    reads in flight); the batches are exactly the simple loader's across the re-plans (a restart re-reads
    what was prefetched)."""
    src = Ids(96)
    ref = SimpleLoader(src, GlobalBatchSampler(96, 16, seed=2), torch.device("cpu"))
    expected = [ref.next_batch()[0][:, 0].tolist() for _ in range(40)]
    with HybridLoader(SlowStorage(src, read_latency_ms=40.0), GlobalBatchSampler(96, 16, seed=2), "cpu",
                      num_workers=workers) as ld:
        assert ld.auto_threads and ld.auto_depth and not ld.plan.measured_step
        assert ld.probe_read_s >= 0.039  # the probe reads measured the latency
        start = ld.stats()
        got = []
        for _ in range(40):
            got.append(ld.next_batch()[0][:, 0].tolist())
            time.sleep(0.020)  # the step
        st = ld.stats()
    assert got == expected
    assert start["io_threads"] == HybridLoader.START_IO_THREADS and st["io_threads"] > start["io_threads"]
    plan = st["plan"]
    assert plan["measured_step"] and plan["read_s"] >= 0.039 and plan["step_s"] >= 0.019
    # the settings are the derivation from what the loader measured (or what it had: they only grow)
    again = plan_prefetch(batch=16, read_s=plan["read_s"], serial_s=plan["serial_s"], workers=workers,
                          step_s=plan["step_s"])
    assert st["io_threads"] >= again.io_threads and st["host_slots"] >= again.slots and st["depth"] >= again.depth
    assert again.io_threads == min(64, math.ceil(2 * 16 / plan["step_s"] / max(1, workers) * plan["read_s"] - 1e-9))


def test_fixed_settings_are_kept():
    with HybridLoader(Ids(64), GlobalBatchSampler(64, 8, seed=0), "cpu", num_workers=0, io_threads=3, depth=5,
                      prefetch_factor=2) as ld:
        for _ in range(20):
            ld.next_batch()
        st = ld.stats()
    assert (st["io_threads"], st["host_slots"], st["depth"]) == (3, 2, 5)

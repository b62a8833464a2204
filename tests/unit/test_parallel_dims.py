"""ParallelDims, pipeline splitting, compression checks, fail-fast reports, byte counting (no processes)."""

from __future__ import annotations

import os
import time

import pytest

from trainperf.config.schema import Config
from trainperf.distributed.parallel_dims import ParallelDims, check_compression
from trainperf.errors import ConfigError


def _cfg(**par):
    cfg = Config()
    for k, v in par.items():
        setattr(cfg.parallelism, k, v)
    return cfg


def test_data_degree_is_derived_and_coordinates_follow_the_mesh_order():
    dims = ParallelDims.from_config(_cfg(tensor=2, pipeline=2), world_size=8)
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp) == (2, 2, 1, 2)
    # tp innermost: ranks 0,1 are one tensor group; pipeline outermost
    assert dims.coords(1) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 1, "dp": 0}
    assert dims.coords(2)["dp"] == 1 and dims.coords(5)["pp"] == 1
    assert [dims.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_hsdp_data_rank_spans_replicate_and_shard():
    dims = ParallelDims.from_config(_cfg(data=2, data_shard=2), world_size=4)
    assert dims.dp == 4 and [dims.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


def test_product_mismatch_names_the_fix():
    with pytest.raises(ConfigError, match=r"2 x 1 x 2 x 1 = 4, but the world size is 8; launch 4 processes"):
        ParallelDims.from_config(_cfg(data=2, tensor=2), world_size=8)
    with pytest.raises(ConfigError, match="not divisible by parallelism.tensor x pipeline x data_shard"):
        ParallelDims.from_config(_cfg(tensor=3), world_size=4)


def test_model_shape_checks_name_the_choices():
    """One shape check (train.resolve.check_model_shape) for resolve, launch and plan."""
    from trainperf.config import load_config
    from trainperf.train.resolve import check_model_shape

    base = ["model.n_layer=4", "model.n_head=8", "model.n_embd=64"]
    with pytest.raises(ConfigError, match=r"tensor=3 does not divide model.n_head=8 .*choose parallelism.tensor among "
                                          r"1, 2, 4, 8"):
        check_model_shape(load_config(None, base + ["parallelism.tensor=3"]))
    inter = ["parallelism.pipeline_schedule=interleaved_1f1b"]  # interleave counts for that schedule only
    with pytest.raises(ConfigError, match=r"4 x 2 = 8 stages exceeds model.n_layer=4 .*choose pipeline <= 2"):
        check_model_shape(load_config(None, base + inter + ["parallelism.pipeline=4", "parallelism.interleave=2"]))
    check_model_shape(load_config(None, base + inter + ["parallelism.pipeline=2", "parallelism.interleave=2"]))


def test_compression_checks():
    check_compression("none", dp_replicate=1, dp_shard=1, tp=1)
    check_compression("powersgd", dp_replicate=2, dp_shard=1, tp=1)
    for kw, needle in [({"dp_replicate": 1, "dp_shard": 2, "tp": 1}, "fsdp_reduce_dtype"),
                       ({"dp_replicate": 1, "dp_shard": 1, "tp": 1}, "nothing is all-reduced"),
                       ({"dp_replicate": 2, "dp_shard": 1, "tp": 2}, "tensor=2"),
                       ({"dp_replicate": 2, "dp_shard": 1, "tp": 1, "pp": 2}, "pipeline=2")]:
        with pytest.raises(ConfigError, match=needle):
            check_compression("fp16", **kw)


def test_split_layers_balances_cost_and_keeps_a_block_per_stage():
    from trainperf.distributed.pipeline import block_costs, split_layers, stage_ids

    assert split_layers([1.0] * 4, 2) == [[0, 1], [2, 3]]
    # a heavy head on the last stage pushes blocks to the first
    assert split_layers([1.0] * 4, 2, last_extra=2.0) == [[0, 1, 2], [3]]
    assert split_layers([1.0] * 3, 3) == [[0], [1], [2]]
    costs, first, last = block_costs(12, 768, 1024, 50304)
    split = split_layers(costs, 4, first_extra=first, last_extra=last)
    assert sum(len(s) for s in split) == 12 and all(split)
    assert len(split[-1]) < len(split[0])  # GPT-2's 50k-vocab head costs about 2 blocks
    assert stage_ids(1, 2, 2) == [1, 3]
    with pytest.raises(ValueError):
        split_layers([1.0] * 2, 3)


def test_nccl_defaults_fail_fast_and_refuse_disabled_error_handling():
    from trainperf.distributed.init import nccl_env_defaults, pick_backend

    env = nccl_env_defaults(True, environ={})
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in env
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in nccl_env_defaults(False, environ={})
    with pytest.raises(ConfigError, match="hang"):
        nccl_env_defaults(True, environ={"NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert pick_backend("auto", "cuda") == "nccl" and pick_backend("auto", "cpu") == "gloo"
    with pytest.raises(ConfigError):
        pick_backend("nccl", "cpu")


class _Store:
    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def check(self, keys):
        return all(k in self.d for k in keys)

    def get(self, k):
        return self.d[k]


def test_failure_report_names_dead_and_hung_ranks():
    from trainperf.distributed.failure import FailFast

    store = _Store()
    now = time.time()
    store.set("trainperf/heartbeat/1", f"3 {now - 1:.3f}")
    store.set("trainperf/alive/1", f"{now - 10:.3f}")  # silent for 10 s, no process to look at: dead or frozen
    store.set("trainperf/heartbeat/2", f"3 {now - 30:.3f}")
    store.set("trainperf/alive/2", f"{now:.3f}")  # alive but 30 s in step 3: hung
    store.set("trainperf/heartbeat/3", f"2 {now:.3f}")
    store.set("trainperf/alive/3", f"{now:.3f}")
    ff = FailFast(0, 4, timeout_s=20, store=store, watchdog=False)
    ff.step = 3
    text = ff.report("RuntimeError: boom")
    assert text.startswith("trainperf: rank 0 stopped at step 3: RuntimeError: boom.")
    assert "rank 1 died or froze (no sign of life for 10.0s; it was in step 3)" in text
    assert "rank 2 hung (alive, stuck in step 3 for 30.0s)" in text
    assert "rank 3 is behind (still in step 2)" in text
    assert "distributed.timeout_s=20" in text


def test_a_peer_killed_between_steps_is_reported_dead_not_behind(monkeypatch):
    """Killed after its last collective of step 2, before it began step 3: at first it only looks behind;
    the report waits for its sign of life to go stale and names it dead, with the step it was in."""
    from trainperf.distributed import failure

    monkeypatch.setattr(failure, "_DEAD_AFTER_S", 0.4)
    monkeypatch.setattr(failure, "_ALIVE_EVERY_S", 0.1)
    store = _Store()
    now = time.time()
    store.set("trainperf/heartbeat/1", f"2 {now - 0.2:.3f}")
    store.set("trainperf/alive/1", f"{now:.3f}")  # fresh now, never refreshed again: it was killed
    ff = failure.FailFast(0, 2, timeout_s=20, store=store, watchdog=False)
    ff.step = 3
    assert ff.suspects() == ["rank 1 is behind (still in step 2)"]
    text = ff.report("RuntimeError: Connection reset by peer")
    assert "Cause: rank 1 died or froze (no sign of life for" in text and "it was in step 2)" in text
    assert "behind" not in text


def test_a_silent_peer_on_this_host_is_named_dead_or_frozen_and_a_stopped_one_is_ended(monkeypatch):
    """A peer's sign of life holds its pid and host: on this host its process says whether it died or is
    frozen (stopped: it cannot act on the launcher's SIGTERM), and the failing rank SIGKILLs a stopped one."""
    import io
    import signal
    import subprocess
    import sys

    from trainperf.distributed import failure

    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while failure.process_state(stopped.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        store, now, host = _Store(), time.time(), failure._HOST
        for r, alive in ((1, f"{stopped.pid} {host}"), (2, f"{gone.pid} {host}"), (3, f"{stopped.pid} elsewhere")):
            store.set(f"trainperf/heartbeat/{r}", f"3 {now - 12:.3f}")
            store.set(f"trainperf/alive/{r}", f"{now - 10:.3f} {alive}")
        out = io.StringIO()
        ff = failure.FailFast(0, 4, timeout_s=10, store=store, watchdog=False, out=out)
        ff.step = 3

        def leave(code):
            raise SystemExit(code)

        monkeypatch.setattr(failure.os, "_exit", leave)
        with pytest.raises(SystemExit) as ended:
            ff.fail("RuntimeError: Timed out")
        text = out.getvalue()
        assert ended.value.code == failure.EXIT_CODE
        assert (f"rank 1 frozen / stopped (its process {stopped.pid} is stopped: SIGSTOP, or traced by a debugger; "
                "no sign of life for 10.0s; it was in step 3)") in text
        assert "rank 2 died (no sign of life for 10.0s; it was in step 3)" in text
        assert "rank 3 died or froze (no sign of life for 10.0s; it was in step 3)" in text  # another host's
        assert f"rank 1's stopped process {stopped.pid} killed (SIGKILL)" in text
        assert stopped.wait(timeout=10) == -signal.SIGKILL
    finally:
        if stopped.poll() is None:
            os.kill(stopped.pid, signal.SIGCONT)
            stopped.kill()
            stopped.wait()


def test_the_watchdog_ends_a_rank_stalled_past_the_timeout_only_when_a_peer_is_silent(monkeypatch):
    """Wherever a rank waits (a store call, a collective whose own timeout is longer), after timeout_s without a
    step its watchdog ends it if a peer gives no sign of life; a peer that is alive (a slow step) leaves it be."""
    import subprocess
    import sys
    import threading

    from trainperf.distributed import failure

    monkeypatch.setattr(failure, "_DEAD_AFTER_S", 0.3)
    monkeypatch.setattr(failure, "_ALIVE_EVERY_S", 0.05)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for silent in (False, True):
        store, now = _Store(), time.time()
        store.set("trainperf/heartbeat/1", f"1 {now:.3f}")
        store.set("trainperf/alive/1", f"{now - (5 if silent else 0):.3f} {gone.pid} {failure._HOST}")
        ff = failure.FailFast(0, 2, timeout_s=0.5, store=store, watchdog=False)
        ff.step, ff.last_beat = 1, time.monotonic() - 1.0  # stalled past the timeout
        calls: list[str] = []
        monkeypatch.setattr(ff, "fail", lambda reason, code=failure.EXIT_CODE: (calls.append(reason), ff._done.set()))
        if not silent:  # a live peer keeps refreshing its sign of life
            monkeypatch.setattr(ff, "heartbeats", lambda: {1: {"step": 1, "step_age": 0.0, "alive_age": 0.0}})
        watch = threading.Thread(target=ff._watch)
        watch.start()
        watch.join(0.6 if not silent else 5)
        ff.close()
        watch.join(5)
        if silent:
            assert calls and "a peer gives no sign of life (watchdog)" in calls[0], calls
        else:
            assert calls == [], calls


def test_a_slow_peer_that_stays_alive_is_reported_behind(monkeypatch):
    from trainperf.distributed import failure

    monkeypatch.setattr(failure, "_DEAD_AFTER_S", 0.3)
    monkeypatch.setattr(failure, "_ALIVE_EVERY_S", 0.1)

    class _Live(_Store):
        def get(self, k):  # a live rank keeps refreshing its sign of life
            if k.startswith("trainperf/alive/"):
                return f"{time.time():.3f}".encode()
            return super().get(k)

    store = _Live()
    store.set("trainperf/heartbeat/1", f"2 {time.time():.3f}")
    store.set("trainperf/alive/1", f"{time.time():.3f}")
    ff = failure.FailFast(0, 2, timeout_s=20, store=store, watchdog=False)
    ff.step = 3
    assert "Cause: rank 1 is behind (still in step 2)." in ff.report("RuntimeError: boom")


def test_comm_counter_ring_formula():
    import torch

    from trainperf.distributed.ddp import CommCounter

    c = CommCounter()
    c.add_allreduce(torch.zeros(1000), n=4)  # 4000 bytes, ring 2 * 3/4
    assert c.take() == {"comm_payload_bytes": 4000, "comm_wire_bytes": 6000, "comm_calls": 1}
    assert c.take()["comm_payload_bytes"] == 0


def test_powersgd_formula_is_over_10x_at_hidden_128():
    from trainperf.bench.comm import BENCH_MODEL, formula_bytes
    from trainperf.bench.harness import make_config
    from trainperf.models.build import build_model

    cfg = make_config({**BENCH_MODEL, "parallelism.data": 2})
    meta = build_model(cfg, device="cpu", materialize=False)
    numel = sum(p.numel() for p in meta.parameters())
    mats = [tuple(p.shape) for p in meta.parameters() if p.dim() == 2]
    vecs = sum(p.numel() for p in meta.parameters() if p.dim() != 2)
    plain = formula_bytes("d", cfg, numel, mats, vecs, 2)
    cfg.parallelism.compression.type = "powersgd"
    assert plain / formula_bytes("p", cfg, numel, mats, vecs, 2) >= 10


def test_fp16_hook_the_backend_cannot_run_is_a_config_error(monkeypatch):
    import datetime

    import torch
    import torch.distributed as dist

    from trainperf.distributed import ddp
    from trainperf.distributed.spawn import free_port

    monkeypatch.setattr(ddp, "backend_supports_allreduce", lambda *a: False)  # as on a backend without fp16
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        with pytest.raises(ConfigError, match="cannot all-reduce float16"):
            ddp.apply_ddp(torch.nn.Linear(4, 4), dist.group.WORLD, counter=ddp.CommCounter(), compression="fp16")
        # bf16 falls back to all-gathering the 16-bit payloads instead of failing
        ddp.apply_ddp(torch.nn.Linear(4, 4), dist.group.WORLD, counter=ddp.CommCounter(), compression="bf16")
    finally:
        dist.destroy_process_group()

"""Two gloo processes, one slowed down: rank 0 waits in its gradient all-reduce (exposed comm).

Each rank runs a tiny model with the PhaseTimer and the Monitor (as the trainer does) and writes
its own metrics file; the diagnosis reads both and finds comm_bound (rank 0 waits) and the
straggler (rank 1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainperf.diagnosis.engine import diagnose
from trainperf.diagnosis.text import format_findings

WORKER = r"""
import sys, time, torch, torch.distributed as dist
sys.path.insert(0, ROOT)
from trainperf.config import load_config
from trainperf.monitor.monitor import Monitor
from trainperf.monitor.phases import PhaseTimer
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
cfg = load_config(None, ["monitor.sample_every_s=0.1", "monitor.mfu=false"])
mon = Monitor(cfg.monitor, RUN_DIR)
assert (mon.rank, mon.world) == (rank, 2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
timer = PhaseTimer("cpu")
mon.timer = timer
for step in range(1, 9):
    t0 = time.perf_counter()
    timer.start_step()
    timer.phase("data")
    x = torch.randn(32, 64)
    timer.phase("forward")
    loss = model(x).pow(2).mean()
    if rank == 1:
        time.sleep(0.12)  # the straggler: a slow device
    timer.phase("backward")
    loss.backward()
    timer.phase("comm")  # exposed all-reduce: rank 0 waits here for rank 1
    for p in model.parameters():
        dist.all_reduce(p.grad)
    timer.phase("optimizer")
    opt.step(); opt.zero_grad()
    phases = timer.end_step()
    dt = time.perf_counter() - t0
    mon.after_step(step)
    mon.write({"step": step, "loss": float(loss), "step_time_s": dt, "tokens_per_s": 64 / dt, "phases_s": phases})
mon.close()
del model, opt, loss
from trainperf.distributed.init import destroy_distributed
destroy_distributed(barrier=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.distributed
def test_gloo_delayed_rank_gives_comm_bound_and_straggler(tmp_path):
    run_dir = tmp_path / "run"
    code = f"ROOT = {str(ROOT)!r}\nRUN_DIR = {str(run_dir)!r}\n" + WORKER
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.rank1.jsonl").exists()
    assert (run_dir / "samples.rank1.jsonl").exists()
    result = diagnose(run_dir)
    got = {f["id"]: f for f in result["findings"]}
    assert "comm_bound" in got, format_findings(result)
    assert got["straggler"]["rank"] == 1, format_findings(result)
    assert result["summary"]["ranks"][0]["comm_s"] > 0.08

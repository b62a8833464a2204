"""The ``busy`` fault (``TRAINPERF_FAULT=busy``): a rank starts a busy process on its own CPUs at the step asked
(the straggler that appears mid-run of ``bench balance --mid-run``); it ends with the rank, also a killed one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainperf.distributed import failure
from trainperf.errors import ConfigError
from trainperf.train.knobs import from_environ

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and CPU affinity are Linux's")


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    return failure.process_state(pid) not in ("gone", "Z")


def test_the_fault_starts_a_busy_process_at_its_step_only_on_its_rank_and_ends_it():
    fault = ("busy", 1, 5)
    for step in range(5):
        failure.inject_fault(fault, 1, step)
    failure.inject_fault(fault, 0, 5)  # another rank: nothing
    assert failure.busy_log == [] and failure._busy == []
    failure.inject_fault(fault, 1, 5)
    try:
        assert [e["step"] for e in failure.busy_log] == [5]
        (proc,) = failure._busy
        assert os.sched_getaffinity(proc.pid) == os.sched_getaffinity(0)  # on this rank's CPUs
        t0 = _cpu_seconds(proc.pid)
        time.sleep(0.6)
        assert _cpu_seconds(proc.pid) - t0 > 0.1  # it computes (a share of a CPU, even on a busy machine)
    finally:
        failure.end_busy()
        failure.busy_log.clear()
    assert proc.poll() is not None and failure._busy == []


def test_the_busy_process_dies_with_a_killed_rank(tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from trainperf.distributed.failure import start_busy
        print(start_busy(3).pid, flush=True)
        time.sleep(60)
    """)
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(rank.stdout.readline())
        assert _alive(pid)
        rank.send_signal(signal.SIGKILL)  # no clean-up runs in the rank
        rank.wait()
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the busy process outlived its rank"
    finally:
        rank.kill()


def test_the_cli_knob_takes_busy_and_names_the_kinds_on_a_typo():
    k = from_environ({"TRAINPERF_FAULT": "busy", "TRAINPERF_FAULT_RANK": "1", "TRAINPERF_FAULT_STEP": "30"})
    assert k.fault == ("busy", 1, 30)
    with pytest.raises(ConfigError, match="busy"):
        from_environ({"TRAINPERF_FAULT": "bussy"})

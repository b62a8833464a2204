"""Reading many ranks (trainperf/trace/job.py): the files of a job read by a pool of processes give the same
figures as one process, progress still counts every byte, a broken file or a file that is not a trace is
handled as before; and a directory of 256 generated ranks is read with a peak memory bounded by the workers,
not by the ranks (the bound is stated in job.py's docstring: parent = its base + the N small results; each
worker = the base it forked from + one rank's peak). Memory is measured in child processes (their own
high-water mark, VmHWM, and RUSAGE_CHILDREN for the workers), never as a speed mark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.trace_factory import base_rank
from trainperf.errors import UserError
from trainperf.trace.job import default_workers, read_traces, usable_cores
from trainperf.tracegen.ranks import make_job

ROOT = Path(__file__).resolve().parents[2]

MEASURE = r"""
import json, pickle, resource, sys
from pathlib import Path

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

from trainperf.trace.job import read_traces  # the imports are the parent's base
base = hwm()
files = sorted(Path(sys.argv[1]).glob("rank*.pt.trace.json.gz"), key=lambda p: int(p.name[4:].split(".")[0]))
files = files[:int(sys.argv[2])]
results, across = read_traces(files, workers=int(sys.argv[3]))
late = across.get("late_arrivals") or [{}]
print(json.dumps({"ranks": len(results), "parent_base_mb": base, "parent_peak_mb": hwm(),
                  "children_max_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "results_mb": sum(len(pickle.dumps(r)) for r in results) / 2**20,
                  "late_rank": late[0].get("rank"), "cause": late[0].get("cause")}))
"""


def _measure(d: Path, n: int, workers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(d), str(n), str(workers)], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("job")
    src = base_rank(d / "src" / "base.json.gz", steps=6)
    truth = make_job(src, d / "ranks", world=6, late=4, cause="allocator", late_us=2500.0, free_calls=2,
                     clock_offsets_us={1: 400.0, 5: -900.0})
    return d / "ranks", truth


def test_a_pool_of_workers_gives_the_figures_of_one_process(job):
    d, truth = job
    files = sorted(d.glob("rank*.pt.trace.json.gz"))
    one_res, one = read_traces(files, workers=1)
    many_res, many = read_traces(files, workers=3)
    assert json.dumps(many, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert [r["rank"] for r in many_res] == list(range(6)) and many["late_arrivals"][0]["rank"] == 4
    strip = lambda r: {k: v for k, v in r.items() if k != "_comm"}  # noqa: E731 - numpy columns: compared apart
    assert [strip(r) for r in many_res] == [strip(r) for r in one_res]
    for a, b in zip(many_res, one_res):
        assert a["_comm"]["ts"].tolist() == b["_comm"]["ts"].tolist()
        assert a["_comm"]["causes"].tolist() == b["_comm"]["causes"].tolist()


def test_progress_counts_every_byte_once_from_the_workers(job):
    d, _ = job
    files = sorted(d.glob("rank*.pt.trace.json.gz"))
    seen: list[int] = []
    read_traces(files, workers=2, progress=seen.append)
    total = sum(f.stat().st_size for f in files)
    assert seen and seen[-1] == total and all(b >= a for a, b in zip(seen, seen[1:]))


def test_not_a_trace_is_skipped_and_a_broken_one_is_an_error_in_the_pool_too(job, tmp_path):
    d, _ = job
    files = sorted(d.glob("rank*.pt.trace.json.gz"))[:3]
    other = tmp_path / "config.json"
    other.write_text('{"lr": 0.1}')
    _, across = read_traces(files + [other], workers=2)
    assert [Path(s["path"]).name for s in across["skipped"]] == ["config.json"]
    broken = tmp_path / "rank9.pt.trace.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, ')
    with pytest.raises(UserError, match="rank9.pt.trace.json"):
        read_traces(files + [broken], workers=2)
    with pytest.raises(UserError, match="workers=0"):
        read_traces(files, workers=0)


def test_one_worker_per_usable_core_and_never_more_than_files():
    assert default_workers(1) == 1 and 1 <= default_workers(10_000) == usable_cores()


@pytest.mark.slow
def test_256_ranks_read_with_a_peak_memory_bounded_by_the_workers_not_the_ranks(tmp_path):
    src = base_rank(tmp_path / "base.json.gz", steps=20)
    truth = make_job(src, tmp_path / "job", world=256, late=201, cause="dataloader", late_us=3000.0,
                     dataloader_us=500.0)
    d = tmp_path / "job"
    one = _measure(d, 1, 1)  # one rank in one process: its growth over the base is one rank's peak
    few = _measure(d, 16, 2)
    many = _measure(d, 256, 2)
    assert many["ranks"] == 256 and (many["late_rank"], many["cause"]) == (truth["late_rank"], "dataloader")
    one_rank = one["parent_peak_mb"] - one["parent_base_mb"]
    slack = 16.0  # allocator and page-cache noise, MB
    # each worker: the base it forked from + one rank's peak, whether it read 8 files or 128
    assert many["children_max_mb"] <= many["parent_base_mb"] + one_rank + slack, (one, many)
    assert many["children_max_mb"] <= few["children_max_mb"] + slack, (few, many)
    # the parent: its base + the results, whose in-memory size is a small multiple of their pickled size
    grown = many["parent_peak_mb"] - many["parent_base_mb"]
    assert grown <= 12 * many["results_mb"] + slack, many
    assert many["results_mb"] / 256 < 0.1  # under 100 KB per rank: the "small result"

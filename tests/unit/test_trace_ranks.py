"""Which traces a PATH holds and which rank each is (trainperf/trace/ranks.py), and the multi-rank generator
(trainperf/tracegen/synth.py) whose straggler and waits are known: checked here on the raw events, so these
tests do not depend on the reader. A real rank (HTA's A100 trace, committed under tests/data/real) and a
generated one everywhere (CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.trace_factory import base_rank, comm_rows, read_json
from tests.unit.trace_fixtures import real_trace
from trainperf.errors import UserError
from trainperf.tracegen import ranks as tracegen_ranks
from trainperf.trace.ranks import across_ranks, assign_ranks, comm_waits, discover, rank_from_name

HTA_A100 = "hta-data/tests/data/nccl_parser_config/nccl_data.json.gz"  # committed under tests/data/real


@pytest.mark.parametrize("name,rank", [
    ("rank-3.json.gz", 3), ("rank3.json", 3), ("rank_3.pt.trace.json", 3), ("worker3.pt.trace.json.gz", 3),
    ("job_rank12_step9.json", 12), ("sampled_rank-1.json.gz", 1), ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
    ("worker0.1623143566756.pt.trace.json.gz", 0), ("trace_rank0_step3.json.gz", 0), ("trace.json", None),
    ("myrank3.json", None), ("frank3.json", None),
])
def test_rank_from_the_file_name(name, rank):
    assert rank_from_name(name) == rank


def test_ranks_from_distributed_info_then_name_then_order():
    paths = [Path("a.json"), Path("worker1.json"), Path("b.json"), Path("x.json")]
    infos = [{"rank": 2, "world_size": 4}, None, None, {"rank": 0, "world_size": 4}]
    assert assign_ranks(paths, infos) == [(2, "distributedInfo"), (1, "file name"), (3, "order"), (0, "distributedInfo")]
    assert assign_ranks([Path("t.json")], [None]) == [(0, "order")]


@pytest.mark.parametrize("paths,infos,words", [
    (["rank0.json", "worker0.json"], [None, None], ["two traces of rank 0", "rank0.json", "worker0.json"]),
    (["a.json", "b.json"], [{"rank": 1, "world_size": 2}, {"rank": 1, "world_size": 2}], ["two traces of rank 1"]),
    (["rank3.json", "b.json"], [{"rank": 5, "world_size": 8}, None], ["rank3.json", "says rank 3", "rank is 5", "mixed up"]),
    (["a.json", "b.json"], [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 8}], ["different sizes"]),
    (["a.json"], [{"rank": 4, "world_size": 2}], ["not below its world_size"]),
])
def test_duplicate_and_mixed_up_ranks_are_user_errors(paths, infos, words):
    with pytest.raises(UserError) as e:
        assign_ranks([Path(p) for p in paths], infos)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_discover_file_dir_run_dir_and_errors(tmp_path):
    t = base_rank(tmp_path / "one" / "rank0.pt.trace.json.gz")
    assert discover(t) == {"kind": "file", "path": t, "files": [t], "run_dir": None}
    (tmp_path / "one" / "notes.txt").write_text("x")
    (tmp_path / "one" / "config.json").write_text("{}")
    assert discover(tmp_path / "one")["files"] == [t]  # torch-named traces win over other .json files
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    base_rank(run / "profile" / "trace_rank0_step3.json.gz")
    d = discover(run)
    assert d["kind"] == "run" and [p.name for p in d["files"]] == ["trace_rank0_step3.json.gz"]
    (tmp_path / "empty").mkdir()
    for bad, words in ((tmp_path / "nope", "does not exist"), (tmp_path / "empty", "holds no trace"),
                       (tmp_path / "one" / "notes.txt", "is not a trace file")):
        with pytest.raises(UserError, match=words):
            discover(bad)


def _check_generated(src: Path, out: Path, *, world: int, straggler: int, slowdown: float) -> dict:
    truth = tracegen_ranks.multi_rank(src, out, world=world, straggler=straggler, slowdown=slowdown)
    files = sorted(out.glob("rank*.pt.trace.json.gz"))
    assert len(files) == world
    rows = {}
    for f in files:
        d = read_json(f)
        assert d["distributedInfo"]["rank"] == rank_from_name(f.name) and d["distributedInfo"]["world_size"] == world
        rows[d["distributedInfo"]["rank"]] = comm_rows(f)
    w = comm_waits(rows)
    assert w["unmatched"] == 0 and w["matched"] == truth["comm_kernels"] > 0
    for r in range(world):  # the measured wait is the injected one, collective by collective
        got = [x for _, x in w["waits"][r]]
        want = truth["ranks"][r]["wait_us_per_collective"]
        assert got == pytest.approx(want, abs=0.01), r
        if r == straggler:
            assert sum(got) == 0  # it arrives last at every collective
        else:
            assert sum(got) > 0
    # wall-clock step spans are alike on every rank: only compute tells the straggler apart
    spans = {}
    for f in files:
        ev = read_json(f)["traceEvents"]
        spans[f.name] = [round(e["dur"], 1) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
                         and e.get("cat") != "gpu_user_annotation"]
    assert len({tuple(v) for v in spans.values()}) == 1, spans
    comp = {r: v["compute_us_mean"] for r, v in truth["ranks"].items()}
    base = comp[(straggler + 1) % world]
    assert comp[straggler] == pytest.approx(slowdown * base)
    # and the fast ranks hold more GPU kernel time than the straggler (their NCCL kernels wait)
    kernel_time = {}
    for f in files:
        ev = read_json(f)["traceEvents"]
        kernel_time[read_json(f)["distributedInfo"]["rank"]] = sum(e["dur"] for e in ev if e.get("cat") == "kernel")
    assert all(kernel_time[r] > kernel_time[straggler] for r in range(world) if r != straggler), kernel_time
    return truth


def test_generated_ranks_from_a_generated_rank_have_known_waits(tmp_path):
    src = base_rank(tmp_path / "base.json.gz", steps=3)
    _check_generated(src, tmp_path / "mr", world=4, straggler=2, slowdown=1.4)
    src = base_rank(tmp_path / "nopg.json", steps=2, pg=False)  # no process group recorded: by stream order
    rows = {}
    tracegen_ranks.multi_rank(src, tmp_path / "mr2", world=2, straggler=0, slowdown=1.2)
    for r in range(2):
        rows[r] = comm_rows(tmp_path / "mr2" / f"rank{r}.pt.trace.json.gz")
    assert comm_waits(rows)["by"] == ["stream order"]


def test_generated_ranks_from_a_real_a100_rank_have_known_waits(tmp_path):
    truth = _check_generated(real_trace(HTA_A100), tmp_path / "mr", world=4, straggler=1, slowdown=1.3)
    assert truth["comm_kernels"] == 21 and truth["steps"] == 3


def test_matching_stops_at_the_first_disagreeing_collective():
    a = [[0, 10, 40, "ncclAllReduce", 0, "allreduce", "0"], [20, 10, 40, "ncclAllReduce", 0, "allreduce", "0"]]
    b = [[0, 30, 40, "ncclAllReduce", 0, "allreduce", "0"], [20, 10, 40, "ncclAllGather", 0, "allgather", "0"]]
    w = comm_waits({0: a, 1: b})
    assert w["matched"] == 1 and w["unmatched"] == 2 and w["waits"][1] == [(0, 20.0)] and w["waits"][0] == [(0, 0.0)]


def test_across_ranks_names_the_straggler_by_compute_not_wall_time():
    def res(rank, compute, comm_dur):
        return {"rank": rank, "path": f"r{rank}", "steps": 2, "step_time_us": 100_000.0,  # equal wall time
                "_step_compute_us": [compute, compute], "_step_comm_us": [comm_dur, comm_dur],
                "_comm": [[0, comm_dur, 40, "nccl", 0, "allreduce", "0"], [50, comm_dur, 40, "nccl", 1, "allreduce", "0"]]}

    out = across_ranks([res(0, 50_000, 30_000), res(1, 65_000, 15_000), res(2, 50_000, 30_000)])
    st = out["straggler"]
    assert st["rank"] == 1 and st["slower"] and st["ratio"] == pytest.approx(1.3)
    per = {p["rank"]: p for p in out["per_rank"]}
    assert per[1]["comm_wait_us_per_step"] == 0 and per[0]["comm_wait_us_per_step"] == pytest.approx(15_000)
    even = across_ranks([res(0, 50_000, 30_000), res(1, 52_000, 30_000)])
    assert not even["straggler"]["slower"]
    one = across_ranks([res(0, 50_000, 30_000)])
    assert one["straggler"] is None and "one rank" in one["note"]
    json.dumps(out)  # plain data

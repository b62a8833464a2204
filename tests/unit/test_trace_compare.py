"""``trainperf compare A B`` / ``report A B`` on two profiles: aligned on the step, a speed-up only where the
two are comparable (same GPU, same world size, enough steps), where the change came from, the findings that
went away or appeared."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainperf.diagnosis.trace_compare import comparable, compare_profiles, family, format_profiles, speedup
from trainperf.tracegen.generate import make_trace


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "trainperf", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    a, b = d / "a.json.gz", d / "b.json.gz"
    make_trace(a, kind="a100_ddp", steps=5, seed=1)
    make_trace(b, kind="a100_ddp", steps=5, seed=2)
    return a, b


def test_family_drops_template_arguments_and_parameters():
    assert family("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)") \
        == "at::native::vectorized_elementwise_kernel"
    assert family("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int)") \
        == "at::native::{anonymous}::vectorized_layer_norm_kernel"
    assert family("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"


def test_speedup_is_the_ratio_of_medians_with_an_interval_that_holds_it():
    a = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3]
    b = [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]
    got = speedup(a, b)
    assert got["speedup"] == pytest.approx(10.05 / 8.0)
    assert got["ci95"][0] <= got["speedup"] <= got["ci95"][1]
    assert got == speedup(a, b)  # deterministic
    wide = speedup([10.0, 30.0, 5.0], [8.0, 20.0, 4.0])
    assert wide["ci95"][1] - wide["ci95"][0] > got["ci95"][1] - got["ci95"][0]


def test_a_same_job_pair_is_comparable_and_near_one(pair):
    r = compare_profiles(*pair)
    assert r["comparable"] and r["not_comparable"] == []
    assert r["speedup"] == pytest.approx(1.0, abs=0.03)
    assert r["ci95"][0] <= r["speedup"] <= r["ci95"][1]
    assert set(r["categories_us"]) >= {"kernel", "communication", "dataloader"}
    assert r["a"]["steps"] == 5 and r["a"]["devices"] == ["NVIDIA A100-SXM4-80GB"]
    json.dumps(r, allow_nan=False)
    assert "speed-up B over A" in format_profiles(r)


def test_different_gpus_world_sizes_or_too_few_steps_are_refused_with_the_reason(tmp_path):
    a, v, short = tmp_path / "a.json.gz", tmp_path / "v.json.gz", tmp_path / "s.json.gz"
    make_trace(a, kind="a100_ddp", steps=4, seed=1)
    make_trace(v, kind="v100_18", steps=4, seed=3)
    make_trace(short, kind="a100_ddp", steps=2, seed=4)
    r = compare_profiles(a, v)
    assert not r["comparable"] and r["speedup"] is None and r["ci95"] is None
    assert any("a different GPU" in w for w in r["not_comparable"])
    assert "no speed-up claimed" in format_profiles(r)
    r = compare_profiles(a, short)
    assert not r["comparable"] and any("too few steps: B holds 2" in w for w in r["not_comparable"])
    side = {"devices": ["X"], "world_size": 8, "steps": 5}
    assert any("a different world size" in w for w in comparable(side, dict(side, world_size=4)))


def test_the_finding_that_went_away_is_named(tmp_path):
    """A data-bound V100 job against the same V100 job without its DataLoader time: data_bound went away."""
    from trainperf.tracegen.synth import load_trace, write_trace

    before = tmp_path / "before.json.gz"
    make_trace(before, kind="v100_18", steps=4, seed=3)
    meta, events = load_trace(before)
    kept = [e for e in events if not str(e.get("name", "")).startswith("enumerate(DataLoader)")]
    after = write_trace(tmp_path / "after.json.gz", meta, kept)
    r = compare_profiles(before, after)
    assert "data_bound" in [f["id"] for f in r["findings_gone"]]
    assert r["categories_us"]["dataloader"]["delta"] < 0


def test_cli_compare_and_report_on_two_profiles(pair, tmp_path):
    a, b = pair
    p = _cli("compare", a, b, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["comparable"] is True
    out = tmp_path / "cmp.html"
    p = _cli("report", a, b, "--out", out)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert "B is " in html and "Kernel families" in html and "<svg" in html


def test_cli_refuses_a_run_beside_a_profile_and_three_profiles(pair, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "step_time_s": 0.1}\n')
    p = _cli("compare", run, pair[0])
    assert p.returncode == 2 and "beside profiles" in p.stderr and "Traceback" not in p.stderr
    p = _cli("compare", pair[0], pair[1], pair[0])
    assert p.returncode == 2 and "two profiles" in p.stderr


@pytest.mark.parametrize("cause, gone", [("allocator", "allocator_churn"), ("dataloader", "data_bound"),
                                         ("pageable_copies", "pageable_copies"), ("fp32_gemm", "fp32_on_tensor_cores")])
def test_a_generated_pair_gives_the_known_speedup_and_names_the_removed_cause(tmp_path, cause, gone):
    """Nsight exports of one simulated job with and without one cause (trainperf.tracegen.nsys.make_pair): the
    speed-up within 2% of the simulation's steady-state one, and the cause's finding gone."""
    from trainperf.tracegen.nsys import make_pair

    pair = make_pair(tmp_path, cause)
    r = compare_profiles(pair["before"]["path"], pair["after"]["path"])
    assert r["comparable"] and r["speedup"] == pytest.approx(pair["speedup"], rel=0.02)
    assert gone in [f["id"] for f in r["findings_gone"]]
    if cause in ("allocator", "dataloader"):  # a host cause: the critical path no longer waits on it
        assert cause in r["removed_causes"]

"""The interval whose width follows what the step is made of (trainperf.planner.composition; figures in
docs/benchmarks/planner.md): the step's composition, the REML fit of the per-term uncertainties on held-out
errors, the shipped interval and what `plan` prints of it."""

from __future__ import annotations

import json
import math
import random

import pytest

from trainperf.cli import main
from trainperf.planner import devset
from trainperf.planner.composition import TERMS, TermSpread, fit, shares
from trainperf.planner.cost import COMPOSITION


@pytest.fixture(scope="module")
def estimates():
    return [(r, devset.predict(r)) for r in devset.load()]


def test_the_composition_of_every_development_step_adds_up_to_it(estimates):
    # every part of the step is in exactly one composition key, and the compute split adds up to the time's compute
    for row, est in estimates:
        comp = est.composition
        assert tuple(comp) == COMPOSITION
        assert sum(comp.values()) == pytest.approx(est.step_time_s, rel=1e-9), row.label
        assert all(v >= -1e-12 for v in comp.values()), (row.label, comp)
        compute = comp["gemm"] + comp["gemm_shape"] + comp["attention"] + comp["elementwise"] + comp["recompute"]
        head_tp = comp["tp_comm"] - est.time["tp_comm"]  # the vocabulary-parallel heads' all-reduces
        assert compute + head_tp == pytest.approx(est.time["compute"], rel=1e-9), row.label
        assert sum(shares(est).values()) == pytest.approx(1.0)


def test_small_gemms_lose_more_to_their_shape_than_large_ones(estimates):
    # wave quantization, the memory roofline and launches weigh on a 125M model's GEMMs, not on a 1T model's
    def shape_share(label_part, source):
        row, est = next((r, e) for r, e in estimates if r.source == source and label_part in r.label)
        return est.composition["gemm_shape"] / (est.composition["gemm"] + est.composition["gemm_shape"])

    assert shape_share("125m s2048 8g", "mpt-a100-80gb") > 2 * shape_share("1T", "korthikanti")


def _synthetic(tau, s, n_sources=12, rows=20, seed=0):
    """Held-out log ratios drawn from the interval's own model: a level per source, per-row deviations with the sd of
    the row's composition."""
    rng = random.Random(seed)
    res, sh = {}, {}
    for i in range(n_sources):
        level = rng.gauss(0.0, tau)
        res[f"s{i}"], sh[f"s{i}"] = [], []
        for _ in range(rows):
            w = [rng.random() ** 2 for _ in TERMS]
            x = {k: v / sum(w) for k, v in zip(TERMS, w)}
            sd = math.sqrt(sum((s[k] * x[k]) ** 2 for k in TERMS))
            res[f"s{i}"].append(0.01 + level + rng.gauss(0.0, sd))
            sh[f"s{i}"].append(x)
    return res, sh


def test_reml_recovers_the_uncertainty_of_each_term_and_the_sources_levels():
    truth = {"compute": 0.03, "memory": 0.12, "attention": 0.06, "communication": 0.25}
    res, sh = _synthetic(0.04, truth)
    sp = fit(res, sh)
    for k, v in truth.items():
        assert sp.term_sd[k] == pytest.approx(v, rel=0.35), (k, sp.term_sd)
    assert sp.between_sd == pytest.approx(0.04, rel=0.5)
    assert sp.center == pytest.approx(0.01, abs=0.03)
    # the percentiles of the studentized deviations are near a normal's (the data are normal here)
    assert sp.q_low == pytest.approx(-1.28, abs=0.25) and sp.q_high == pytest.approx(1.28, abs=0.25)
    # about 80% of fresh rows of fresh sources fall inside
    fresh, fsh = _synthetic(0.04, truth, seed=1)
    inside = [sp.log_bounds(x)[0] <= r <= sp.log_bounds(x)[1]
              for s in fresh for r, x in zip(fresh[s], fsh[s])]
    assert 0.72 <= sum(inside) / len(inside) <= 0.88


def test_a_term_no_row_exercises_gets_the_common_uncertainty_not_zero():
    # held out, the sources that run bubbles are gone: their term must not look certain (the prior on log s_k)
    truth = {"compute": 0.05, "memory": 0.08, "attention": 0.06, "communication": 0.0}
    res, sh = _synthetic(0.03, truth, seed=2)
    for s in sh:
        sh[s] = [{**x, "compute": x["compute"] + x["communication"], "communication": 0.0} for x in sh[s]]
    sp = fit(res, sh)
    others = [sp.term_sd[k] for k in ("compute", "memory", "attention")]
    assert min(others) * 0.5 < sp.term_sd["communication"] < max(others) * 2


def test_the_interval_widens_with_the_share_of_the_less_certain_term_and_far_from_the_development_set():
    sp = TermSpread(0.0, 0.0001, 0.03, {"compute": 0.03, "memory": 0.1, "attention": 0.06, "communication": 0.2},
                    -1.2, 1.3)
    gemm = {"compute": 1.0, "memory": 0.0, "attention": 0.0, "communication": 0.0}
    comm_heavy = {"compute": 0.5, "memory": 0.0, "attention": 0.0, "communication": 0.5}
    assert sp.relative_width(comm_heavy) > 1.5 * sp.relative_width(gemm)
    assert sp.relative_width(gemm, far=2) > sp.relative_width(gemm, far=1) > sp.relative_width(gemm)
    lo, hi = sp.log_bounds(gemm)
    assert lo == pytest.approx(-1.2 * math.sqrt(0.03 ** 2 + 0.0001 + 0.03 ** 2))
    assert hi == pytest.approx(1.3 * math.sqrt(0.03 ** 2 + 0.0001 + 0.03 ** 2))


def test_plan_prints_the_interval_and_what_it_is_made_of_and_json_has_every_figure(capsys):
    argv = ["plan", "--model", "gpt3-13b", "--gpus", "64", "--gpu", "h100-sxm", "--top", "2"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    made = out["best"]["interval_made_of"]
    assert made["largest_term"] in TERMS and set(made["shares"]) == set(TERMS)
    assert sum(made["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert made["largest_share"] == max(made["shares"].values())
    assert sum(made["variance_shares"].values()) == pytest.approx(1.0, abs=2e-3)
    assert set(out["interval"]["term_sd"]) == set(TERMS) and out["interval"]["kind"] == "composition"
    assert sum(out["best"]["composition_s"].values()) == pytest.approx(out["best"]["step_time_s"], rel=1e-3)
    assert main(argv) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("interval:"))
    assert f"{100 * made['relative_width']:.0f}% wide" in line
    assert f"the step is {100 * made['largest_share']:.0f}% {made['largest_term']}" in line
    for k, v in out["interval"]["term_sd"].items():
        assert f"{k} {100 * v:.1f}%" in text

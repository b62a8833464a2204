"""The late rank as a finding: on jobs generated from a real A100 rank with one rank made late by a known cause,
``trainperf diagnose DIR`` names the late rank, its cause (with that cause's fix) and the wait it costs the job;
with some ranks missing, communication is not given a gain as if it were all transfer."""

from __future__ import annotations

import json

import pytest

from tests.unit.trace_fixtures import real_trace
from trainperf.diagnosis.engine import apply_rules, diagnose_path
from trainperf.diagnosis.evidence import CommWait, Evidence
from trainperf.diagnosis.rules import RULES
from trainperf.tracegen.ranks import make_job

A100 = real_trace("hta-data/tests/data/nccl_parser_config/nccl_data.json.gz")


@pytest.mark.parametrize("cause, fix_words", [("allocator", "empty_cache"), ("dataloader", "num_workers")])
def test_the_late_rank_its_cause_and_the_wait_it_costs_are_named(tmp_path, cause, fix_words):
    truth = make_job(A100, tmp_path / "job", world=4, late=2, cause=cause, late_us=8000,
                     clock_offsets_us={1: 150.0, 2: -300.0, 3: 40.0})
    r = diagnose_path(tmp_path / "job")
    late = [f for f in r["findings"] if f["id"] == "late_rank"]
    assert late, [f["id"] for f in r["findings"]]
    f = late[0]
    assert f["rank"] == truth["late_rank"] == 2 and f["late_cause"] == cause
    assert f["wait_us_per_step"] == pytest.approx(truth["job"]["delay_us_per_step"], rel=0.05)
    assert "rank 2" in f["evidence"] and fix_words in f["fix"] and f["fix"].startswith("on rank 2:")
    assert f["gain"]["before"] > f["gain"]["after"]
    json.dumps(r["findings"], allow_nan=False)


def test_the_late_rank_is_not_measured_from_one_rank():
    ev = Evidence(step_s=0.1, trace_ranks={"count": 1})
    late_rule = [x for x in RULES if x.id == "late_rank"]
    findings, nm = apply_rules(ev, late_rule)
    assert not findings and "two or more ranks" in nm[0]["reason"]


def test_communication_with_ranks_missing_gets_no_gain_as_if_it_were_transfer():
    comm_rule = [x for x in RULES if x.id == "comm_bound"]
    ev = Evidence(step_s=0.1, step_time_s=0.1, fixes="code", comm=CommWait(fraction=0.4, mean_s=0.04))
    whole, _ = apply_rules(ev, comm_rule)
    assert whole[0]["gain"] is not None
    ev.comm.includes_absent = True
    part, _ = apply_rules(ev, comm_rule)
    assert part[0]["gain"] is None and "includes waiting for ranks not in these traces" in part[0]["evidence"]

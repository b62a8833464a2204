"""The diagnosis package's shape: one evidence model, one rule table whose rules read fields (never where the
evidence came from), one findings renderer for HTML, the moved names still reachable from monitor/ (deprecated),
and no file over 600 lines."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

from trainperf.diagnosis.engine import apply_rules
from trainperf.diagnosis.evidence import FIELD_NAMES, Evidence
from trainperf.diagnosis.rules import RULES, Rule

PKG = Path(__file__).resolve().parents[2] / "trainperf" / "diagnosis"


def test_no_file_of_the_package_is_over_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PKG.glob("*.py")}
    assert max(sizes.values()) <= 600, sizes


def test_no_rule_reads_where_its_evidence_came_from():
    """The checks take an Evidence and read its fields: nothing in the table or the checks reads a `source`."""
    for p in sorted(PKG.glob("rules*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            assert not (isinstance(node, ast.Attribute) and node.attr == "source"), f"{p.name}:{node.lineno}"
            assert not (isinstance(node, ast.Constant) and node.value == "source"), f"{p.name}:{node.lineno}"
    assert "source" not in Evidence.__dataclass_fields__


def test_every_rule_is_one_entry_whose_needs_are_evidence_fields():
    assert len({r.id for r in RULES}) == len(RULES)
    for r in RULES:
        assert set(r.needs) <= FIELD_NAMES, r.id
    with pytest.raises(ValueError, match="unknown Evidence field"):
        Rule("x", "s", "c", "cause", "fix", lambda ev: None, needs=("no_such_field",))


def test_a_missing_field_makes_the_rule_not_measured_with_the_readers_reason():
    ev = Evidence(step_s=1.0, step_time_s=1.0)
    ev.lacks("loss", "this reader keeps no losses")
    ran = []
    probe = Rule("probe", "s", "c", "cause", "fix", lambda e: ran.append(e) or None, needs=("loss",))
    findings, not_measured = apply_rules(ev, [probe])
    assert findings == [] and not ran
    assert not_measured == [{"id": "probe", "reason": "this reader keeps no losses"}]
    with pytest.raises(KeyError):
        ev.lacks("nope", "why")


def test_a_new_rule_fires_from_the_fields_alone():
    """The docs' example (docs/development.md): one entry, fed by any reader that fills its fields."""
    def fat_step(ev):
        if ev.step_s and ev.step_s > 2.0:
            return {"severity": "info", "evidence": f"step {ev.step_s:.1f} s{ev.where()}"}
        return None

    rule = Rule("slow_step", "steps are long", "step > 2 s", "big batches", "smaller batches", fat_step,
                needs=("step_s",))
    findings, _ = apply_rules(Evidence(step_s=3.0, rank=1, world=2), [rule])
    assert findings[0]["evidence"] == "step 3.0 s on rank 1" and findings[0]["fix"] == "smaller batches"


def test_the_findings_table_is_written_once():
    holders = [p.name for p in PKG.glob("*.py") if "<th>likely cause</th>" in p.read_text()]
    assert holders == ["page.py"], holders


@pytest.mark.parametrize("old, name, new", [
    ("trainperf.monitor.diagnose", "diagnose", "trainperf.diagnosis.engine"),
    ("trainperf.monitor.diagnose", "format_findings", "trainperf.diagnosis.text"),
    ("trainperf.monitor.engine", "diagnose_path", "trainperf.diagnosis.engine"),
    ("trainperf.monitor.report", "build_report", "trainperf.diagnosis.report"),
    ("trainperf.monitor.compare", "compare_runs", "trainperf.diagnosis.compare"),
    ("trainperf.monitor.trace_text", "format_traces", "trainperf.diagnosis.text"),
    ("trainperf.monitor.xla", "recompile_finding", "trainperf.diagnosis.rules_xla"),
    ("trainperf.monitor", "compare_runs", "trainperf.diagnosis.compare"),
])
def test_moved_names_still_work_from_the_old_path_with_a_deprecation_warning(old, name, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = getattr(importlib.import_module(old), name)
    assert got is getattr(importlib.import_module(new), name)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_monitor_keeps_only_what_runs_inside_training():
    """monitor/ imports nothing of the diagnosis (its moved modules are forwarding stubs)."""
    for p in (PKG.parent / "monitor").glob("*.py"):
        text = p.read_text()
        if "moved_names" in text:
            continue
        assert "trainperf.diagnosis" not in text, p.name

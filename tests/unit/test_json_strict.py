"""Every ``--json`` output is strict JSON (null, never NaN/Infinity), checked with a parser that refuses
the non-standard constants; every subcommand with a --json flag is either run here or checked to print
through the one strict printer."""

from __future__ import annotations

import argparse
import ast
import json
import math

import pytest

from tests.conftest import ROOT
from trainperf.cli import build_parser, main


def strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def json_commands() -> list[tuple[str, ...]]:
    found = []

    def walk(p, prefix):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, prefix + (name,))
        if any("--json" in a.option_strings for a in p._actions):
            found.append(prefix)

    walk(build_parser(), ())
    return found


def test_dumps_strict_and_write_json(tmp_path):
    import numpy as np

    from trainperf.runio import dumps_strict, read_json, write_json

    obj = {"a": math.nan, "b": [math.inf, -math.inf, np.float32("nan"), np.int64(3)], "c": (1.5, None)}
    assert strict_loads(dumps_strict(obj)) == {"a": None, "b": [None, None, None, 3], "c": [1.5, None]}
    p = write_json(tmp_path / "s.json", obj)
    assert read_json(p) == {"a": None, "b": [None, None, None, 3], "c": [1.5, None]}
    assert not list(tmp_path.glob(".s.json.tmp*"))  # atomic: no temporary left


def test_print_json_turns_nan_into_null(capsys):
    from trainperf.cli._common import print_json

    print_json({"final_loss": math.nan, "tokens_per_s": math.inf})
    assert strict_loads(capsys.readouterr().out) == {"final_loss": None, "tokens_per_s": None}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus):
    from tests.conftest import TINY

    d = tmp_path_factory.mktemp("strict") / "run"
    sets = sum((["--set", o] for o in TINY + [f"data.path={corpus}", "data.prepare_from=null", f"run.dir={d}",
                                             "run.steps=3"]), [])
    return d, sets


RUN_HERE = {("doctor",), ("config", "show"), ("data", "prepare"), ("data", "export"), ("data", "inspect"),
            ("train",), ("memory",), ("plan",), ("diagnose",), ("report",), ("compare",)}


def test_every_json_command_prints_strict_json(run_dir, corpus, tmp_path, capsys):
    d, sets = run_dir
    cfg = str(ROOT / "configs/gpt-tiny.yaml")
    argvs = {
        ("doctor",): ["doctor", "--json"],
        ("config", "show"): ["config", "show", cfg, "--json"],
        ("data", "prepare"): ["data", "prepare", "--out", str(tmp_path / "prep"), "--max-bytes", "20000", "--json"],
        ("data", "export"): ["data", "export", "--src", corpus, "--out", str(tmp_path / "exp"), "--seq-len", "16",
                             "--max-samples", "4", "--json"],
        ("data", "inspect"): ["data", "inspect", corpus, "--json"],
        ("train",): ["train", cfg, *sets, "--resume", "never", "--json"],
        ("memory",): ["memory", cfg, *sets, "--json"],
        ("plan",): ["plan", "--model", "gpt2-124m", "--gpus", "8", "--json"],
        ("diagnose",): ["diagnose", str(d), "--json"],
        ("report",): ["report", str(d), "--out", str(tmp_path / "r.html"), "--json"],
        ("compare",): ["compare", str(d), str(d), "--json"],
    }
    assert set(argvs) == RUN_HERE
    for key, argv in argvs.items():
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"{' '.join(key)}: exit {rc}: {err[-500:]}"
        strict_loads(out)  # raises on NaN/Infinity or any non-JSON text on stdout


def test_json_commands_not_run_here_print_through_the_strict_printer():
    """The bench kinds and tune take minutes: check that their --json output goes through print_json
    (strict) and that no module writes JSON to stdout another way."""
    commands = set(json_commands())
    rest = commands - RUN_HERE
    assert rest <= {("bench", k) for k in ("step", "data", "balance", "comm", "traces")} | {("tune",)}, rest
    for key in rest:
        kind = key[-1]
        name = f"bench_{kind}.py" if key[0] == "bench" else f"{kind}.py"  # printing lives in cli/
        src = (ROOT / "trainperf/cli" / name).read_text()
        tree = ast.parse(src)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        names = {getattr(c.func, "id", None) or getattr(c.func, "attr", None) for c in calls}
        assert "print_json" in names, f"bench {kind}: --json not printed by print_json"
        for c in calls:  # json.dump(obj, sys.stdout) or print(json.dumps(...)) would bypass it
            if getattr(c.func, "attr", None) == "dump" and any("stdout" in ast.unparse(a) for a in c.args):
                pytest.fail(f"bench {kind}: json.dump to stdout")
            if getattr(c.func, "id", None) == "print" and "json.dumps" in ast.unparse(c):
                pytest.fail(f"bench {kind}: print(json.dumps(...))")


def test_diagnose_report_and_bench_traces_of_profiler_traces_print_strict_json(tmp_path, capsys):
    """The trace path of diagnose and report (a generated trace), and bench traces (the HTA peer skipped when
    absent: TRAINPERF_HTA_PYTHON unset and no hta here, or found and run)."""
    from tests.unit.trace_factory import base_rank

    t = base_rank(tmp_path / "rank0.pt.trace.json.gz", steps=2)
    for argv in (["diagnose", str(t), "--json"], ["report", str(t), "--json"], ["bench", "traces", str(t), "--json"]):
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"{argv}: exit {rc}: {err[-500:]}"
        obj = strict_loads(out)
        if argv[0] == "bench":
            assert obj["trainperf"]["wall_s"] > 0 and (obj["hta"] is not None or obj["notes"])

"""Files that are not Nsight Systems exports, damaged exports and reports without nsys: a UserError naming the
file, what was expected and what to do (exit 2 on the CLI), never a traceback."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainperf.errors import UserError
from trainperf.trace.nsys import analyze_capture, export_report, is_nsys_export
from trainperf.tracegen.nsys import make_export
from trainperf.tracegen.nsys_job import Job

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("good") / "job.sqlite"
    make_export(p, Job(steps=2))
    return p


def test_not_sqlite_empty_missing_and_directories(tmp_path):
    txt = tmp_path / "trace.sqlite"
    txt.write_text('{"traceEvents": []}')
    with pytest.raises(UserError, match=r"trace\.sqlite: not an Nsight Systems export: not an SQLite database"):
        analyze_capture(txt)
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.sqlite: .*an empty file"):
        analyze_capture(empty)
    with pytest.raises(UserError, match=r"nope\.sqlite: no such file"):
        analyze_capture(tmp_path / "nope.sqlite")
    d = tmp_path / "nothing"
    d.mkdir()
    with pytest.raises(UserError, match=r"nothing: no Nsight Systems export"):
        analyze_capture(d)
    assert not is_nsys_export(txt) and not is_nsys_export(empty) and not is_nsys_export(d)


def _plain_sqlite(p: Path, table: str) -> Path:
    db = sqlite3.connect(p)
    db.execute(f"CREATE TABLE {table} (id INTEGER)")
    db.commit()
    db.close()
    return p


def test_sqlite_without_nsys_tables_lists_what_it_has(tmp_path):
    p = _plain_sqlite(tmp_path / "other.sqlite", "users")
    with pytest.raises(UserError, match=r"other\.sqlite: an SQLite database but not an Nsight Systems export.*it has: "
                                        r"users.*nsys export --type=sqlite"):
        analyze_capture(p)
    assert not is_nsys_export(p)


def test_a_truncated_export_is_named(tmp_path, good):
    bad = tmp_path / "cut.sqlite"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"cut\.sqlite: .*(corrupt|cannot be read)"):
        analyze_capture(bad)


def test_a_report_without_nsys_prints_the_command(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not read")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(UserError) as e:
        analyze_capture(rep)
    assert "nsys is not on PATH" in str(e.value)
    assert f"nsys export --type=sqlite --output={tmp_path / 'run.sqlite'} {rep}" in str(e.value)


def _fake_nsys(tmp_path: Path, source: Path, rc: int = 0) -> Path:
    """An `nsys` that copies a ready export to --output=..., and logs each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    script.write_text(f"""#!{sys.executable}
import shutil, sys
open({str(tmp_path / 'calls.log')!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
if {rc}:
    sys.stderr.write("cannot open report\\n"); sys.exit({rc})
out = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--output="))
shutil.copyfile({str(source)!r}, out)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_a_report_is_exported_once_and_reused(tmp_path, monkeypatch, good):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"report")
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path, good)))
    out = export_report(rep)
    assert out == tmp_path / "run.sqlite" and is_nsys_export(out)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("export --type=sqlite --force-overwrite=true --output=")
    assert analyze_capture(rep)[0]["steps"] == 2  # the fresh export is reused: nsys not run again
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1
    os.utime(rep, (out.stat().st_mtime + 10, out.stat().st_mtime + 10))  # a newer report: exported again
    export_report(rep)
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 2
    assert not list(tmp_path.glob(".*.tmp.sqlite"))


def test_a_failing_export_says_so(tmp_path, monkeypatch, good):
    rep = tmp_path / "bad.nsys-rep"
    rep.write_bytes(b"report")
    monkeypatch.setenv("PATH", str(_fake_nsys(tmp_path, good, rc=3)))
    with pytest.raises(UserError, match=r"bad\.nsys-rep: `nsys export` failed \(exit 3\): cannot open report"):
        export_report(rep)
    assert not (tmp_path / "bad.sqlite").exists()


def test_bench_generates_an_export_and_never_replaces_another_file(tmp_path):
    p = _plain_sqlite(tmp_path / "x.sqlite", "t")
    out = subprocess.run([sys.executable, "-m", "trainperf", "bench", "traces", str(tmp_path / "y.sqlite"),
                          "--generate-nsys-mb", "1"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-1500:]
    again = subprocess.run([sys.executable, "-m", "trainperf", "bench", "traces", str(p), "--generate-nsys-mb", "1"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "is not an Nsight Systems export; it is never replaced" in again.stderr + again.stdout

"""``trainperf report``: a self-contained HTML file (inline SVG charts, no plotting library) whose
charts render in a real browser. Under CI (CI=true) the browser test fails when Chromium is missing
or the page does not render; it keeps screenshots under test-artifacts/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY
from trainperf.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "test-artifacts"
SVG_NS = "{http://www.w3.org/2000/svg}"
RUN_CHARTS = {"loss", "throughput", "phases", "utilization", "ranks", "memory"}


def tiny_run(d: Path, *overrides: str) -> Path:
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.train.build import build_trainer
    from trainperf.train.run import fit

    cfg = load_config(None, TINY + ["data.source=synthetic", "checkpoint.at_end=false", "run.steps=6",
                                    "run.eval_every=3", "monitor.sample_every_s=0.05", f"run.dir={d}", *overrides])
    fit(build_trainer(resolve(cfg, world_size=1), verbose=False), resume="never", verbose=False)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("report") / "run")


def inline_svgs(html: str) -> dict[str, str]:
    return dict(re.findall(r'<figure data-chart="(\w+)">(<svg .*?</svg>)', html, flags=re.S))


def test_report_is_one_self_contained_html_with_svg_charts(run_dir, capsys):
    assert main(["report", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    html = Path(out["html"]).read_text()
    assert Path(out["html"]) == run_dir / "report.html"
    assert {Path(c).stem for c in out["charts"]} == RUN_CHARTS, out["skipped"]
    svgs = inline_svgs(html)
    assert set(svgs) == RUN_CHARTS
    for name, svg in svgs.items():  # each inline chart is the file written beside it, and well-formed SVG
        assert svg == (run_dir / "report" / f"{name}.svg").read_text()
        root = ET.fromstring(svg)
        drawn = [e for e in root.iter() if e.tag in (f"{SVG_NS}polyline", f"{SVG_NS}polygon", f"{SVG_NS}rect")]
        assert len(drawn) >= 2, name  # the frame and at least one data mark
    evals = [x for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "val_loss" in x]
    assert evals and len(ET.fromstring(svgs["loss"]).findall(f"{SVG_NS}circle")) == len(evals)  # a marker each
    # nothing is fetched from elsewhere: no http(s) links, no scripts, no <img>
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html) and "<script" not in html and "<img" not in html
    assert "MFU" in html and "measured: best of" in html  # the figure says its peak
    assert "Not measured" in html and "NVML" in html


def test_report_works_without_matplotlib(run_dir, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after a plain `pip install trainperf`
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert len(inline_svgs(out.read_text())) == 6


def test_report_of_a_crashed_run(tmp_path):
    d = tmp_path / "crashed"
    d.mkdir()
    recs = [{"step": i, "loss": 3.0 - 0.1 * i, "step_time_s": 0.1, "tokens_per_s": 1000.0,
             "phases_s": {"data": 0.01, "forward": 0.04, "backward": 0.05}} for i in range(1, 6)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 6, "lo')
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    assert "did not finish" in html and len(inline_svgs(html)) == 4  # no samples: no utilization/memory chart
    assert "chart &#x27;utilization&#x27;: no data" in html


def test_report_compares_ranks_and_books_compile_apart(tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    for rank, slow in ((0, 0.0), (1, 0.05)):
        recs = [{"step": i, "loss": 2.0, "step_time_s": 0.1, "tokens_per_s": 1000.0,
                 "phases_s": {"data": 0.01, "forward": 0.03 + slow, "backward": 0.05, "comm": 0.05 - slow}}
                for i in range(1, 8)]
        recs[0]["phases_s"]["compile"] = 30.0
        (d / ("metrics.jsonl" if rank == 0 else "metrics.rank1.jsonl")).write_text(
            "".join(json.dumps(r) + "\n" for r in recs))
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    assert "ranks" in inline_svgs(html) and "straggler" in html and "comm_bound" in html
    assert "30.0 s (phase &#x27;compile&#x27;: not in the steady-state fractions)" in html
    assert "compile 30.0 s not drawn" in html  # the per-step chart keeps its scale


def _render(page: Path, screenshot: Path) -> tuple[list[dict], str]:
    """Load ``page`` in headless Chromium with a probe that rasterizes every chart onto a canvas and
    counts its inked and coloured pixels; also save a full-page screenshot."""
    probe = (ROOT / "tests" / "unit" / "render_probe.js").read_text()
    probed = page.with_name(page.stem + ".probe.html")
    probed.write_text(page.read_text().replace("</body>", f"<script>{probe}</script></body>"))
    profile = tempfile.mkdtemp(prefix="chromium-")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={profile}", "--hide-scrollbars"]
    try:
        p = subprocess.run(flags + ["--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
                           capture_output=True, text=True, timeout=120)
        subprocess.run(flags + ["--window-size=1500,2600", f"--screenshot={screenshot}", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'id="render-check">([^<]*)<', p.stdout)
    assert m, (p.stdout[-500:], p.stderr[-1500:])
    return json.loads(m.group(1).replace("&quot;", '"')), p.stderr


@pytest.mark.slow
def test_charts_render_in_headless_chromium(run_dir, tmp_path):
    if CHROMIUM is None:
        msg = "needs the chromium browser (Debian package chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: " + msg)
        pytest.skip(msg)
    other = tiny_run(tmp_path / "other", "train.global_batch=4")
    assert main(["report", str(run_dir)]) == 0
    assert main(["report", str(run_dir), str(other), "--out", str(tmp_path / "compare.html")]) == 0
    ARTIFACTS.mkdir(exist_ok=True)
    for page, shot, names in ((run_dir / "report.html", "report.png", RUN_CHARTS),
                              (tmp_path / "compare.html", "compare.png",
                               {"loss_by_step", "loss_by_tokens", "throughput", "phases", "peak_memory"})):
        screenshot = ARTIFACTS / shot
        screenshot.unlink(missing_ok=True)
        charts, err = _render(page, screenshot)
        assert {c["name"] for c in charts} == names, (charts, err[-1000:])
        for c in charts:  # laid out at its size, and drawn: coloured data marks, not only the grey frame
            assert c["w"] > 600 and c["h"] > 280 and c["colored"] >= 100, c
        png = screenshot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1500, shot


@pytest.mark.slow
def test_trace_report_charts_render_in_headless_chromium(tmp_path):
    """The report of a directory of profiler traces (generated ranks, one a straggler): its charts render."""
    if CHROMIUM is None:
        msg = "needs the chromium browser (Debian package chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: " + msg)
        pytest.skip(msg)
    from tests.unit.trace_factory import base_rank
    from trainperf.tracegen import ranks as tracegen_ranks

    tracegen_ranks.multi_rank(base_rank(tmp_path / "base.json.gz"), tmp_path / "ranks", world=4, straggler=2,
                              slowdown=1.3)
    page = tmp_path / "ranks" / "trace_report.html"
    assert main(["report", str(tmp_path / "ranks")]) == 0
    html = page.read_text()
    assert "straggler" in html and "gain (upper bound)" in html and "Not measured" in html
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "trace_report.png"
    screenshot.unlink(missing_ok=True)
    charts, err = _render(page, screenshot)
    names = {"trace_step", "trace_breakdown", "trace_temporal", "trace_ranks"}
    assert {c["name"] for c in charts} == names, (charts, err[-1000:])
    for c in charts:
        assert c["w"] > 600 and c["h"] > 280 and c["colored"] >= 100, c
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1500


@pytest.mark.slow
def test_late_rank_and_profile_comparison_pages_render_in_headless_chromium(tmp_path):
    """A job with a late rank (its wait matrix and the step charged to causes) and the comparison of two profiles:
    both pages render their charts in a real browser."""
    if CHROMIUM is None:
        msg = "needs the chromium browser (Debian package chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: " + msg)
        pytest.skip(msg)
    from tests.unit.trace_fixtures import real_trace
    from trainperf.tracegen.nsys import make_pair
    from trainperf.tracegen.ranks import make_job

    make_job(real_trace("hta-data/tests/data/nccl_parser_config/nccl_data.json.gz"), tmp_path / "job", world=4, late=1,
             cause="allocator", late_us=8000)
    assert main(["report", str(tmp_path / "job")]) == 0
    page = tmp_path / "job" / "trace_report.html"
    html = page.read_text()
    assert "Who waits for whom" in html and "Where the step went" in html and "late_rank" in html
    charts, err = _render(page, tmp_path / "job.png")
    assert "trace_step" in {c["name"] for c in charts}, (charts, err[-1000:])
    pair = make_pair(tmp_path / "pair", "allocator")
    out = tmp_path / "cmp.html"
    assert main(["report", pair["before"]["path"], pair["after"]["path"], "--out", str(out)]) == 0
    charts, err = _render(out, tmp_path / "cmp.png")
    assert {c["name"] for c in charts} == {"profiles_breakdown", "profiles_steps"}, (charts, err[-1000:])
    for c in charts:
        assert c["w"] > 600 and c["h"] > 280 and c["colored"] >= 100, c

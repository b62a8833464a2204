"""``trainperf report``: a self-contained HTML file whose charts render in a real browser."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
matplotlib = pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install trainperf[plot])")

from tests.conftest import TINY
from trainperf.cli import main

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from trainperf.config import load_config
    from trainperf.config.resolve import resolve
    from trainperf.train.build import build_trainer
    from trainperf.train.run import fit

    d = tmp_path_factory.mktemp("report") / "run"
    cfg = load_config(None, TINY + ["data.source=synthetic", "checkpoint.at_end=false", "run.steps=6",
                                    "run.eval_every=3", "monitor.sample_every_s=0.05", f"run.dir={d}"])
    fit(build_trainer(resolve(cfg, world_size=1), verbose=False), resume="never", verbose=False)
    return d


def test_report_is_one_self_contained_html_with_png_charts(run_dir, capsys):
    assert main(["report", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    html = Path(out["html"]).read_text()
    assert Path(out["html"]) == run_dir / "report.html"
    names = {Path(c).stem for c in out["charts"]}
    assert names == {"loss", "throughput", "phases", "utilization", "ranks", "memory"}, out["skipped"]
    imgs = re.findall(r'<img alt="(\w+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(imgs) == 6
    for name, b64 in imgs:  # each embedded image is the PNG written beside it
        data = base64.b64decode(b64)
        assert data.startswith(PNG_MAGIC) and data == (run_dir / "report" / f"{name}.png").read_bytes()
    # nothing is fetched from elsewhere: no http(s) links, no external scripts or stylesheets
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html) and "<script" not in html
    assert "MFU" in html and "measured: best of" in html  # the figure says its peak
    assert "Not measured" in html and "NVML" in html


def test_report_of_a_crashed_run(tmp_path):
    d = tmp_path / "crashed"
    d.mkdir()
    recs = [{"step": i, "loss": 3.0 - 0.1 * i, "step_time_s": 0.1, "tokens_per_s": 1000.0,
             "phases_s": {"data": 0.01, "forward": 0.04, "backward": 0.05}} for i in range(1, 6)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 6, "lo')
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    assert "did not finish" in html and html.count("<img ") == 4  # no samples: no utilization/memory chart
    assert "chart &#x27;utilization&#x27;: no data" in html or "chart 'utilization': no data" in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs the chromium browser (Debian package chromium)")
def test_charts_render_in_headless_chromium(run_dir, tmp_path):
    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    # A copy with a probe: after load, write how many images decoded into the DOM.
    probe = ('<script>window.addEventListener("load",function(){var im=document.images,ok=0;'
             'for(var i=0;i<im.length;i++){if(im[i].complete&&im[i].naturalWidth>0)ok++;}'
             'var d=document.createElement("div");d.id="render-check";'
             'd.textContent="images="+im.length+" rendered="+ok;document.body.appendChild(d);});</script>')
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", probe + "</body>"))
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync", "--no-first-run",
                            f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                           capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'id="render-check">images=(\d+) rendered=(\d+)<', p.stdout)
    assert m, (p.stdout[-500:], p.stderr[-1500:])
    assert m.group(1) == m.group(2) == "6"


def test_report_compares_ranks(tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    for rank, slow in ((0, 0.0), (1, 0.05)):
        recs = [{"step": i, "loss": 2.0, "step_time_s": 0.1, "tokens_per_s": 1000.0,
                 "phases_s": {"data": 0.01, "forward": 0.03 + slow, "backward": 0.05, "comm": 0.05 - slow}}
                for i in range(1, 8)]
        name = "metrics.jsonl" if rank == 0 else "metrics.rank1.jsonl"
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["report", str(d)]) == 0
    html = (d / "report.html").read_text()
    assert '<img alt="ranks"' in html and "straggler" in html and "comm_bound" in html


def test_report_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch, capsys):
    import sys

    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "step_time_s": 0.1}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(d)]) == 2
    assert "pip install 'trainperf[plot]'" in capsys.readouterr().err

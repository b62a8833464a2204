"""run.device=xla without a usable torch_xla: one clear message naming the versions, exit code 2.

These run in the main environment (no torch_xla). A fake ``torch-xla`` distribution on
PYTHONPATH stands in for a mismatched or broken install."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_cli
from trainperf.config import load_config
from trainperf.train.resolve import DeviceFacts, resolve
from trainperf.errors import ConfigError
from trainperf.xla import env

CONFIG = str(ROOT / "configs" / "gpt-tiny.yaml")
PAIR = f"torch=={env.RECOMMENDED[0]} torch-xla=={env.RECOMMENDED[1]}"


def _fake_dist(tmp_path: Path, version: str, *, importable: bool) -> str:
    """A ``torch-xla`` distribution of ``version`` on a PYTHONPATH entry (its package fails to import
    unless ``importable``)."""
    site = tmp_path / "site"
    info = site / f"torch_xla-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-xla\nVersion: {version}\n")
    pkg = site / "torch_xla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("" if importable else
                                     "raise ImportError('_XLAC.so: undefined symbol: _ZN5torch8autograd')\n")
    return str(site)


def _cli_env(site: str | None) -> dict:
    path = str(ROOT) + (f":{site}" if site else "")
    return {"PYTHONPATH": path}


def test_absent_torch_xla_names_versions_and_exits_2():
    try:
        import torch_xla  # noqa: F401
        pytest.skip("torch_xla is installed here; this checks the environment without it")
    except ImportError:
        pass
    res = run_cli(["train", CONFIG, "--set", "run.device=xla", "--set", "run.steps=1"], timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr  # one message
    assert "torch_xla, which is not installed" in lines[0]
    assert f"torch {torch.__version__}" in lines[0]
    assert PAIR in lines[0]


def test_mismatched_torch_xla_names_both_versions_and_exits_2(tmp_path):
    site = _fake_dist(tmp_path, "2.9.0", importable=True)
    if env._minor(torch.__version__) == (2, 9):
        pytest.skip("this torch is 2.9: a 2.9.0 torch-xla would match")
    res = run_cli(["train", CONFIG, "--set", "run.device=xla", "--set", "run.steps=1"], env=_cli_env(site),
                  timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    msg = res.stderr.strip()
    assert len(msg.splitlines()) == 1
    assert "torch-xla 2.9.0 needs torch 2.9.x" in msg and f"torch {torch.__version__} is installed" in msg
    assert PAIR in msg


def test_broken_torch_xla_import_is_reported_not_raised(tmp_path):
    """Versions agree on paper but the package does not import (a broken or partial install)."""
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    site = _fake_dist(tmp_path, f"{major_minor}.0", importable=False)
    res = run_cli(["train", CONFIG, "--set", "run.device=xla", "--set", "run.steps=1"], env=_cli_env(site),
                  timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "does not import (ImportError: _XLAC.so: undefined symbol" in res.stderr
    assert PAIR in res.stderr


@pytest.mark.parametrize("torch_v,xla_v,ok", [
    ("2.9.1", "2.9.0", True), ("2.9.1+cu128", "2.9.0", True), ("2.8.0", "2.8.1", True),
    ("2.13.0", "2.9.0", False), ("2.9.1", "2.8.0", False), ("2.13.0", None, False),
])
def test_version_pairs(torch_v, xla_v, ok):
    problem = env.check_versions(torch_v, xla_v)
    assert (problem is None) == ok, problem
    if not ok:
        assert PAIR in problem and torch_v in problem


def test_resolve_raises_config_error_without_torch_xla(monkeypatch):
    monkeypatch.setattr(env, "installed_versions", lambda: ("2.13.0", None))
    cfg = load_config(CONFIG, ["run.device=xla"])
    with pytest.raises(ConfigError, match="torch-xla==2.9.0"):
        resolve(cfg, DeviceFacts(cpus=2))


def test_xla_backend_only_with_xla_device():
    cfg = load_config(CONFIG, ["run.device=cpu", "distributed.backend=xla"])
    with pytest.raises(ConfigError, match="needs run.device=xla"):
        resolve(cfg, DeviceFacts(cpus=2))

"""``trainperf train`` refuses a run whose memory estimate is above the memory it will have, before it
builds or writes anything (fuzzing: a 100,000-token context ran for minutes with no step on a 24 GB
host), and a run refused early leaves no empty run directory behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainperf.config import load_config
from trainperf.train.resolve import resolve
from trainperf.errors import ConfigError
from trainperf.memory import preflight

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9


def _cfg(*sets: str):
    """The config as train checks it: resolved (dtype auto -> the device's, degrees, global batch)."""
    return resolve(load_config(str(ROOT / "configs/gpt-tiny.yaml"), list(sets))).cfg


@pytest.fixture
def host_gb(monkeypatch):
    """Pretend the host has this many GB available (the check reads /proc/meminfo otherwise)."""
    def set_gb(gb: float, sharing: int = 1):
        monkeypatch.setattr(preflight, "_available", lambda device: (int(gb * GB), "test host", sharing))
    return set_gb


def test_the_default_config_fits_and_the_figures_come_back(host_gb):
    host_gb(24)
    pf = preflight.check(_cfg())
    assert pf is not None and pf.fits
    assert 0 < pf.estimate_bytes == pf.states_bytes + pf.activations_bytes < 24 * GB


def test_a_run_that_cannot_fit_is_refused_with_fixes_that_fit(host_gb):
    host_gb(24)
    cfg = _cfg("model.block_size=100000")
    with pytest.raises(ConfigError) as exc:
        preflight.check(cfg)
    msg = str(exc.value)
    assert "model.block_size=100000" in msg and "train.micro_batch=16" in msg and "24.00 GB" in msg
    need = float(re.search(r"needs about ([\d.]+) GB", msg).group(1))
    assert need > 24
    # the micro-batch it proposes fits, and one more does not
    mb = int(re.search(r"Fix: train\.micro_batch=(\d+)", msg).group(1))
    estimate, plan, _ = preflight.estimate_run(cfg)
    assert estimate(plan, mb).total <= 24 * GB < estimate(plan, mb + 1).total
    assert "memory.checkpointing.mode=full" in msg and "memory.preflight=false" in msg


def test_ranks_on_one_host_share_its_memory(host_gb):
    cfg = _cfg("model.block_size=4096")
    estimate, plan, _ = preflight.estimate_run(cfg)
    need = estimate(plan, cfg.train.micro_batch).total
    host_gb(need * 1.5 / GB, sharing=1)
    assert preflight.check(cfg).fits
    host_gb(need * 1.5 / GB, sharing=2)  # two ranks of this size do not fit where one does
    with pytest.raises(ConfigError, match="2 ranks on this host"):
        preflight.check(cfg)


def test_nothing_fits_says_so_and_names_the_remaining_fixes(host_gb):
    host_gb(0.001)
    with pytest.raises(ConfigError, match=r"Fix: a smaller model.block_size, or shard the model states"):
        preflight.check(_cfg())


def test_preflight_false_and_models_it_cannot_estimate_are_not_checked(host_gb):
    host_gb(0.001)
    assert preflight.check(_cfg("memory.preflight=false")) is None
    assert preflight.check(_cfg("model.entrypoint=tests.unit.test_preflight:nothing")) is None


def test_the_host_memory_is_read(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    available, source, sharing = preflight._available("cpu")
    assert available and available > 0 and source and sharing == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert preflight._available("cpu")[2] == 4


def test_train_refuses_before_it_writes_and_leaves_no_run_directory(tiny_overrides, tmp_path, capsys, host_gb):
    from trainperf.cli import main

    host_gb(0.001)  # 1 MB: the tiny test model's states alone are more
    run_dir = tmp_path / "new" / "deeper"
    sets = sum((["--set", o] for o in [*tiny_overrides, f"run.dir={run_dir}"]), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 2
    assert "it would not fit" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_refusal_after_the_run_directory_was_made_removes_it_again(tiny_overrides, tmp_path, capsys):
    """The data check comes after the run directory is made (it is checked writable first): a run refused
    there removes the directories it made, and keeps one that was there before."""
    from trainperf.cli import main

    kept = tmp_path / "kept"
    kept.mkdir()
    for run_dir in (tmp_path / "made" / "here", kept):
        sets = sum((["--set", o] for o in [*tiny_overrides, f"run.dir={run_dir}", "model.block_size=1000000",
                                           "memory.preflight=false"]), [])
        assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets]) == 2
        assert "fewer than one sample" in capsys.readouterr().err
    assert not (tmp_path / "made").exists()
    assert kept.is_dir()

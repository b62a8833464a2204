"""Sharded (DCP) checkpoints carry every file's size and sha256 (MANIFEST.json): a flipped byte in a shard
was loaded without a word and the run went on to NaN, reported as a divergence (fuzzing). One process saves
and reads DCP without a process group, so this runs here."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from trainperf.distributed import checkpoint as C
from trainperf.errors import CheckpointError


@pytest.fixture
def saved(tmp_path) -> Path:
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 8)).sum().backward()
    o.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        for step in (2, 4):
            C.save(tmp_path, step, [m], [o], {"step": step, "config": {}}, keep=3)
    return tmp_path


def test_the_manifest_lists_every_file_of_the_checkpoint(saved):
    ck = saved / "step-00000004"
    files = json.loads((ck / C.MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in ck.iterdir()} - {C.MANIFEST, "COMPLETE"}
    assert any(n.endswith(".distcp") for n in files) and "trainer.pt" in files and ".metadata" in files
    C.check_readable(ck)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_shard_is_refused_and_resume_falls_back(saved, damage):
    ck = saved / "step-00000004"
    shard = next(ck.glob("*.distcp"))
    if damage == "flip":
        b = bytearray(shard.read_bytes())
        b[len(b) // 2] ^= 0xFF
        shard.write_bytes(bytes(b))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    else:
        shard.unlink()
    with pytest.raises(CheckpointError, match="corrupt|missing"):
        C.check_readable(ck)
    with pytest.warns(UserWarning, match="checkpoint of step 4 is unusable"):
        assert C.latest(saved).name == "step-00000002"


def test_a_checkpoint_from_before_manifests_still_reads(saved):
    ck = saved / "step-00000004"
    (ck / C.MANIFEST).unlink()
    C.check_readable(ck)

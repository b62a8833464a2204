"""Fixes for the data items of the fuzzing report (the fuzzing report on training data, items 1, 5, 6, 10, 11, 12)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch

from trainperf.cli import main
from trainperf.errors import DataError

SMALL = ["--max-bytes", "60000"]


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _cfg(*overrides):
    from trainperf.config import load_config

    return load_config(None, ["model.block_size=32", "train.global_batch=8", "data.prepare_max_bytes=60000",
                              *overrides])


def _build(cfg):
    from trainperf.data.loader import build_data

    return build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["data", "prepare", "--out", str(d), *SMALL, "--json"]) == 0
    return d


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite_split(d, split, arr):
    """Replace ``split``.bin and update meta.json to match (size, tokens, sha): only the content is wrong."""
    raw = np.asarray(arr, dtype=np.uint16).tobytes()
    (d / f"{split}.bin").write_bytes(raw)
    meta = json.loads((d / "meta.json").read_text())
    meta["splits"][split] = {"tokens": len(raw) // 2, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (d / "meta.json").write_text(json.dumps(meta))


# --------------------------------------------------------------------------- 1: no overwrite of the user's data
def test_train_does_not_prepare_over_nanogpt_style_data(tmp_path):
    d = tmp_path / "mydata"
    d.mkdir()
    (d / "train.bin").write_bytes(os.urandom(10000))
    (d / "val.bin").write_bytes(os.urandom(1000))
    (d / "meta.pkl").write_bytes(b"pickled vocab")
    before = _snapshot(d)
    with pytest.raises(DataError) as e:
        _build(_cfg(f"data.path={d}", "data.prepare_from=stdlib"))
    msg = str(e.value)
    assert str(d) in msg and "train.bin" in msg and "meta.pkl" in msg
    assert "new or empty directory" in msg and "data.source=files" in msg
    assert _snapshot(d) == before


def test_train_does_not_prepare_among_other_files(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    (d / "code.py").write_text("print(1)")
    with pytest.raises(DataError, match=r"is not empty \(code.py, notes.txt\)"):
        _build(_cfg(f"data.path={d}", "data.prepare_from=stdlib"))
    assert sorted(p.name for p in d.iterdir()) == ["code.py", "notes.txt"]


def test_train_prepares_into_an_empty_or_new_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for d in (empty, tmp_path / "new"):
        data = _build(_cfg(f"data.path={d}", "data.prepare_from=stdlib"))
        assert data.vocab_size == 256 and (d / "meta.json").is_file()
        _build(_cfg(f"data.path={d}", "data.prepare_from=stdlib"))  # later runs reuse it


def test_data_prepare_refuses_foreign_data_and_says_when_it_replaces(tmp_path, tok, capsys):
    d = tmp_path / "mydata2"
    d.mkdir()
    (d / "train.bin").write_bytes(os.urandom(2000))
    (d / "meta.pkl").write_bytes(b"x")
    before = _snapshot(d)
    assert main(["data", "prepare", "--out", str(d), *SMALL]) == 2
    err = capsys.readouterr().err
    assert str(d) in err and "Traceback" not in err and "not overwritten" in err
    assert _snapshot(d) == before
    again = _copy(tok, tmp_path / "again")
    assert main(["data", "prepare", "--out", str(again), *SMALL]) == 0
    out = capsys.readouterr()
    assert "replaced" in out.out and "holds a trainperf dataset; it is replaced" in out.err


# --------------------------------------------------------------------------- 5, 6
def test_empty_train_split_is_a_data_error(tmp_path, tok, capsys):
    d = _copy(tok, tmp_path / "empty_train")
    _rewrite_split(d, "train", [])
    with pytest.raises(DataError, match=r"train.bin has 0 tokens, fewer than one sample of 33.*block_size"):
        _build(_cfg(f"data.path={d}", "data.prepare_from=null"))
    assert main(["data", "inspect", str(d), "--seq-len", "32"]) == 2
    assert "train.bin has 0 tokens" in capsys.readouterr().out


def test_data_path_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x\n")
    with pytest.raises(DataError, match=r"data.path .*afile' is a file, not a directory"):
        _build(_cfg(f"data.path={f}", "data.prepare_from=stdlib"))
    assert f.read_text() == "x\n"


# --------------------------------------------------------------------------- 10: skip with the simple loader
def test_simple_loader_honours_on_bad_sample_skip(tmp_path, tok, capsys):
    ex = tmp_path / "ex"
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "16"]) == 0
    (ex / "train" / "00000003.bin").write_bytes(b"\x01\x00" * 5)  # truncated
    base = [f"data.path={ex}", "data.source=files", "data.loader=simple", "data.shuffle=false"]
    data = _build(_cfg(*base, "data.on_bad_sample=skip"))
    with pytest.warns(RuntimeWarning, match="skipped unreadable sample 3"):
        for _ in range(2):  # 16 samples in batches of 8: sample 3 is read
            x, y = data.train.next_batch()
            assert x.shape == (8, 32)
    assert [s[0] for s in data.train.skipped] == [3]
    data = _build(_cfg(*base))  # on_bad_sample=error (the default) still stops, and names the setting that works
    with pytest.raises(DataError, match=r"00000003.bin.*on_bad_sample=skip.*every data.loader"):
        data.train.next_batch()


# --------------------------------------------------------------------------- 11: inspect --verify fails on bad data
def test_verify_exits_2_on_checksum_mismatch(tmp_path, tok, capsys):
    d = _copy(tok, tmp_path / "sha")
    arr = np.fromfile(d / "train.bin", dtype=np.uint16)
    arr[10] = (arr[10] + 1) % 256
    arr.tofile(d / "train.bin")
    assert main(["data", "inspect", "--verify", str(d), "--json"]) == 2
    info = json.loads(capsys.readouterr().out)
    assert info["train_sha256_ok"] is False and any("sha256" in p for p in info["problems"])
    assert main(["data", "inspect", "--verify", str(tok)]) == 0  # a good dataset still passes


def test_verify_flags_out_of_vocabulary_tokens_even_with_a_matching_sha(tmp_path, tok, capsys):
    d = _copy(tok, tmp_path / "oov")
    arr = np.fromfile(d / "train.bin", dtype=np.uint16)
    arr[1000] = 40000
    _rewrite_split(d, "train", arr)
    assert main(["data", "inspect", "--verify", str(d)]) == 2
    out = capsys.readouterr().out
    assert "token id 40000 at position 1000 is outside the vocabulary of 256" in out


@pytest.mark.parametrize("field,value,match", [
    ("dtype", "float64", "dtype='float64'"),
    ("tokens", 10**9, "tokens=1000000000 does not match"),
])
def test_meta_that_does_not_fit_the_files_is_refused(tmp_path, tok, capsys, field, value, match):
    d = _copy(tok, tmp_path / "lie")
    meta = json.loads((d / "meta.json").read_text())
    if field == "dtype":
        meta["dtype"] = value
    else:
        meta["splits"]["train"]["tokens"] = value
    (d / "meta.json").write_text(json.dumps(meta))
    assert main(["data", "inspect", "--verify", str(d)]) == 2
    assert match in capsys.readouterr().err
    with pytest.raises(DataError, match=match):  # and train refuses it the same way
        _build(_cfg(f"data.path={d}", "data.prepare_from=null"))


def test_verify_sample_files_exit_2_on_bad_and_out_of_vocabulary_samples(tmp_path, tok, capsys):
    ex = tmp_path / "ex"
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "8"]) == 0
    capsys.readouterr()
    (ex / "train" / "00000001.bin").write_bytes(np.full(33, 300, np.uint16).tobytes())  # past the vocabulary
    (ex / "train" / "00000002.bin").write_bytes(np.full(99, 7, np.uint16).tobytes())  # 3x a sample
    assert main(["data", "inspect", "--verify", str(ex), "--json"]) == 2
    bad = {b["index"]: b["reason"] for b in json.loads(capsys.readouterr().out)["bad_samples"]}
    assert "outside the vocabulary of 256" in bad[1] and "99 tokens" in bad[2] and set(bad) == {1, 2}


# --------------------------------------------------------------------------- 12: export leaves only its own files
def test_export_over_an_export_leaves_only_its_own_files(tmp_path, tok, capsys):
    ex = tmp_path / "w"
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--layout", "shard",
                 "--shards", "4"]) == 0
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "5"]) == 0
    assert "replaced the earlier export" in capsys.readouterr().err
    assert sorted(p.name for p in (ex / "train").iterdir()) == [f"{i:08d}.bin" for i in range(5)]
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no temporary folder left behind
    assert main(["data", "inspect", "--verify", str(ex), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["train_files"] == info["train_samples"] == 5


def test_export_refuses_a_folder_that_is_not_only_an_export(tmp_path, tok, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["data", "export", "--src", str(tok), "--out", str(mine), "--seq-len", "32"]) == 2
    assert "notes.txt" in capsys.readouterr().err and _snapshot(mine) == {"notes.txt": b"mine"}
    ex = tmp_path / "ex"
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "3"]) == 0
    (ex / "train" / "keep.npy").write_bytes(b"user file")
    before = _snapshot(ex)
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "2"]) == 2
    assert "train/keep.npy" in capsys.readouterr().err and _snapshot(ex) == before


def test_inspect_flags_files_an_export_did_not_write(tmp_path, tok, capsys):
    ex = tmp_path / "ex"
    assert main(["data", "export", "--src", str(tok), "--out", str(ex), "--seq-len", "32", "--max-samples", "4"]) == 0
    (ex / "train" / "shard-00000.bin").write_bytes(np.zeros(200, np.uint16).tobytes())  # stale, as left by old code
    capsys.readouterr()
    assert main(["data", "inspect", str(ex)]) == 2
    assert "meta.json records 4 samples, the folder holds 5" in capsys.readouterr().out

"""`trainperf data ...` and the `trainperf bench data --quick` smoke run."""

from __future__ import annotations

import json

import numpy as np

from trainperf.cli import main


def test_prepare_export_inspect(tmp_path, capsys):
    tok, files = tmp_path / "tok", tmp_path / "files"
    assert main(["data", "prepare", "--out", str(tok), "--max-bytes", "60000", "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["vocab_size"] == 256 and meta["splits"]["train"]["tokens"] > 0
    assert main(["data", "export", "--src", str(tok), "--out", str(files), "--seq-len", "32",
                 "--max-samples", "20", "--json"]) == 0
    capsys.readouterr()
    assert len(list((files / "train").iterdir())) == 20
    (files / "train" / "00000003.bin").write_bytes(b"\x01")  # truncated
    assert main(["data", "inspect", str(files), "--verify", "--json"]) == 2  # bad data: exit 2, as every refusal of input
    info = json.loads(capsys.readouterr().out)
    assert info["train_samples"] == 20
    assert [b["index"] for b in info["bad_samples"]] == [3] and "00000003.bin" in info["bad_samples"][0]["file"]


def test_export_shards_match_the_token_windows(tmp_path, capsys):
    from trainperf.data.sources import SampleFiles
    from trainperf.data.tokens import TokenWindows

    tok, sh = tmp_path / "tok", tmp_path / "sh"
    main(["data", "prepare", "--out", str(tok), "--max-bytes", "60000", "--json"])
    assert main(["data", "export", "--src", str(tok), "--out", str(sh), "--seq-len", "32", "--layout", "shard",
                 "--shards", "3", "--json"]) == 0
    capsys.readouterr()
    ref, got = TokenWindows(str(tok), "train", 32), SampleFiles(str(sh / "train"), 32)
    assert got.layout == "shard" and got.num_files == 3 and len(got) == len(ref)
    for i in (0, len(ref) // 3, len(ref) // 3 + 1, len(ref) - 1):
        np.testing.assert_array_equal(got[i], ref[i])


def test_missing_paths_exit_2_with_a_message(tmp_path, capsys):
    assert main(["data", "inspect", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["data", "export", "--src", str(tmp_path), "--out", str(tmp_path / "o"), "--seq-len", "8"]) == 2
    assert "no prepared tokens" in capsys.readouterr().err


def test_bench_data_quick_json(capsys):
    assert main(["bench", "data", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in out["loaders"]]
    assert names[:4] == ["dataloader_default", "dataloader_tuned", "hybrid", "hybrid_fixed"]
    assert set(names[4:]) == {"torchdata_stateful", "mosaic_streaming"}  # peers: measured, or skipped with a reason
    measured = [r for r in out["loaders"] if "skipped" not in r]
    for r in measured:
        assert r["cold_samples_per_s"] > 0 and r["warm_samples_per_s"] > 0 and 0 <= r["data_wait_fraction"] <= 1
    for r in out["loaders"]:
        assert "skipped" not in r or len(r["skipped"]) > 20
    ratios = out["summary"]["hybrid_warm_ratio_vs"]
    assert set(ratios) == {r["name"] for r in measured} & {"dataloader_tuned", "torchdata_stateful", "mosaic_streaming"}
    hybrid = out["loaders"][2]
    assert hybrid["stats"]["cache_hits"] > 0  # the warm epochs were served from the disk cache
    pf = hybrid["prefetch"]  # derived from what the loader measured (it only grows from the fixed start)
    assert pf["plan"]["measured_step"] and pf["plan"]["read_s"] > 0 and pf["io_threads"] >= 8 and pf["depth"] >= 4
    assert out["loaders"][3]["prefetch"]["io_threads"] == 8 and out["loaders"][3]["prefetch"]["depth"] == 4


def test_prepare_src_that_is_a_file_or_holds_too_little_text_says_what_it_saw(tmp_path, capsys):
    """--src a.txt (an existing file) said "does not exist"; a directory holding one byte of text and a binary
    file said "holds only 3 bytes" and not which files were read."""
    f = tmp_path / "one" / "a.txt"
    f.parent.mkdir()
    f.write_text("hello\n")
    assert main(["data", "prepare", "--src", str(f), "--out", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "is a file; --src takes a directory of text files" in err and repr(str(f.parent)) in err
    small = tmp_path / "small"
    small.mkdir()
    (small / "x.txt").write_text("x")
    (small / "r.bin").write_bytes(b"\x00\x01" * 100)
    assert main(["data", "prepare", "--src", str(small), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "holds only 1 bytes of text (1 text file(s); 1 binary or unreadable file(s) skipped)" in err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()

"""`trainperf data ...` and the `trainperf bench data --quick` smoke run."""

from __future__ import annotations

import json

import numpy as np
import pytest

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
    for r in measured:  # the figure (median of the windows) beside the whole loop's and the per-step waits
        assert len(r["data_wait_windows"]) == out["settings"]["wait_windows"] == 5
        assert min(r["data_wait_windows"]) <= r["data_wait_fraction"] <= max(r["data_wait_windows"])
        assert 0 <= r["data_wait_fraction_total"] <= 1 and r["loop_steps"] >= 5
        assert 0 <= r["step_wait_p50_s"] <= r["step_wait_p95_s"] <= r["max_step_wait_s"]
    s = out["settings"]
    assert s["quick"] and s["quick_set"] == {"samples": 96, "batch": 16, "latency_ms": 2.0, "decode_ms": 0.2,
                                             "item_kb": 4.0, "wait_loop_s": 0.3}


def test_bench_data_quick_keeps_the_values_given_and_says_what_it_set(capsys):
    """--quick took min(given, its own): `--quick --latency-ms 7` ran at 2 ms per read, silently."""
    argv = ["bench", "data", "--quick", "--latency-ms", "7", "--batch", "8", "--only", "hybrid"]
    assert main(argv + ["--json"]) == 0
    s = json.loads(capsys.readouterr().out)["settings"]
    assert s["latency_ms"] == 7.0 and s["batch"] == 8  # kept as given
    assert s["quick_set"] == {"samples": 96, "decode_ms": 0.2, "item_kb": 4.0, "wait_loop_s": 0.3}
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "7 ms per read" in text and "batch 8" in text
    assert "--quick set: --samples 96, --decode-ms 0.2, --item-kb 4; wait loop 0.3 s (values you gave are kept)" in text


def test_bench_data_epochs_below_2_is_refused_not_raised(capsys):
    """--epochs 1 was raised to 2 behind the user's back; the bench needs a warm epoch: exit 2 naming the bound."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "data", "--quick", "--epochs", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --epochs: 1 is below 2: give a whole number >= 2" in err, err
    assert "Traceback" not in err


def test_the_data_wait_figure_is_the_median_of_windows_not_moved_by_one_stall():
    """The figure of a loop whose steps each wait 1 ms of 10 ms, with one 300 ms stall: the median of the windows
    stays at 10%, the whole-loop fraction moves (the old figure), and p50 / p95 / max say what happened."""
    from trainperf.bench.data import wait_figures

    waits = [0.001] * 500
    waits[37] = 0.3
    starts, t = [], 0.0
    for w in waits:
        starts.append(t)
        t += w + 0.009
    f = wait_figures(waits, starts, t, windows=5)
    assert f["data_wait_fraction"] == pytest.approx(0.1)
    assert f["data_wait_fraction_total"] > 0.15  # one stall moves the total by 5+ points
    assert f["step_wait_p50_s"] == pytest.approx(0.001) and f["step_wait_p95_s"] == pytest.approx(0.001)
    assert f["max_step_wait_s"] == 0.3 and f["loop_steps"] == 500 and len(f["data_wait_windows"]) == 5
    one = wait_figures([0.002], [0.0], 0.01)  # fewer steps than windows: one window per step
    assert one["data_wait_fraction"] == pytest.approx(0.2) and one["data_wait_windows"] == [pytest.approx(0.2)]


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

"""Every file trainperf reads, fed randomized garbage: random bytes, non-UTF-8, empty files and truncations
of valid files. Each reader either reads a valid file or raises a UserError naming the file; never another
exception (which the CLI would show as a traceback with exit 1). Seeded and fast."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainperf.errors import CheckpointError, ConfigError, DataError, UserError

SEED = 16
N = 24  # variants per reader


def variants(valid: bytes, rng: random.Random, n: int = N) -> list[bytes]:
    """Garbage derived from a valid file, and unrelated garbage."""
    out = [b"", b"\xff\xfe\x00garbage", "caf\u00e9: 1\n".encode("latin-1"), b"\x00" * 64, valid[: len(valid) // 2]]
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:  # random bytes
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
        elif kind == 1 and valid:  # a truncation
            out.append(valid[: rng.randrange(len(valid))])
        elif kind == 2 and valid:  # flipped bytes
            b = bytearray(valid)
            for _ in range(rng.randrange(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            out.append(bytes(b))
        else:  # a non-UTF-8 byte inside valid text
            i = rng.randrange(len(valid) + 1)
            out.append(valid[:i] + bytes([rng.choice([0x80, 0xC3, 0xFE, 0xFF])]) + valid[i:])
    return out


def survives(read, path: Path, errors=(UserError,)):
    """Call ``read()``; a UserError must name the file. Returns the result or the error."""
    try:
        return read()
    except errors as exc:
        assert str(path.name) in str(exc) or str(path) in str(exc), f"error does not name {path}: {exc}"
        return exc


# ---------------------------------------------------------------------------- configs (YAML)
def test_config_garbage_is_a_config_error(tmp_path):
    from trainperf.config import load_config
    from trainperf.config.schema import Config

    rng = random.Random(SEED)
    valid = Path(__file__).resolve().parents[2].joinpath("configs/gpt-tiny.yaml").read_bytes()
    p = tmp_path / "c.yaml"
    for data in variants(valid, rng):
        p.write_bytes(data)
        try:
            assert isinstance(load_config(str(p)), Config)  # a truncation can still be a valid config
        except ConfigError as exc:
            assert str(p) in str(exc) or "invalid config" in str(exc)


def test_non_utf8_config_names_file_and_byte_cli_exit_2(tmp_path, capsys):
    from trainperf.cli import main

    p = tmp_path / "latin1.yaml"
    p.write_bytes("run: {name: caf\u00e9}\n".encode("latin-1"))
    assert main(["config", "show", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "not UTF-8" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- summary.json / metrics.jsonl
def test_run_json_readers_on_garbage(tmp_path):
    from trainperf.runio import read_json, read_jsonl

    rng = random.Random(SEED + 1)
    summary = json.dumps({"final_loss": 2.5, "steps": 10, "phase_seconds": {"data": 0.1}}, indent=2).encode()
    metrics = b"".join(json.dumps({"step": i, "loss": 3.0 - i / 10, "step_time_s": 0.1}).encode() + b"\n"
                       for i in range(1, 6))
    p = tmp_path / "summary.json"
    for data in variants(summary, rng):
        p.write_bytes(data)
        r = survives(lambda: read_json(p), p)
        assert isinstance(r, (dict, UserError))
    q = tmp_path / "metrics.jsonl"
    for data in variants(metrics, rng):
        q.write_bytes(data)
        r = survives(lambda: read_jsonl(q), q)
        assert isinstance(r, (list, UserError))
        if isinstance(r, list):
            assert all(isinstance(x, dict) for x in r)


def test_old_files_with_nan_read_as_null(tmp_path):
    from trainperf.runio import read_json, read_jsonl

    p = tmp_path / "summary.json"
    p.write_text('{"final_loss": NaN, "tokens_per_s": Infinity, "steps": 3}')
    assert read_json(p) == {"final_loss": None, "tokens_per_s": None, "steps": 3}
    q = tmp_path / "metrics.jsonl"
    q.write_text('{"step": 1, "loss": NaN}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')  # last line cut by a crash
    assert read_jsonl(q) == [{"step": 1, "loss": None}, {"step": 2, "loss": 1.5}]
    q.write_bytes(b'{"step": 1, "loss": 2.0}\n' + b"\0" * 4096)  # a block zero-filled by a crash
    assert read_jsonl(q) == [{"step": 1, "loss": 2.0}]


def test_diagnose_and_report_on_garbage_run_dir(tmp_path, capsys):
    from trainperf.cli import main
    from trainperf.diagnosis.rundir import load_run

    rng = random.Random(SEED + 2)
    d = tmp_path / "run"
    d.mkdir()
    good = b"".join(json.dumps({"step": i, "loss": 3.0, "step_time_s": 0.1, "tokens_per_s": 100.0,
                                "phases_s": {"data": 0.01, "forward_backward": 0.09}}).encode() + b"\n"
                    for i in range(1, 8))
    (d / "metrics.jsonl").write_bytes(good)
    for s in (b"", b"\x89PNG\r\n\x1a\n", b'{"final_loss": Na', b"[1, 2]", "\u00e9".encode("latin-1")):
        (d / "summary.json").write_bytes(s)
        with pytest.raises(UserError, match="summary.json"):
            load_run(d)
    (d / "summary.json").write_text('{"final_loss": NaN, "steps": 7}')  # an old file: loads
    assert load_run(d)["summary"]["final_loss"] is None
    (d / "summary.json").unlink()
    for data in variants(good, rng, n=8):
        (d / "metrics.jsonl").write_bytes(data)
        survives(lambda: load_run(d), d / "metrics.jsonl")
    (d / "metrics.jsonl").write_bytes(b"\x00\x01\x02 binary")
    assert main(["diagnose", str(d)]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [3.5, [1], {"a": 1}, True, None, 10**30])
def test_a_summary_whose_text_fields_are_not_text_is_still_read(tmp_path, capsys, value):
    """Valid JSON of the wrong kind where summary.json has text (peak_source, device, mfu_convention: once an
    AttributeError in diagnose, report and compare), and steps that run backwards (a None loss formatted)."""
    from trainperf.cli import main

    runs = []
    for name, steps in (("a", range(1, 8)), ("b", range(-7, 0))):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": i, "loss": 3.0, "step_time_s": 0.1, "tokens_per_s": 100.0, "mfu": 0.1,
             "phases_s": {"data": 0.01, "forward_backward": 0.09}}) + "\n" for i in steps))
        (d / "summary.json").write_text(json.dumps({"steps": 7, "mfu": 0.1, "peak_source": value, "device": value,
                                                    "mfu_convention": value}))
        runs.append(str(d))
    for argv in (["diagnose", runs[0]], ["diagnose", runs[0], "--json"], ["report", runs[0]],
                 ["compare", *runs], ["compare", *runs, "--json"]):
        assert main(argv) == 0, argv
        assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- single-file checkpoints
def test_single_file_checkpoint_readers_on_garbage(tmp_path):
    from trainperf.train.checkpoint import CheckpointManager

    rng = random.Random(SEED + 3)
    mgr = CheckpointManager(tmp_path / "ck", keep=5)
    state = {"step": 4, "model": {"w": torch.arange(6.0)}}
    mgr.save(4, state)
    pt, man = tmp_path / "ck/step-00000004.pt", tmp_path / "ck/step-00000004.json"
    valid_pt, valid_man = pt.read_bytes(), man.read_bytes()
    for data in variants(valid_man, rng):
        man.write_bytes(data)
        r = survives(lambda: mgr.verify_and_load(4), man, CheckpointError)
        assert isinstance(r, (dict, CheckpointError))
    man.write_bytes(valid_man)
    for data in variants(valid_pt, rng, n=12):
        pt.write_bytes(data)
        r = survives(lambda: mgr.verify_and_load(4), pt, CheckpointError)
        assert isinstance(r, CheckpointError) or data == valid_pt
        other = tmp_path / "user.pt"  # --resume PATH without a manifest: torch.load(weights_only=True)
        other.write_bytes(data)
        survives(lambda: mgr.load_file(str(other)), other, CheckpointError)
    # a manifest pointing outside the directory is refused, not followed
    man.write_text(json.dumps({"step": 4, "file": "../../etc/passwd", "bytes": 1, "sha256": "0" * 64}))
    with pytest.raises(CheckpointError, match="not a valid checkpoint manifest"):
        mgr.verify_and_load(4)


# ---------------------------------------------------------------------------- DCP checkpoints (read path)
def test_dcp_checkpoint_read_path_on_garbage(tmp_path):
    import torch.distributed.checkpoint as dcp

    from trainperf.distributed import checkpoint as dckpt

    rng = random.Random(SEED + 4)
    path = tmp_path / "ck" / "step-00000006"
    path.mkdir(parents=True)
    dcp.save({"model": {"w": torch.arange(8.0)}}, checkpoint_id=str(path))  # one process: no process group
    torch.save({"step": 6, "config": {}}, path / "trainer.pt")
    (path / "COMPLETE").write_text("6")
    assert dckpt.latest(tmp_path / "ck") == path
    for name in (".metadata", "trainer.pt", "COMPLETE"):
        f = path / name
        valid = f.read_bytes()
        for data in variants(valid, rng, n=8):
            f.write_bytes(data)
            r = survives(lambda: dckpt.check_readable(path), path, CheckpointError)
            if isinstance(r, CheckpointError):
                with pytest.warns(UserWarning, match="step 6 is unusable"):
                    assert dckpt.latest(tmp_path / "ck") is None
        f.write_bytes(valid)
    assert dckpt.check_readable(path)["step"] == 6


# ---------------------------------------------------------------------------- prepared data, sample files, cache
def test_prepared_data_manifest_and_token_files_on_garbage(corpus, tmp_path):
    import shutil

    from trainperf.config import load_config
    from trainperf.data.loader import build_data
    from trainperf.data.prepare import read_meta

    rng = random.Random(SEED + 5)
    d = tmp_path / "tok"
    shutil.copytree(corpus, d)
    meta = d / "meta.json"
    valid = meta.read_bytes()
    for data in variants(valid, rng):
        meta.write_bytes(data)
        r = survives(lambda: read_meta(str(d)), meta, DataError)
        assert isinstance(r, (dict, DataError))
    meta.write_bytes(valid)
    cfg = load_config(None, [f"data.path={d}", "data.prepare_from=null", "model.block_size=32", "train.global_batch=8"])
    val = d / "val.bin"
    ok = val.read_bytes()
    val.write_bytes(ok[:-3])  # truncated: size differs from meta.json
    with pytest.raises(DataError, match=r"val.bin: truncated \(\d+ of \d+ bytes\)"):
        build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False)
    val.unlink()
    val.mkdir()  # a directory where the tokens should be: said as such, not "0 of N bytes"
    with pytest.raises(DataError, match="val.bin is a directory, not the file of"):
        build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False)
    val.rmdir()
    with pytest.raises(DataError, match=r"val.bin: missing \(\d+ bytes of tokens expected"):
        build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False)
    garbage = np.frombuffer(ok, dtype=np.uint16).copy()
    garbage[len(garbage) // 2] = 40000  # same size, a token id past the 256-token vocabulary
    val.write_bytes(garbage.tobytes())
    with pytest.raises(DataError, match=r"val.bin: token id 40000 .* outside the vocabulary of 256"):
        build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False)


def test_sample_files_manifest_on_garbage(tmp_path):
    from trainperf.data.sources import _read_dir_meta

    rng = random.Random(SEED + 6)
    f = tmp_path / "meta.json"
    valid = json.dumps({"vocab_size": 256, "dtype": "uint16", "layout": "auto", "tokenizer": "bytes"}).encode()
    for data in variants(valid, rng):
        f.write_bytes(data)
        r = survives(lambda: _read_dir_meta(tmp_path), f, DataError)
        assert isinstance(r, (dict, DataError))
    f.write_text(json.dumps({"vocab_size": 256, "dtype": "object"}))
    with pytest.raises(DataError, match="not an integer token dtype"):
        _read_dir_meta(tmp_path)


def test_cache_entries_on_garbage():
    import struct
    import zlib

    from trainperf.data.cache import HEADER, MAGIC, decode_entry, encode_entry

    rng = random.Random(SEED + 7)
    arr = np.arange(33, dtype=np.uint16)
    valid = encode_entry(arr)
    assert np.array_equal(decode_entry(valid), arr)
    for data in variants(valid, rng, n=60):
        out = decode_entry(data)
        assert out is None or np.array_equal(out, arr)
    # garbage that passes the checksum (a valid header over a random payload): metadata checks catch it
    for _ in range(200):
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        blob = HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        out = decode_entry(blob)
        assert out is None or (isinstance(out, np.ndarray) and out.dtype.kind in "biufc")
    obj = b"|O"
    payload = struct.pack("<B", len(obj)) + obj + struct.pack("<B", 1) + struct.pack("<q", 1) + b"\0" * 8
    assert decode_entry(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload) is None


def test_metrics_log_truncation_on_resume_survives_garbage(tmp_path):
    from trainperf.monitor.sinks import JSONLSink

    rng = random.Random(SEED + 8)
    good = b"".join(json.dumps({"step": i, "loss": 1.0}).encode() + b"\n" for i in range(1, 9))
    p = tmp_path / "metrics.jsonl"
    for data in variants(good, rng, n=12) + [b"5\n[1]\n" + good, b'{"step": "x"}\n' + good]:
        p.write_bytes(data)
        JSONLSink(p, truncate_after_step=4).close()  # resume from step 4: keeps what parses up to it
        kept = [json.loads(ln) for ln in p.read_text().splitlines()]
        assert all(isinstance(r, dict) and r.get("step", -1) <= 4 for r in kept)  # records without a step stay


def test_peak_flops_cache_garbage_is_measured_afresh(tmp_path, monkeypatch):
    from trainperf.monitor import flops

    monkeypatch.setenv("TRAINPERF_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    flops._PEAK_CACHE.clear()
    flops.measured_matmul_peak(cpu, n=32, reps=1)
    cache = tmp_path / "matmul_peak.json"
    (key,) = json.loads(cache.read_text())
    for data in (b"\xff\xfe", b"[1, 2]", b"null", json.dumps({key: {"peak_flops": None}}).encode(),
                 json.dumps({key: [1]}).encode(), json.dumps({key: {"peak_flops": "fast"}}).encode()):
        cache.write_bytes(data)
        flops._PEAK_CACHE.clear()
        assert flops.measured_matmul_peak(cpu, n=32, reps=1)["peak_flops"] > 0
    flops._PEAK_CACHE.clear()


def test_garbled_sample_files_are_bad_samples(tmp_path):
    from trainperf.config import load_config
    from trainperf.data.sources import BadSample, build_sources

    rng = random.Random(SEED + 9)
    root = tmp_path / "files"
    (root / "train").mkdir(parents=True)
    (tmp_path / "files" / "meta.json").write_text(json.dumps({"vocab_size": 256, "dtype": "uint16"}))
    good = np.arange(33, dtype=np.uint16)
    for k in range(4):
        (root / "train" / f"{k}.bin").write_bytes(good.tobytes())
    garbage = bytes(rng.randrange(256) for _ in range(66))  # right size, random ids up to 65535
    (root / "train" / "3.bin").write_bytes(garbage)
    cfg = load_config(None, ["data.source=files", f"data.path={root}"])
    train, _, meta = build_sources(cfg, seq_len=32)
    assert meta["vocab_size"] == 256 and np.array_equal(train[0], good)
    bad = max(np.frombuffer(garbage, dtype=np.uint16))
    with pytest.raises(BadSample, match=rf"3.bin.*token id {bad} is outside the vocabulary of 256"):
        train[3]


def test_an_interrupt_inside_a_dcp_save_is_an_interrupt_not_a_checkpoint_failure():
    """DCP gathers every rank's exception into a CheckpointException; a SIGTERM (Terminated) or Ctrl-C that
    lands inside a save comes out as itself (exit 143 / 130, no traceback), any other failure as DCP's."""
    from torch.distributed.checkpoint.api import CheckpointException

    from trainperf.distributed.checkpoint import interrupts_unwrapped
    from trainperf.interrupt import Terminated

    with pytest.raises(Terminated):
        with interrupts_unwrapped():
            raise CheckpointException("write", {0: (ValueError("disk"), None), 1: (Terminated(), None)})
    with pytest.raises(KeyboardInterrupt):
        with interrupts_unwrapped():
            raise CheckpointException("write", {0: (KeyboardInterrupt(), None)})
    with pytest.raises(CheckpointException):
        with interrupts_unwrapped():
            raise CheckpointException("write", {0: (OSError("disk full"), None)})


def _laughs(levels: int = 9) -> str:
    """The 'billion laughs' YAML: nine aliases of nine aliases of ... (9**levels values once expanded)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["top", "inside a field"])
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, where):
    # nested aliases inside model.hf.overrides once hung the config loader (it walked the expansion)
    import time

    from trainperf.config import load_config
    from trainperf.hardware.catalog import load_catalog

    text = _laughs().replace("l9: &l9", "model:\n  hf:\n    overrides: &l9") if where != "top" else _laughs()
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(text)
    t0 = time.process_time()
    with pytest.raises(ConfigError, match=r"bomb.yaml: expands to more than 200,000 values"):
        load_config(str(cfg))
    cat = tmp_path / "cat.yaml"
    cat.write_text(_laughs() + "gpus: {x: {base: a100-80gb, aliases: *l9}}\n")
    with pytest.raises(UserError, match=r"catalog file .*cat.yaml.* expands to more than"):
        load_catalog(str(cat))
    assert time.process_time() - t0 < 20  # bounded: the walk stops at the limit
    # anchors and aliases as people use them still load
    ok = tmp_path / "ok.yaml"
    ok.write_text("train: &t {micro_batch: 4, global_batch: 8}\noptimizer: {lr: 1.0e-3}\n")
    assert load_config(str(ok)).train.micro_batch == 4

"""Sources (sample files, Dataset entrypoint, slow storage) and the disk cache tier."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from trainperf.data import cache as cache_mod
from trainperf.data.cache import DiskCache, decode_entry, encode_entry
from trainperf.data.sources import BadSample, DatasetSource, SampleFiles, SlowStorage, build_sources
from trainperf.errors import DataError

T = 8  # seq_len in these tests


def write_samples(d, n, seq_len=T, start=0):
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"{i:05d}.bin").write_bytes(np.full(seq_len + 1, start + i, dtype=np.uint16).tobytes())
    return d


# --------------------------------------------------------------------------- sources
def test_sample_files_one_per_sample(tmp_path):
    src = SampleFiles(str(write_samples(tmp_path / "s", 5)), T)
    assert src.layout == "sample" and len(src) == 5
    assert src.names.dtype.kind == "S"  # numpy metadata, not a Python list
    np.testing.assert_array_equal(src[3], np.full(T + 1, 3))
    assert src.gather([4, 0]).shape == (2, T + 1)


def test_sample_files_shards_match_token_windows(tmp_path):
    d = tmp_path / "sh"
    d.mkdir()
    tokens = np.arange(200, dtype=np.uint16)
    (d / "a.bin").write_bytes(tokens[:81].tobytes())  # 10 windows of 9 tokens, stride 8
    (d / "b.bin").write_bytes(tokens[100:141].tobytes())  # 5 windows
    src = SampleFiles(str(d), T)
    assert src.layout == "shard" and src.num_files == 2 and len(src) == 15
    np.testing.assert_array_equal(src[9], tokens[72:81])
    np.testing.assert_array_equal(src[10], tokens[100:109])
    assert "b.bin window 0" in src.describe(10)


def test_missing_path_and_truncated_sample_name_index_and_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        SampleFiles(str(tmp_path / "nope"), T)
    d = write_samples(tmp_path / "s", 4)
    (d / "00002.bin").write_bytes(b"\x01\x00" * 3)  # 3 tokens, need 9
    src = SampleFiles(str(d), T)
    with pytest.raises(BadSample) as exc:
        src[2]
    assert exc.value.index == 2 and exc.value.file.endswith("00002.bin")
    assert "sample 2" in str(exc.value) and "00002.bin" in str(exc.value) and "on_bad_sample=skip" in str(exc.value)
    os.unlink(d / "00001.bin")  # vanished after indexing
    with pytest.raises(BadSample, match="00001.bin.*unreadable"):
        src[1]


class _ToyDataset:
    vocab_size = 300

    def __init__(self, split="train", seq_len=T):
        self.n = 20 if split == "train" else 6
        self.seq_len = seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 7:
            raise ValueError("corrupt record")
        return list(range(i, i + self.seq_len + 1))


def make_toy_dataset(split="train", seq_len=T):
    return _ToyDataset(split, seq_len)


def test_dataset_entrypoint_source():
    from trainperf.config.schema import Config

    cfg = Config()
    cfg.data.source = "dataset"
    cfg.data.dataset_entrypoint = f"{__name__}:make_toy_dataset"
    train, val, meta = build_sources(cfg, T)
    assert isinstance(train, DatasetSource) and len(train) == 20 and len(val) == 6
    assert meta["vocab_size"] == 300
    np.testing.assert_array_equal(train[2], np.arange(2, 2 + T + 1))
    with pytest.raises(BadSample, match="item 7.*corrupt record"):
        train[7]
    cfg.data.dataset_entrypoint = "no_such_module_xyz:f"
    with pytest.raises(DataError, match="cannot import"):
        build_sources(cfg, T)


def test_slow_storage_latency_overlaps_and_bandwidth_is_shared():
    data = [np.zeros(100_000, dtype=np.uint8) for _ in range(4)]
    slow = SlowStorage(data, read_latency_ms=40)
    t = time.perf_counter()
    slow[0], slow[1]
    assert time.perf_counter() - t >= 0.08  # sequential reads pay the latency each
    threads = [threading.Thread(target=slow.__getitem__, args=(i,)) for i in range(4)]
    t = time.perf_counter()
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert time.perf_counter() - t < 0.15  # concurrent reads overlap their latency
    capped = SlowStorage(data, 0, bandwidth_mb_s=4.0)  # 100 kB at 4 MB/s = 25 ms each, one link
    threads = [threading.Thread(target=capped.__getitem__, args=(i,)) for i in range(4)]
    t = time.perf_counter()
    [th.start() for th in threads]
    [th.join() for th in threads]
    assert time.perf_counter() - t >= 0.095


def test_build_sources_files_with_meta(tmp_path):
    from trainperf.config.schema import Config

    write_samples(tmp_path / "train", 10)
    write_samples(tmp_path / "val", 3)
    cfg = Config()
    cfg.data.source, cfg.data.path = "files", str(tmp_path)
    with pytest.raises(DataError, match="vocabulary size is unknown"):
        build_sources(cfg, T)
    (tmp_path / "meta.json").write_text('{"vocab_size": 256}')
    train, val, meta = build_sources(cfg, T)
    assert len(train) == 10 and len(val) == 3 and meta["vocab_size"] == 256
    cfg.data.path = str(tmp_path / "missing")
    with pytest.raises(DataError, match="does not exist"):
        build_sources(cfg, T)


# --------------------------------------------------------------------------- cache
def test_entry_roundtrip_and_corruption_detected():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    blob = encode_entry(a)
    np.testing.assert_array_equal(decode_entry(blob), a)
    bad = bytearray(blob)
    bad[-1] ^= 0xFF
    assert decode_entry(bytes(bad)) is None  # flipped byte
    assert decode_entry(blob[:-5]) is None  # truncated
    assert decode_entry(b"") is None


def test_cache_survives_restart_and_drops_corrupt_entries(tmp_path):
    c = DiskCache(str(tmp_path), 10**6, "ns")
    assert c.get(5) is None and c.stats["misses"] == 1
    assert c.put(5, np.arange(9, dtype=np.uint16))
    c2 = DiskCache(str(tmp_path), 10**6, "ns")  # a new process / a restart
    np.testing.assert_array_equal(c2.get(5), np.arange(9))
    assert c2.stats["hits"] == 1
    p = c2.path(5)
    raw = bytearray(p.read_bytes())
    raw[-2] ^= 0x55
    p.write_bytes(bytes(raw))
    assert c2.get(5) is None
    assert c2.stats["corrupt"] == 1 and not p.exists()
    c2.put(5, np.arange(9, dtype=np.uint16))
    p.write_bytes(p.read_bytes()[:20])  # truncated
    assert c2.get(5) is None and c2.stats["corrupt"] == 2


def test_cache_lru_eviction_bounded(tmp_path):
    item = np.zeros(1000, dtype=np.uint8)
    entry = len(encode_entry(item))
    c = DiskCache(str(tmp_path), 10 * entry, "ns")
    for i in range(8):
        c.put(i, item)
        os.utime(c.path(i), (1000 + i, 1000 + i))  # distinct ages (mtime resolution)
    os.utime(c.path(0), (5000, 5000))  # 0 recently used
    for i in range(8, 14):
        c.put(i, item)
        os.utime(c.path(i), (6000 + i, 6000 + i))
    on_disk = sum(f.stat().st_size for f in tmp_path.rglob("*.e"))
    assert on_disk <= 10 * entry and c.usage() == on_disk
    assert c.stats["evictions"] >= 4
    assert c.path(0).exists() and not c.path(1).exists()  # least recently used went first


def _writer(d, wid, n, max_bytes):
    c = DiskCache(d, max_bytes, "ns")
    for i in range(n):
        c.put(wid * 1000 + i, np.full(500, i, dtype=np.uint8))
        got = c.get(wid * 1000 + i // 2)
        assert got is None or got[0] == i // 2


def test_cache_shared_by_processes_stays_bounded_and_valid(tmp_path):
    entry = len(encode_entry(np.zeros(500, dtype=np.uint8)))
    max_bytes = 40 * entry
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 60, max_bytes)) for w in range(3)]
    [p.start() for p in procs]
    [p.join(30) for p in procs]
    assert all(p.exitcode == 0 for p in procs)
    files = list(tmp_path.rglob("*.e"))
    on_disk = sum(f.stat().st_size for f in files)
    assert on_disk <= max_bytes
    assert all(decode_entry(f.read_bytes()) is not None for f in files)
    assert DiskCache(str(tmp_path), max_bytes, "ns").usage() == on_disk
    assert not list(tmp_path.rglob(".*.tmp*"))


def test_cache_unwritable_warns_and_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    c = DiskCache(str(blocker / "cache"), 10**6, "ns")
    assert not c.writable and "cannot open" in c.warnings[0]
    assert c.get(1) is None and c.put(1, np.zeros(3)) is False

    c = DiskCache(str(tmp_path / "full"), 10**6, "ns")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "replace", full)
    assert c.put(1, np.zeros(3)) is False
    assert not c.writable and "disk is full" in c.warnings[0] and len(c.warnings) == 1
    assert c.put(2, np.zeros(3)) is False and len(c.warnings) == 1  # warned once
    assert not list((tmp_path / "full").rglob(".*tmp*"))  # no partial files left


def test_write_behind_flush(tmp_path):
    c = DiskCache(str(tmp_path), 10**6, "ns")
    for i in range(20):
        c.put_async(i, np.full(4, i))
    c.flush()
    assert c.stats["puts"] == 20
    assert DiskCache(str(tmp_path), 10**6, "ns").get(19)[0] == 19

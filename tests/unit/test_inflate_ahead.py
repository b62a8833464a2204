"""The read-ahead that inflates a gzipped trace on another core while ``diagnose`` imports: the reader gets
the same bytes from it, its errors as its own, nothing from a file changed since, and no thread is left."""

from __future__ import annotations

import gzip
import io
import json
import os
import threading
import time

import pytest

from trainperf.errors import UserError
from trainperf.trace import inflate, reader

PAYLOAD = os.urandom(1 << 15).hex().encode() + b'{"a": 1}' * 40_000


def _trace(n: int = 20_000) -> bytes:
    evs = [{"ph": "X", "cat": "kernel", "name": f"k{i % 17}", "pid": 0, "tid": 7, "ts": 10 + 5 * i, "dur": 3,
            "args": {"stream": 7, "correlation": i}} for i in range(n)]
    return json.dumps({"schemaVersion": 1, "traceEvents": evs}).encode()


def _no_inflate_threads(timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(t.name == "trainperf-inflate" for t in threading.enumerate()):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(autouse=True)
def _clean():
    yield
    inflate.cancel_all()
    assert _no_inflate_threads()


def test_the_read_ahead_hands_the_reader_the_bytes_gunzip_reads(tmp_path):
    data = gzip.compress(PAYLOAD[:5000]) + b"\0" * 9 + gzip.compress(PAYLOAD[5000:])
    p = tmp_path / "x.gz"
    p.write_bytes(data)
    assert inflate.start(p, n=1 << 16)
    ra = inflate.take(p, 1 << 16)
    assert ra is not None
    got = list(ra.pieces())
    assert got[-1][0] == b""
    assert [b for b, _ in got[:-1]] == list(inflate.gunzip(io.BytesIO(data), 1 << 16))
    positions = [pos for _, pos in got]
    assert positions == sorted(positions) and positions[-1] == len(data)
    assert inflate.take(p, 1 << 16) is None  # handed out once


def test_a_trace_read_through_the_read_ahead_is_the_same_trace(tmp_path, monkeypatch):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace()))
    want = reader.read_all(p)
    taken = []
    orig = inflate.take

    def spy(path, n):
        ra = orig(path, n)
        taken.append(ra is not None)
        return ra

    assert inflate.start(p)
    monkeypatch.setattr(inflate, "take", spy)
    got = reader.read_all(p)
    assert taken == [True]
    assert got[0] == want[0]
    assert [(e.name, e.ts, e.args.corr) for e in got[1]] == [(e.name, e.ts, e.args.corr) for e in want[1]]


def test_a_file_changed_since_the_start_is_read_again_not_from_the_read_ahead(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace(100)))
    assert inflate.start(p)
    p.write_bytes(gzip.compress(_trace(300)))  # another size: the read-ahead is of the old file
    assert inflate.take(p, inflate.CHUNK) is None
    assert inflate.start(p)
    os.utime(p, ns=(1, 1))  # the same bytes, another modification time: not trusted either
    meta, evs = reader.read_all(p)
    assert len(evs) == 300
    assert inflate._AHEAD == {}


def test_a_damaged_file_fails_in_the_reader_as_a_user_error_naming_it(tmp_path):
    p = tmp_path / "t.json.gz"
    good = gzip.compress(_trace())
    p.write_bytes(good[: len(good) // 2])
    assert inflate.start(p)
    with pytest.raises(UserError, match=r"t\.json\.gz: is not a readable gzip file"):
        reader.read_all(p)


def test_only_a_gzipped_regular_file_is_read_ahead(tmp_path):
    plain = tmp_path / "t.json"
    plain.write_bytes(_trace(10))
    assert not inflate.start(plain)
    assert not inflate.start(tmp_path)
    assert not inflate.start(tmp_path / "missing.json.gz")
    assert inflate.take(plain, inflate.CHUNK) is None


def test_the_read_ahead_waits_bounded_and_an_untaken_one_ends_when_cancelled(tmp_path):
    p = tmp_path / "big.gz"
    p.write_bytes(gzip.compress(os.urandom(1 << 20)))
    assert inflate.start(p, n=1 << 14)  # 64 pieces: the thread waits with `depth` of them ready
    ra = inflate._AHEAD[os.path.realpath(p)]
    end = time.monotonic() + 5
    while not ra.q.full() and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)
    assert ra.q.qsize() == ra.q.maxsize == 2 and ra.thread.is_alive()
    inflate.cancel_all()
    ra.thread.join(5)
    assert not ra.thread.is_alive()


def test_a_reader_that_stops_early_ends_the_read_ahead(tmp_path):
    p = tmp_path / "big.gz"
    p.write_bytes(gzip.compress(_trace(200_000)))
    assert inflate.start(p)
    chunks = reader.TraceReader(p).chunks()
    next(chunks)
    chunks.close()  # the reader's source closes: its read-ahead is cancelled
    assert _no_inflate_threads()


def test_diagnose_on_a_gzipped_trace_takes_the_read_ahead_and_leaves_no_thread(tmp_path, capsys, monkeypatch):
    from trainperf.cli import main

    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace(2000)))
    started, orig = [], inflate.start

    def spy(path, n=inflate.CHUNK):
        started.append(orig(path, n))
        return started[-1]

    monkeypatch.setattr(inflate, "start", spy)
    assert main(["diagnose", str(p), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "trace"
    assert started == [True] and not inflate._AHEAD and _no_inflate_threads()



@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_forked_child_reads_the_file_itself_not_the_parents_read_ahead(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace(500)))
    assert inflate.start(p)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no read-ahead here (its thread is the parent's); reading must not wait for one
        try:
            ok = not inflate._AHEAD and inflate.take(p, inflate.CHUNK) is None and len(reader.read_all(p)[1]) == 500
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert inflate.take(p, inflate.CHUNK) is not None  # the parent's own is still there for it


def test_a_read_ahead_whose_thread_died_is_an_error_not_a_wait(tmp_path, monkeypatch):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace(100)))

    def dies(self):  # a thread that ends without its last piece (whatever the cause)
        return None

    monkeypatch.setattr(inflate.ReadAhead, "_run", dies)
    assert inflate.start(p)
    with pytest.raises(UserError, match=r"t\.json\.gz: is not a readable gzip file \(the read-ahead"):
        reader.read_all(p)


def test_an_unexpected_error_in_the_thread_reaches_the_reader(tmp_path, monkeypatch):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_trace(100)))

    def broken(f, n):
        raise ValueError("something unforeseen")
        yield b""  # pragma: no cover

    monkeypatch.setattr(inflate, "gunzip", broken)
    assert inflate.start(p)
    with pytest.raises(ValueError, match="something unforeseen"):
        reader.read_all(p)

"""The reader's own gzip inflater (large zlib calls, no GzipFile) reads what gzip reads and fails where it fails."""

from __future__ import annotations

import gzip
import json
import io
import os
import zlib

import pytest

from trainperf.errors import UserError
from trainperf.trace import inflate, reader

PAYLOAD = os.urandom(1 << 16).hex().encode() + b'{"a": 1}' * 50_000  # ~530 kB, partly compressible


@pytest.mark.parametrize("n", [1000, 1 << 16, 4 << 20])
@pytest.mark.parametrize("layout", ["one", "two members", "zero padding", "members and padding", "empty"])
def test_the_inflated_bytes_are_what_gzip_reads_in_pieces_of_n(layout, n):
    data = {"one": gzip.compress(PAYLOAD),
            "two members": gzip.compress(PAYLOAD[:1234]) + gzip.compress(PAYLOAD[1234:]),
            "zero padding": gzip.compress(PAYLOAD) + b"\0" * 3000,
            "members and padding": gzip.compress(PAYLOAD[:99]) + b"\0" * 7 + gzip.compress(PAYLOAD[99:]) + b"\0",
            "empty": gzip.compress(b"")}[layout]
    pieces = list(inflate.gunzip(io.BytesIO(data), n))
    assert b"".join(pieces) == gzip.decompress(data)
    assert all(len(p) == n for p in pieces[:-1]) and all(0 < len(p) <= n for p in pieces)


@pytest.mark.parametrize("damage", ["cut off", "bad crc", "garbage after", "bad deflate"])
def test_a_damaged_gzip_fails_as_gzip_does(damage):
    good = gzip.compress(PAYLOAD)
    data = {"cut off": good[:len(good) // 2],
            "bad crc": good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:],
            "garbage after": good + b"not gzip",
            "bad deflate": good[:10] + b"\xff" * 64 + good[74:]}[damage]
    with pytest.raises((OSError, EOFError, zlib.error)):
        gzip.decompress(data)
    with pytest.raises((OSError, EOFError, zlib.error)):
        b"".join(inflate.gunzip(io.BytesIO(data), 1 << 16))


def test_a_damaged_gzipped_trace_is_a_user_error_naming_the_file(tmp_path):
    p = tmp_path / "t.json.gz"
    good = gzip.compress(b'{"traceEvents": [' + b",".join([b'{"ph": "X", "ts": 1, "dur": 2}'] * 20000) + b"]}")
    p.write_bytes(good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:])
    with pytest.raises(UserError, match=r"t\.json\.gz: is not a readable gzip file"):
        reader.read_all(p)
    p.write_bytes(good)
    meta, evs = reader.read_all(p)
    assert len(evs) == 20000


def _tricky_trace(n: int = 3000) -> bytes:
    """Events whose strings and nested lists hold false boundaries, with varied whitespace, a value to repair
    (a bare NaN) and the keys Kineto writes after the array."""
    evs = []
    for i in range(n):
        name = f'op {i} }},{{ "x": [{{}}, {{}}]' if i % 7 == 0 else f"op{i}"
        args = {"External id": i, "stream": 7, "Input Dims": [[1, 2], [{"a": 1}]] if i % 5 == 0 else []}
        evs.append(json.dumps({"ph": "X", "cat": "kernel" if i % 2 else "cpu_op", "name": name, "pid": 1,
                               "tid": 2, "ts": 1000.5 + i, "dur": 3 + i % 4, "args": args},
                              separators=(",", ":") if i % 3 else (", ", ": ")))
    evs[11] = evs[11].replace('"dur":', '"occ": NaN, "dur":') if '"dur":' in evs[11] else evs[11]
    body = ",\n ".join(evs)
    return ('{"schemaVersion": 1, "traceEvents": [\n ' + body + '\n], "displayTimeUnit": "ms", '
            '"baseTimeNanoseconds": 1700000000000000000}').encode()


@pytest.mark.parametrize("chunk", [97, 4096, 1 << 20])
@pytest.mark.parametrize("gz", [False, True])
def test_events_read_in_any_chunking_are_the_documents_events(tmp_path, monkeypatch, chunk, gz):
    data = _tricky_trace()
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    monkeypatch.setattr(reader, "CHUNK", chunk)
    meta, evs = reader.read_all(p)
    want = json.loads(data.replace(b"NaN", b"null"))
    assert meta == {k: v for k, v in want.items() if k != "traceEvents"}
    assert [(e.name, e.ts, e.dur, e.args.ext) for e in evs] == \
        [(w["name"], w["ts"], w["dur"], w["args"]["External id"]) for w in want["traceEvents"]]

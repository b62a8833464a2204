"""Stream the events out of a Chrome-trace file (torch.profiler / Kineto), in bounded memory.

A trace is one JSON object ``{..., "traceEvents": [ev, ev, ...], ...}`` (or a bare array of events), plain
or gzipped (recognised by its magic bytes, not its name). The whole document is never held in memory:

1. the decompressed bytes are read ``CHUNK`` at a time;
2. in each buffer the last event boundary (``}`` ``,`` ``{`` with any whitespace between) is found with a
   byte regex; whatever precedes it is a run of whole events, decoded at C speed by ``msgspec`` into typed
   structs (:class:`Event`, :class:`Args`: only the fields the figures read; every other key is skipped by
   the decoder, never built as a Python object); the rest waits for the next read;
3. a boundary can be a false one (``},{`` inside a string or inside an event's nested list): then the
   piece does not decode (it ends inside a string or an open object, which a JSON decoder always rejects),
   and the previous boundary is tried; after a few misses the buffer is split by a scanner that tracks
   strings and depth (slower, exact);
4. the keys before ``traceEvents`` are decoded on their own, and at the end of the file the last events with
   whatever follows the array (``displayTimeUnit``, ``baseTimeNanoseconds``... Kineto writes some there).

Memory is the buffer (a few MB) plus one chunk's structs; time is the gzip inflate plus the decode, which
``benchmarks/trace_parsers.py`` measured against json / orjson / msgspec-whole / ijson (see the notes).

What torch itself has written wrong is read as the TensorBoard plugin reads it (its ``_preprocess_file``):
a run that does not decode is decoded again after :func:`repair` (raw control characters in strings, an
unquoted ``N/A`` value, a bare ``NaN`` / ``Infinity`` / ``nan``, bytes that are not UTF-8); a UTF-8
byte-order mark at the start is skipped. The repair runs only on a piece that failed, so a well-formed
trace never pays for it.

Any file that is not such a trace (not gzip nor JSON, cut off, no ``traceEvents``, binary) raises
:class:`~trainperf.errors.UserError` naming the file and what to do; valid JSON that is some other document
(no ``traceEvents``: an execution trace, a config) raises its subclass :class:`NotATrace`.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from trainperf.errors import UserError
from trainperf.trace import inflate
from trainperf.trace.inflate import CHUNK  # noqa: F401 - decompressed bytes read at a time

try:
    import msgspec
except ImportError as exc:  # pragma: no cover - a declared dependency
    raise ImportError("trainperf's trace reader needs msgspec (a dependency of trainperf): "
                      "pip install 'msgspec>=0.18'") from exc

MAX_EVENT = 256 << 20  # one event (or the metadata before traceEvents) larger than this is not a trace
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# a string (one the buffer cuts off runs to the buffer's end: no brace inside it is structure), or a bracket
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[{}\[\]]', re.S)
Num = Union[int, float, None]
Scalar = Union[int, float, str, None]


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    """The ``args`` of an event that the figures read (others are skipped by the decoder). Scalars only, so
    never in a reference cycle: not tracked by the garbage collector (``gc=False``), whose passes over
    every decoded event were ~10% of reading a trace."""
    ext: Scalar = msgspec.field(default=None, name="External id")
    ext18: Scalar = msgspec.field(default=None, name="external id")  # 1.8-era spelling
    corr: Scalar = msgspec.field(default=None, name="correlation")
    stream: Scalar = None
    device: Scalar = None
    nbytes: Scalar = msgspec.field(default=None, name="bytes")
    occ: Scalar = msgspec.field(default=None, name="est. achieved occupancy %")
    bps: Scalar = msgspec.field(default=None, name="blocks per SM")
    coll: Scalar = msgspec.field(default=None, name="Collective name")
    pg: Scalar = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Scalar = msgspec.field(default=None, name="Process Group Description")


class Event(msgspec.Struct, gc=False):
    """One trace event: the fields the figures read (scalars and an :class:`Args`: untracked, as it)."""
    ph: Optional[str] = None
    cat: Optional[str] = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: Optional[Args] = None


_CONTROL = bytes.maketrans(bytes(range(32)), b" " * 32)  # raw control bytes -> a space
_NA = re.compile(rb'([:,\[]\s*)N/A(?=\s*[,}\]])')  # an unquoted N/A value (Kineto wrote some)
# a non-finite number as Python's json.dump (NaN, Infinity) or C's printf (nan, inf) writes it: not JSON
_NONFINITE = re.compile(rb'([:,\[]\s*)[-+]?(?:NaN|nan|Infinity|inf)(?=\s*[,}\]])')
_BOM = b"\xef\xbb\xbf"


def repair(data: bytes) -> bytes | None:
    """``data`` with what torch has written wrong made valid JSON (raw control characters in strings -> a
    space, an unquoted ``N/A`` value -> ``"N/A"``, a non-finite number written bare (``NaN``, ``Infinity``,
    ``nan``, ``-inf``: Python's json and C's printf write them) -> ``null``, bytes that are not UTF-8 ->
    U+FFFD); None if nothing changed. Only ever applied to a piece that did not decode."""
    out = _NA.sub(rb'\1"N/A"', data.translate(_CONTROL))
    out = _NONFINITE.sub(rb'\1null', out)
    try:
        out.decode("utf-8")
    except UnicodeDecodeError:
        out = out.decode("utf-8", "replace").encode("utf-8")
    return None if out == data else out


def _decode(decoder, data: bytes):
    """``decoder.decode(data)``; JSON that does not decode is decoded again after :func:`repair` (the first
    error if that fails too; a ValidationError, the JSON being valid, as it is)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        fixed = repair(data)
        if fixed is None:
            raise
        try:
            return decoder.decode(fixed)
        except msgspec.ValidationError:
            raise  # valid once repaired, with unexpected types: the caller's lenient path
        except msgspec.DecodeError:
            raise exc from None


_EVENTS = msgspec.json.Decoder(list[Event])
_RAW = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


class NotATrace(UserError):
    """Valid JSON, but another document than a profiler trace (no ``traceEvents``); ``what`` says which."""

    what = ""


def _bad(path: Path, what: str, cls: type[UserError] = UserError) -> UserError:
    exc = cls(f"{path}: {what}. Pass a torch.profiler trace (the Chrome-trace JSON that "
              "torch.profiler.tensorboard_trace_handler or prof.export_chrome_trace writes, .json or "
              ".json.gz); if it was cut off (a job killed while writing it), profile again")
    exc.what = what
    return exc


class _Source:
    """Decompressed bytes of a file, ``read(n)`` at a time; ``progress(compressed bytes consumed)``."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None):
        self.path = path
        try:
            self.f = open(path, "rb")
        except OSError as exc:
            raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); check the path and its "
                            "permissions") from exc
        head = self.f.read(2)
        self.f.seek(0)
        self.gz = head == b"\x1f\x8b"
        self._pieces = None  # a gzipped file's pieces (inflate.gunzip or a read-ahead), once reading
        self._ahead = None
        self.progress = progress
        self.eof = False

    def read(self, n: int) -> bytes:
        pos = None
        if not self.gz:
            b = self.f.read(n)
        else:
            if self._pieces is None:
                self._ahead = inflate.take(self.path, n)  # inflated on another core since the command began
                self._pieces = self._ahead.pieces() if self._ahead is not None else \
                    ((p, self.f.tell()) for p in inflate.gunzip(self.f, n))
            try:
                b, pos = next(self._pieces, (b"", None))
            except (OSError, EOFError, zlib.error) as exc:
                raise _bad(self.path, f"is not a readable gzip file ({exc})") from exc
        if self.progress is not None:
            try:
                self.progress(self.f.tell() if pos is None else pos)
            except (OSError, ValueError):
                pass
        if not b:
            self.eof = True
        return b

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.cancel()
        self.f.close()


def _decode_run(buf: bytearray, cut: int) -> list[Event] | None:
    """The events in ``buf[1:cut]`` (``buf[0]`` is the byte before the first, ``buf[cut - 1]`` the ``}`` of the
    last), decoded in place: the two bytes around the run become ``[`` and ``]`` for the decode and are put
    back, so no copy of the megabytes is made (in a fresh process each copy also faults its pages in).
    Anything but a clean decode goes to :func:`_decode_events` (repair, the lenient path, None)."""
    first, last = buf[0], buf[cut]
    buf[0], buf[cut] = 0x5B, 0x5D  # [ ]
    try:
        with memoryview(buf) as mv, mv[:cut + 1] as run:
            return _EVENTS.decode(run)
    except msgspec.MsgspecError:
        pass
    finally:
        buf[0], buf[cut] = first, last
    return _decode_events(bytes(buf[1:cut]))


def _decode_events(piece: bytes) -> list[Event] | None:
    """A run of whole events (``ev, ev, ev``) -> structs; None if ``piece`` is not exactly that."""
    try:
        return _decode(_EVENTS, b"[" + piece + b"]")
    except msgspec.ValidationError:
        return _lenient(piece)
    except msgspec.DecodeError:
        return None


def _lenient(piece: bytes) -> list[Event] | None:
    """Events whose fields have unexpected types (a string ts, a list as stream...): decoded untyped and
    converted field by field; a field of the wrong kind is dropped, never the event."""
    try:
        raw = _decode(_ANY, b"[" + piece + b"]")
    except msgspec.DecodeError:
        return None
    out = []
    for d in raw:
        if not isinstance(d, dict):
            raise _NotEvents(f"traceEvents holds a {type(d).__name__} ({str(d)[:40]!r}) where an event object "
                             "belongs")
        out.append(event_from_dict(d))
    return out


class _NotEvents(ValueError):
    """The events array holds something other than event objects."""


def _scalar(v: Any) -> Scalar:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    return v


def event_from_dict(d: dict) -> Event:
    """An :class:`Event` from a plain dict (the lenient path, and the generator's tests)."""
    a = d.get("args")
    args = None
    if isinstance(a, dict):
        args = Args(**{f: _scalar(a.get(k)) for f, k in _ARG_KEYS.items()})
    return Event(ph=d.get("ph") if isinstance(d.get("ph"), str) else None,
                 cat=d.get("cat") if isinstance(d.get("cat"), str) else None,
                 name=_scalar(d.get("name")), pid=_scalar(d.get("pid")), tid=_scalar(d.get("tid")),
                 ts=_scalar(d.get("ts")), dur=_scalar(d.get("dur")), args=args)


_ARG_KEYS = {f: (Args.__struct_encode_fields__[i]) for i, f in enumerate(Args.__struct_fields__)}


def _structural_cut(buf: bytes, start: int) -> int:
    """The end (exclusive) of the last whole event in ``buf[start:]`` found by tracking strings and depth
    (the exact, slower split for buffers whose fast boundaries all fail); -1 if none."""
    depth = 0
    last = -1
    for m in _TOKEN.finditer(buf, start):
        t = m.group()
        c = t[:1]
        if c == b"{" or c == b"[":
            depth += 1
        elif c == b"}" or c == b"]":
            depth -= 1
            if depth == 0 and c == b"}":
                last = m.end()
            elif depth < 0:
                break  # the end of the traceEvents array
    return last


def _wide_encoding(head: bytes) -> str | None:
    """UTF-32 or UTF-16 (with or without a byte-order mark) at the start of a file, else None: JSON is ASCII
    there, so the zero bytes between its characters tell the width and the byte order."""
    if head[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return "UTF-32"
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16"
    h = head[:16]
    if len(h) < 8 or not h.count(0):
        return None
    zero = lambda part: not any(part)  # noqa: E731
    if zero(h[1::4]) and zero(h[2::4]) and zero(h[3::4]):
        return "UTF-32LE"
    if zero(h[0::4]) and zero(h[1::4]) and zero(h[2::4]):
        return "UTF-32BE"
    if zero(h[1::2]):
        return "UTF-16LE"
    if zero(h[0::2]):
        return "UTF-16BE"
    return None


class TraceReader:
    """``meta`` (every top-level key but ``traceEvents``, complete once :meth:`chunks` is exhausted) and
    :meth:`chunks`: the events in file order, as lists of :class:`Event`."""

    def __init__(self, path: str | Path, progress: Callable[[int], None] | None = None):
        self.path = Path(path)
        self.progress = progress
        self.meta: dict[str, Any] = {}
        self.events = 0
        self.bare = False  # the file is a bare JSON array of events (no traceEvents key)

    def chunks(self) -> Iterator[list[Event]]:
        src = _Source(self.path, self.progress)
        try:
            yield from self._chunks(src)
        except _NotEvents as exc:  # valid JSON of another kind (a directory reader skips it, with a note)
            msg = str(exc)
            if self.bare:  # a top-level array of lists: torch's export_memory_timeline writes one
                msg = msg.replace("traceEvents holds", "its top-level JSON array holds") + \
                    " (a JSON array of arrays, as export_memory_timeline writes, is not a trace)"
            raise _bad(self.path, f"is not a profiler trace: {msg}", NotATrace) from exc
        except RecursionError as exc:
            raise _bad(self.path, "nests JSON too deeply") from exc
        finally:
            src.close()

    def _fill(self, src: _Source, buf: bytes) -> bytes:
        b = src.read(CHUNK)
        return buf + b if b else buf

    def _chunks(self, src: _Source) -> Iterator[list[Event]]:
        path = self.path
        buf = self._fill(src, b"")
        if buf.startswith(_BOM):
            buf = buf[len(_BOM):]
        lead = buf.lstrip()
        while not lead and not src.eof:
            buf = self._fill(src, buf)
            lead = buf.lstrip()
        if not lead:
            raise _bad(path, "is empty")
        enc = _wide_encoding(buf)
        if enc:
            raise _bad(path, f"is {enc} text, where torch writes UTF-8: convert it (iconv -f {enc} -t UTF-8)")
        if lead[:1] not in (b"{", b"["):
            raise _bad(path, "is not JSON (it does not start with '{' or '[')" if not src.gz else
                       "holds no JSON once decompressed")
        if lead[:1] == b"[":  # a bare array of events (the Chrome format's "JSON Array")
            bare = self.bare = True
            pos = len(buf) - len(lead) + 1
        else:
            bare = False
            m = _KEY.search(buf)
            while m is None and not src.eof and len(buf) < MAX_EVENT:
                buf = self._fill(src, buf)
                m = _KEY.search(buf)
            if m is None:
                self._no_events(buf, src)
            head = buf[:m.start()].rstrip()
            if head.endswith(b","):
                head = head[:-1]
            try:
                self.meta.update(_decode(_ANY, head + b"}"))
            except (msgspec.DecodeError, TypeError) as exc:
                raise _bad(path, f"has a malformed header before traceEvents ({exc})") from exc
            pos = m.end()
        # buf: a bytearray whose first byte is the one before its first event (the array's "[", then the ","
        # after the last event decoded), so that a run of events decodes in place (see _decode_run)
        buf = bytearray(buf[pos - 1:])
        # decode what is there, then read on; at the end of the file, the rest (the last events and what follows
        # the array) goes to _tail
        while not src.eof:
            cut = self._cut(buf)
            if cut > 0:
                evs = _decode_run(buf, cut)
                if evs is None:  # a false boundary: the earlier ones, then the exact scanner
                    cut, evs = self._retry(bytes(buf[1:]), cut - 1)
                    cut += 1
                if evs is not None:  # else no whole event yet: read more
                    self.events += len(evs)
                    del buf[:buf.index(b",", cut)]  # O(1) at the front of a bytearray; the "," stays first
                    if evs:
                        yield evs
            elif len(buf) > MAX_EVENT:
                raise _bad(path, f"has an event larger than {MAX_EVENT >> 20} MB, or no event boundaries")
            buf += src.read(CHUNK)
        buf = bytes(buf[1:])
        yield from self._tail(buf, bare)

    def _cut(self, buf: bytes) -> int:
        """The index just after the ``}`` that ends the last event before a boundary in ``buf``; -1."""
        span = 1 << 16
        while True:
            lo = max(0, len(buf) - span)
            last = None
            for last in _BOUNDARY.finditer(buf, lo):
                pass
            if last is not None:
                return last.start() + 1
            if lo == 0:
                return -1
            span *= 4

    def _retry(self, buf: bytes, cut: int) -> tuple[int, list[Event] | None]:
        """The fast boundary at ``cut`` was false: try earlier ones, then the exact scanner."""
        for _ in range(8):
            m = None
            for m in _BOUNDARY.finditer(buf, max(0, cut - (1 << 16)), cut - 1):
                pass
            if m is None:
                break
            cut = m.start() + 1
            evs = _decode_events(buf[:cut])
            if evs is not None:
                return cut, evs
        cut = _structural_cut(buf, 0)
        if cut <= 0:
            return -1, None
        # the scanner may stop at the array's end: the decoded run must then be the whole array
        evs = _decode_events(buf[:cut])
        if evs is None:
            raise _bad(self.path, "is not valid JSON inside traceEvents")
        nxt = buf[cut:].lstrip()
        if nxt[:1] != b",":
            return -1, None  # the last event: it goes with the tail
        return cut, evs

    def _tail(self, buf: bytes, bare: bool) -> Iterator[list[Event]]:
        path = self.path
        if bare:
            try:
                evs = _decode(_EVENTS, b"[" + buf)
            except msgspec.ValidationError:
                evs = _lenient(buf.rstrip()[:-1]) if buf.rstrip().endswith(b"]") else None
            except msgspec.DecodeError as exc:
                raise _bad(path, f"is cut off or not valid JSON near its end ({exc})") from exc
            if evs is None:
                raise _bad(path, "is cut off or not valid JSON near its end")
            self.events += len(evs)
            if evs:
                yield evs
            return
        doc = b'{"traceEvents":[' + buf
        try:
            rest = _decode(_RAW, doc)
        except msgspec.DecodeError as exc:
            raise _bad(path, f"is cut off or not valid JSON near its end ({exc})") from exc
        raw_events = rest.pop("traceEvents")
        for k, v in rest.items():
            try:
                self.meta[k] = _ANY.decode(v)
            except msgspec.DecodeError:  # pragma: no cover - Raw came from a valid document
                pass
        evs = _decode_events(bytes(raw_events)[1:-1]) if len(raw_events) > 2 else []
        if evs is None:
            raise _bad(path, "has a malformed traceEvents array")
        self.events += len(evs)
        if evs:
            yield evs

    def _no_events(self, buf: bytes, src: _Source):
        if src.eof:
            try:
                doc = _ANY.decode(buf)
            except msgspec.DecodeError as exc:
                raise _bad(self.path, f"is not valid JSON ({exc})") from exc
            if isinstance(doc, dict):
                keys = ", ".join(sorted(map(str, doc))[:6]) or "none"
                if {"nodes", "schema"} <= set(doc):
                    raise _bad(self.path, f"is a PyTorch execution trace (ExecutionTraceObserver; its keys: "
                                          f"{keys}), not a profiler trace: pass the profiler trace recorded "
                                          "with it", NotATrace)
                raise _bad(self.path, f"is JSON without a traceEvents list (its keys: {keys}): not a "
                                      "profiler trace", NotATrace)
        raise _bad(self.path, "has no traceEvents list")


def read_all(path: str | Path) -> tuple[dict, list[Event]]:
    """(meta, every event): for tests and small files only."""
    r = TraceReader(path)
    evs: list[Event] = []
    for c in r.chunks():
        evs.extend(c)
    return r.meta, evs


__all__ = ["Args", "CHUNK", "Event", "NotATrace", "TraceReader", "event_from_dict", "read_all", "repair"]

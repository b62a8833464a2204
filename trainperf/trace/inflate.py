"""Gzip inflation for the trace reader, and a read-ahead that inflates a trace on a second core while the
command is still importing.

Nothing here imports numpy, msgspec or torch: ``trainperf diagnose FILE.json.gz`` calls :func:`start` before it
imports the analysis (numpy, msgspec and trainperf's modules: ~0.1 s of a fresh process), so the file is read
and inflated meanwhile. zlib releases the GIL while it inflates, so the two overlap on two cores; the thread
needs the GIL only between its zlib calls (a few per 4 MB piece).

The read-ahead is bounded (at most ``depth`` pieces of ``n`` bytes wait: 8 MB by default) and is used only by
a reader of the same file, unchanged since (same device, inode, size and modification time); any other reader
inflates the file itself. An error of the file (not gzip, cut off, a bad CRC) is raised in the reader, as if it
had inflated the file itself.
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from typing import Iterator

CHUNK = 4 << 20  # decompressed bytes the reader takes at a time
_MEMBER_INPUT = 1 << 20  # compressed bytes handed to zlib at a time


def gunzip(f, n: int) -> Iterator[bytes]:
    """The decompressed bytes of gzip file ``f``, ``n`` at a time (the last piece shorter), as
    :class:`gzip.GzipFile` reads them (every member; zero padding after one skipped; each member's CRC and
    length checked by zlib), in large calls to zlib: a third faster than ``GzipFile.read`` on a 10 MB trace,
    whose 8 kB reads and second CRC pass in Python it skips."""
    d = zlib.decompressobj(31)
    between = False  # after a member's end: zero padding, another member or the end
    data = b""
    out: list[bytes] = []
    size = 0
    while True:
        if not data:
            data = f.read(_MEMBER_INPUT)
            if not data:
                if not between and not d.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                break
        if between:
            data = data.lstrip(b"\0")
            if not data:
                continue
            if not data.startswith(b"\x1f\x8b"[:len(data)]):
                raise OSError("Not a gzipped file: bytes after the last gzip member")
            d, between = zlib.decompressobj(31), False
        piece = d.decompress(data, n - size)
        data = d.unconsumed_tail
        if piece:
            out.append(piece)
            size += len(piece)
        if d.eof:
            data, between = d.unused_data, True
        if size >= n:
            yield b"".join(out)
            out, size = [], 0
    if out:
        yield b"".join(out)


def _identity(path) -> tuple | None:
    """What a read-ahead is matched on: the file's real path and its device, inode, size and mtime."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class ReadAhead:
    """One gzipped file inflated in a daemon thread, at most ``depth`` pieces of ``n`` bytes ahead of its
    reader (:meth:`pieces`). :meth:`cancel` ends the thread within ~0.1 s; it closes the file."""

    def __init__(self, path: str, identity: tuple, n: int = CHUNK, depth: int = 2):
        self.path, self.identity, self.n = path, identity, n
        self.pid = os.getpid()  # a forked child has the object but not the thread
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trainperf-inflate", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with open(self.path, "rb") as f:
                for piece in gunzip(f, self.n):
                    if not self._put((piece, f.tell())):
                        return
                self._put((b"", f.tell()))
        except Exception as exc:  # noqa: BLE001 - handed over: the reader raises it, as its own
            self._put(exc)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pieces(self) -> Iterator[tuple[bytes, int]]:
        """``(decompressed piece, compressed bytes consumed so far)`` in order, ``b""`` last."""
        while True:
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                if not self.thread.is_alive() and self.q.empty():  # never a wait on a thread that is gone
                    raise OSError("the read-ahead of this file ended without its last piece") from None
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            if not item[0]:
                return

    def cancel(self) -> None:
        self._stop.set()


_AHEAD: dict[str, ReadAhead] = {}


def start(path, n: int = CHUNK) -> bool:
    """Start inflating ``path`` ahead of its reader when it is a gzipped regular file (else nothing)."""
    ident = _identity(path)
    if ident is None:
        return False
    real = ident[0]
    try:
        if not os.path.isfile(real):
            return False
        with open(real, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return False
    except OSError:
        return False
    old = _AHEAD.pop(real, None)
    if old is not None:
        old.cancel()
    _AHEAD[real] = ReadAhead(real, ident, n)
    return True


def take(path, n: int) -> ReadAhead | None:
    """The read-ahead of ``path`` in pieces of ``n`` bytes, if one was started and the file is unchanged
    since; it is handed out once."""
    if not _AHEAD:
        return None
    ident = _identity(path)
    if ident is None:
        return None
    ra = _AHEAD.pop(ident[0], None)
    if ra is None:
        return None
    if ra.identity != ident or ra.n != n or ra.pid != os.getpid():
        ra.cancel()
        return None
    return ra


def cancel_all() -> None:
    """End every read-ahead nobody took (the command failed, or read the file another way)."""
    while _AHEAD:
        _, ra = _AHEAD.popitem()
        ra.cancel()


def _forget() -> None:
    """In a forked child (a pool's worker): the read-aheads are the parent's, their threads are not here."""
    _AHEAD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)

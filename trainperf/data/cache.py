"""Disk cache tier: samples read from slow storage, kept on a local disk.

Layout: ``<dir>/<namespace>/<index // 4096>/<index>.e`` where the namespace is
the source's fingerprint (a changed source never serves stale entries). Each entry is a 24-byte header (magic, payload
length, CRC32 of the payload) and the payload (dtype, shape, bytes).

* **Atomic writes**: an entry is written to a temporary name and renamed, so a
  reader sees a whole entry or none.
* **Checksummed reads**: a wrong magic, length or CRC (a corrupt or truncated
  entry) drops the entry and counts it; the caller fetches the sample again.
* **Bounded LRU**: a hit refreshes the entry's mtime; when the bytes in the
  directory pass ``max_bytes`` the oldest entries are deleted down to 90%.
* **Shared by the processes of a node**: the running total lives in the first
  8 bytes of ``<dir>/.lock``, updated under ``flock`` on that file (held for
  microseconds, the rename or unlink it counts included, so another process's
  rescan never falls between the two); eviction rescans the directory under the
  same lock and resets the total to the truth, so drift from crashes heals itself. The
  files themselves are the index: there is no index file to corrupt.
* **Survives restarts**: entries and the total persist.
* **Disk full or unwritable**: one warning, then the run goes on uncached.
"""

from __future__ import annotations

import errno
import fcntl
import os
import queue
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np

MAGIC = b"TPC1"
HEADER = struct.Struct("<4sxxxxQI4x")  # magic, payload length, crc32 -> 24 bytes
LOW_WATERMARK = 0.9
STALE_TMP_S = 600.0
TOUCH_S = 60.0  # LRU resolution: a hit refreshes an entry's mtime at most once a minute
WRITER_THREADS = 2  # file creation and rename wait on the filesystem, not the CPU
WRITE_BUFFER_BYTES = 64 * 2**20  # entries queued for writing, per process


def encode_entry(arr: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(arr)
    dt = arr.dtype.str.encode()
    meta = struct.pack("<B", len(dt)) + dt + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}q", *arr.shape)
    payload = meta + arr.tobytes()
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_entry(blob: bytes) -> np.ndarray | None:
    """The array in ``blob``, or None when the entry is corrupt or truncated."""
    if len(blob) < HEADER.size:
        return None
    magic, length, crc = HEADER.unpack_from(blob)
    payload = memoryview(blob)[HEADER.size:]
    if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
        return None
    try:
        n = payload[0]
        dt = np.dtype(bytes(payload[1:1 + n]).decode())
        if dt.kind not in "biufc" or dt.hasobject:  # samples are numbers; anything else is corruption
            return None
        ndim = payload[1 + n]
        shape = struct.unpack_from(f"<{ndim}q", payload, 2 + n)
        data = payload[2 + n + 8 * ndim:]
        return np.frombuffer(data, dtype=dt).reshape(shape)
    except (ValueError, TypeError, IndexError, struct.error):  # cut or garbled metadata
        return None


class DiskCache:
    """A bounded, checksummed, multi-process-safe disk cache of numpy samples."""

    def __init__(self, directory: str, max_bytes: int, namespace: str = "default"):
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self.ns = namespace
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "corrupt": 0, "puts": 0, "put_errors": 0, "puts_dropped": 0,
                      "bytes_written": 0}
        self.warnings: list[str] = []  # first message of each problem, for the owner to show once
        self.readable = True
        self.writable = True
        self._tlock = threading.Lock()
        self._fd_pid: tuple[int, int] | None = None
        self._writer = None  # (queue, pid, threads) of the write-behind threads
        self._pending: dict[int, np.ndarray] = {}  # queued for writing; readable meanwhile
        self._pending_bytes = 0
        try:
            (self.dir / self.ns).mkdir(parents=True, exist_ok=True)
            fd = self._lock_fd()
            with self._locked(fd):
                if self._read_usage() < 0:  # a new directory (or an old one without a total)
                    self._rescan_locked(evict=False)
        except OSError as exc:
            self._disable(exc, "open")
            if not (self.dir / self.ns).is_dir():
                self.readable = False

    # -- locking -----------------------------------------------------------------------------
    def _lock_fd(self) -> int:
        """A lock file descriptor of this process (reopened after fork: flock is per open file)."""
        pid = os.getpid()
        if self._fd_pid is None or self._fd_pid[1] != pid:
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
            self._fd_pid = (fd, pid)
        return self._fd_pid[0]

    class _locked:
        def __init__(self, fd: int):
            self.fd = fd

        def __enter__(self):
            fcntl.flock(self.fd, fcntl.LOCK_EX)

        def __exit__(self, *exc):
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _read_usage(self) -> int:
        try:
            raw = os.pread(self._lock_fd(), 8, 0)
            return struct.unpack("<q", raw)[0] if len(raw) == 8 else -1
        except (OSError, struct.error):
            return -1

    def _write_usage(self, value: int) -> None:
        os.pwrite(self._lock_fd(), struct.pack("<q", max(0, int(value))), 0)

    def _add_usage(self, delta: int, change=None) -> int:
        """Add ``delta`` to the total. ``change`` (the rename or unlink on disk that ``delta`` counts; it
        returns a correction: minus the bytes of an entry it replaced) runs under the same lock, so an
        eviction's rescan in another process never counts it between the disk and the total."""
        with self._tlock, self._locked(self._lock_fd()):
            if change is not None:
                delta += change()
            total = self._read_usage()
            if total < 0:  # never counted: count now (the change included)
                total = self._rescan_locked(evict=False, count_only=True)
            else:
                total += delta
            self._write_usage(total)
            return total

    # -- entries -----------------------------------------------------------------------------
    def path(self, index: int) -> Path:
        return self.dir / self.ns / f"{index >> 12:05x}" / f"{index}.e"  # 4096 neighbours per directory

    def get(self, index: int) -> np.ndarray | None:
        """The cached sample, or None (a miss; a corrupt entry is deleted and counted)."""
        if not self.readable:
            return None
        arr = self._pending.get(index)
        if arr is not None:  # written behind, not on disk yet
            self.stats["hits"] += 1
            return arr
        p = self.path(int(index))
        try:
            with open(p, "rb") as f:
                blob = f.read()
        except OSError:
            self.stats["misses"] += 1
            return None
        arr = decode_entry(blob)
        if arr is None:
            self.stats["corrupt"] += 1
            self.stats["misses"] += 1
            try:
                if self.writable:
                    self._add_usage(-len(blob), change=lambda: (os.unlink(p), 0)[1])
                else:
                    os.unlink(p)
            except OSError:
                pass
            return None
        self.stats["hits"] += 1
        try:
            if time.time() - os.stat(p).st_mtime > TOUCH_S:
                os.utime(p)  # LRU: most recently used (to TOUCH_S seconds: saves an inode write per hit)
        except OSError:
            pass
        return arr

    def put_async(self, index: int, arr: np.ndarray) -> None:
        """Write behind: queue the entry for writer threads so a read never waits for a cache write.
        Queued entries are served by ``get`` from memory until written. When the write buffer
        (``WRITE_BUFFER_BYTES``) is full the entry is not cached (counted as ``puts_dropped``)."""
        if not self.writable or index in self._pending:
            return
        pid = os.getpid()
        if self._writer is None or self._writer[1] != pid:  # first use in this process (or after fork)
            self._pending.clear()
            self._pending_bytes = 0
            q: queue.Queue = queue.Queue()
            threads = [threading.Thread(target=self._write_loop, args=(q,), daemon=True,
                                        name="trainperf-cache-writer") for _ in range(WRITER_THREADS)]
            self._writer = (q, pid, threads)
            for t in threads:
                t.start()
        with self._tlock:
            if self._pending_bytes + arr.nbytes > WRITE_BUFFER_BYTES:
                self.stats["puts_dropped"] += 1
                return
            self._pending_bytes += arr.nbytes
            self._pending[index] = arr
        self._writer[0].put(index)

    def _write_loop(self, q: queue.Queue) -> None:
        while True:
            index = q.get()
            if index is None:
                return
            arr = self._pending.get(index)
            if arr is not None:
                self.put(index, arr)
                with self._tlock:
                    self._pending.pop(index, None)
                    self._pending_bytes -= arr.nbytes

    def flush(self, timeout: float = 10.0) -> None:
        """Finish the queued writes (at most ``timeout`` seconds) and stop the writer threads."""
        if self._writer is not None and self._writer[1] == os.getpid():
            q, _pid, threads = self._writer
            for _ in threads:
                q.put(None)
            deadline = time.monotonic() + timeout
            for t in threads:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
            self._writer = None

    def put(self, index: int, arr: np.ndarray) -> bool:
        """Write an entry now (atomic rename); evict least recently used entries past the bound."""
        if not self.writable:
            return False
        blob = encode_entry(arr)
        if len(blob) > self.max_bytes:
            return False
        p = self.path(int(index))
        tmp = p.with_name(f".{p.name}.tmp{os.getpid()}.{threading.get_ident()}")
        try:
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:
                p.parent.mkdir(exist_ok=True)
                f = open(tmp, "wb")
            with f:
                f.write(blob)

            def rename() -> int:  # atomic: readers see the whole entry or none
                try:
                    old = os.stat(p).st_size  # the same sample cached by another process: replaced
                except OSError:
                    old = 0
                os.replace(tmp, p)
                return -old

            total = self._add_usage(len(blob), change=rename)
        except OSError as exc:
            self.stats["put_errors"] += 1
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._disable(exc, "write")
            return False
        self.stats["puts"] += 1
        self.stats["bytes_written"] += len(blob)
        if total > self.max_bytes:
            self.evict()
        return True

    def evict(self) -> int:
        """Delete least recently used entries until the directory holds <= 90% of max_bytes."""
        with self._tlock, self._locked(self._lock_fd()):
            return self._rescan_locked(evict=True)

    def _rescan_locked(self, evict: bool, count_only: bool = False) -> int:
        entries = []
        now = time.time()
        for root, _dirs, files in os.walk(self.dir):
            for name in files:
                full = os.path.join(root, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                if name.endswith(".e") and not name.startswith("."):
                    entries.append((st.st_mtime, st.st_size, full))
                elif ".tmp" in name and now - st.st_mtime > STALE_TMP_S:  # left by a crashed writer
                    try:
                        os.unlink(full)
                    except OSError:
                        pass
        total = sum(e[1] for e in entries)
        removed = 0
        if evict and total > self.max_bytes * LOW_WATERMARK:
            entries.sort()
            for _mtime, size, full in entries:
                if total <= self.max_bytes * LOW_WATERMARK:
                    break
                try:
                    os.unlink(full)
                except OSError:
                    continue
                total -= size
                removed += 1
        self.stats["evictions"] += removed
        if count_only:
            return total
        self._write_usage(total)
        return removed

    def usage(self) -> int:
        """Bytes of entries in the directory (all processes), as counted."""
        with self._tlock, self._locked(self._lock_fd()):
            return max(0, self._read_usage())

    # -- failure -----------------------------------------------------------------------------
    def _disable(self, exc: OSError, what: str) -> None:
        if not self.writable:
            return
        self.writable = False
        reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EROFS: "the filesystem is read-only", errno.EACCES: "permission denied",
                  errno.EPERM: "permission denied"}.get(exc.errno, f"{type(exc).__name__}: {exc}")
        self.warnings.append(
            f"data cache {self.dir}: cannot {what} ({reason}); continuing without caching new samples "
            "(nothing is lost; reads go to the source). Free space or set data.cache.dir to a writable disk."
        )

"""The numeric columns the trace reader fills (:class:`trainperf.trace.timeline.Collector`): values as numpy
types, leniently (a corrupt value: NaN or -1, never an exception), and a column that grows in place without a
Python object per event."""

from __future__ import annotations

import mmap
import re
import sys
from typing import Any

import numpy as np


def _floats(values: list) -> np.ndarray:
    """Numbers as float64; anything else (text, None, an integer beyond float64's range): NaN."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values))
        for i, v in enumerate(values):
            try:
                out[i] = float(v)
            except (TypeError, ValueError, OverflowError):
                out[i] = np.nan
        return out


def unique(values, kind: str | None = None) -> np.ndarray:
    """The sorted distinct values of an integer (or float, without NaN) array: ``np.unique`` without its hash
    path, whose check for masked arrays imports ``numpy.ma`` (7-17 ms of a ``diagnose`` process). ``kind``: the
    sort's (``"stable"`` merges already sorted runs without a full sort)."""
    a = np.sort(np.asarray(values).ravel(), kind=kind)
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def percentiles(values, qs) -> np.ndarray:
    """``np.percentile(values, qs)`` (its default, linear method) by one ``np.partition``: numpy's own selects
    its indices with ``np.unique``, which imports ``numpy.ma``. ``values``: finite numbers, at least one."""
    a = np.asarray(values, dtype=np.float64).ravel()
    pos = np.asarray(qs, dtype=np.float64) / 100.0 * (a.size - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, a.size - 1)
    part = np.partition(a, sorted(set(lo.tolist()) | set(hi.tolist())))
    return part[lo] + (part[hi] - part[lo]) * (pos - lo)


_I64_LIMIT = 2.0**63


def _ints(values: list) -> np.ndarray:
    f = _floats([v if v is not None else np.nan for v in values])
    f[~np.isfinite(f) | (np.abs(f) >= _I64_LIMIT)] = -1  # a corrupt id beyond int64: none
    return f.astype(np.int64)


def _stream_num(v: Any) -> int:
    """A stream or device id (an int, an integral float, or text ending in digits); -1: none or corrupt
    (also an id beyond int64, which no real trace has)."""
    if v.__class__ is int:  # the common case, first (a bool is not an int here: its class is bool)
        return v if -_I64_LIMIT <= v < _I64_LIMIT else -1
    if isinstance(v, bool):
        return -1
    if isinstance(v, float) and v.is_integer() and abs(v) < _I64_LIMIT:
        v = int(v)
    elif isinstance(v, str):
        m = re.search(r"(\d+)\s*$", v)
        v = int(m.group(1)) if m else -1
    if isinstance(v, int):
        return v if -_I64_LIMIT <= v < _I64_LIMIT else -1
    return -1


def thread_id(tid: Any) -> int:
    """A host thread as the Timeline numbers it: Kineto's int ``tid``, 1.8's text ``"25738"`` (its digits);
    -1: none."""
    return _stream_num(tid)


class _Threads(dict):
    """A ``tid`` as the trace writes it (Kineto's int, 1.8's text ``"25738"``) -> int64 (-1: none); memoized:
    a trace has a handful of threads."""

    def __missing__(self, key):
        v = self[key] = thread_id(key)
        return v


def _tids(evs: list, threads: _Threads) -> np.ndarray:
    """Each event's host thread as an int64; -1: none."""
    return np.array([threads[e.tid] for e in evs], dtype=np.int64)


def _tid_stream(tid: Any) -> int:
    """A GPU event without ``args.stream``: its stream from a 1.8-era ``"tid": "stream 7"``, else -1 (none)."""
    if isinstance(tid, str) and tid.lower().startswith("stream"):
        return _stream_num(tid)
    return -1


_I32 = np.iinfo(np.int32)


def _empty(n: int, dtype) -> np.ndarray:
    """An uninitialised array; from 1 MB on, in its own anonymous mapping: its pages become resident only as
    they are written, and they go back to the system when it is dropped (from the allocator's heap, freed
    buffers may stay resident, and a doubled buffer's untouched half may be)."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < (1 << 20):
        return np.empty(n, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=n)


class _Column:
    """One column grown in place: the chunks' values are copied into one buffer that doubles when full (so no
    per-chunk pieces are kept, and no final concatenation copy: :meth:`array` is a view of the filled part;
    the unfilled tail of a large buffer is never touched, so it is not resident). An integer column starts as
    int32 and becomes int64, exactly, the first time a value falls outside int32's range."""

    def __init__(self, dtype, narrow: bool = True):
        self.dtype = np.dtype(dtype)
        self.narrow = narrow and self.dtype == np.int64  # kept as int32 while the values fit
        self.buf = np.empty(0, dtype=np.int32 if self.narrow else self.dtype)
        self.n = 0

    def add(self, values: np.ndarray) -> None:
        k = values.size
        if self.narrow and self.buf.dtype == np.int32 and k and (values.min() < _I32.min or values.max() > _I32.max):
            self.buf = self.buf.astype(np.int64)  # the checked fallback: exact, as before
        if self.n + k > self.buf.size:
            new = _empty(max(2 * self.buf.size, self.n + k, 1024), self.buf.dtype)
            new[:self.n] = self.buf[:self.n]
            self.buf = new
        self.buf[self.n:self.n + k] = values
        self.n += k

    def array(self) -> np.ndarray:
        return self.buf[:self.n]


def reserved(dtype, capacity: int = 0, wide: bool = False) -> _Column:
    """A :class:`_Column` with room for ``capacity`` rows, reserved in an anonymous mapping whose pages become
    resident only as rows are written (so a generous reservation costs nothing, and the column never doubles
    and copies until it is exceeded). ``wide``: an integer column whose values need int64 from the first row
    (a serialized thread id), never kept as int32 first."""
    col = _Column(dtype)
    if wide:
        col.narrow = False
        col.buf = np.empty(0, dtype=np.int64)
    if capacity > 0:
        col.buf = _empty(int(capacity), col.buf.dtype)
    return col


RELEASE_BYTES = 1 << 20
RELEASE_FROM_FILE_BYTES = 32 << 20
_released = False


def release_freed_memory(file_bytes: int) -> None:
    """For a large trace (``file_bytes``, the file as stored, from :data:`RELEASE_FROM_FILE_BYTES` on): from
    here on, in this process, glibc's malloc serves every block of 1 MiB or more from a mapping of its own,
    unmapped as soon as it is freed (``mallopt(M_MMAP_THRESHOLD, 1 MiB)``). By default glibc raises that
    threshold as large blocks are freed, up to 32 MiB, and then serves the figures' temporary arrays of a few
    MiB from its heap, where freed ones stay resident until the heap's top is free: on a 1 GB Nsight export
    that is ~50 MB of the peak (537 -> 487 MB on the generated two-rank export). Not for a small trace: each
    large block then costs fresh page faults (~8% of reading a 1 MB trace), for no memory that matters. A
    setting of the whole process, applied once; left alone where ``run.host_memory=retain`` set its own
    thresholds (a training process), and nothing where the C library has no ``mallopt``."""
    global _released
    if _released or file_bytes < RELEASE_FROM_FILE_BYTES:
        return
    _released = True
    hostmem = sys.modules.get("trainperf.hardware.hostmem")
    if hostmem is not None and getattr(hostmem, "_applied", None):
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, RELEASE_BYTES)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError, TypeError):
        pass


def trim_heap() -> None:
    """Hand freed heap memory back to the system (glibc's malloc_trim; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


__all__ = ["release_freed_memory", "reserved", "thread_id", "trim_heap"]

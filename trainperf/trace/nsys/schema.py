"""An Nsight Systems SQLite export, opened read-only and read by table and column name.

``nsys export --type=sqlite`` writes one table per kind of data (``CUPTI_ACTIVITY_KIND_KERNEL``,
``CUPTI_ACTIVITY_KIND_RUNTIME``, ``NVTX_EVENTS``, ``StringIds``, ``TARGET_INFO_GPU``...), created lazily:
a capture without a kind of data has no table for it, and columns come and go between versions (the
export's ``META_DATA_EXPORT`` says which: ``EXPORT_SCHEMA_VERSION``). Nothing here assumes a column: every
query is built from ``PRAGMA table_info``, and a missing table or column is a figure "not measured", with
the reason, never a crash. Times are integer nanoseconds; ``globalTid`` / ``globalPid`` are serialized
ids (``globalPid`` = the process's id with the low 24 bits, the thread id, zero).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trainperf.errors import UserError

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, DRIVER, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS"
GPU_TABLE, CUDA_DEVICE = "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"
METRICS, METRIC_NAMES = "GPU_METRICS", "TARGET_INFO_GPU_METRICS"
# the tables only Nsight Systems writes: an SQLite file with none of them is something else
NSYS_TABLES = (KERNEL, MEMCPY, MEMSET, RUNTIME, DRIVER, NVTX, "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME",
               GPU_TABLE, "ANALYSIS_DETAILS", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
TID_BITS = 24  # globalTid = globalPid + thread id

# CUPTI's memcpy kinds (nsys's ENUM_CUDA_MEMCPY_OPER keeps CUPTI's numbering) as Kineto names them
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
# nsys's own memory kinds (ENUM_CUDA_MEM_KIND: not CUPTI's order), labelled as Kineto labels them
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static", 7: "Unknown"}
_COPY_RE = re.compile(r"(?:CUDA_)?MEMCPY_KIND_(?:UVM_)?(\w)TO(\w)$", re.I)


def _letters(a: str, b: str) -> str:
    return f"{a.upper()}to{b.upper()}"


class Export:
    """A read-only connection to one export and what it holds (tables -> columns, metadata)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        check_file(self.path)
        try:
            self.db = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True)
            self.db.execute("PRAGMA cache_size = -4096")  # 4 MB of page cache: every read is one sequential scan
            self.db.execute("PRAGMA temp_store = FILE")
            names = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            self.tables: dict[str, list[str]] = {
                n: [r[1] for r in self.db.execute(f'PRAGMA table_info("{n}")')] for n in names}
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: cannot be read as an SQLite database ({exc}); pass the .sqlite that "
                            f"`nsys export --type=sqlite` writes") from exc
        nsys = [t for t in NSYS_TABLES if t in self.tables]
        if not nsys or "StringIds" not in self.tables:
            shown = ", ".join(sorted(self.tables)[:12]) or "none"
            raise UserError(f"{self.path}: an SQLite database but not an Nsight Systems export: expected its tables "
                            f"(StringIds with {', '.join(NSYS_TABLES[:3])}, {NVTX}...); it has: {shown}. Export a "
                            f"report with `nsys export --type=sqlite --output=X.sqlite X.nsys-rep`")
        self.meta = self._pairs("META_DATA_EXPORT")
        self._enum_cache: dict[str, dict[int, tuple[str, str]]] = {}

    # ------------------------------------------------------------------ structure
    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.tables.get(table)
        return cols is not None and (column is None or column in cols)

    def col(self, table: str, *candidates: str) -> str | None:
        """The first of ``candidates`` the table has (a renamed column's names, newest first), else None."""
        cols = self.tables.get(table) or []
        return next((c for c in candidates if c in cols), None)

    def expr(self, table: str, column: str, default: Any = -1) -> str:
        """``coalesce(column, default)`` when the table has the column, else the default as a literal."""
        return f'coalesce("{column}", {default!r})' if self.has(table, column) else repr(default)

    def rows(self, sql: str, args: tuple = (), size: int = 16384):
        """The rows of a query, ``size`` at a time (never all of them in memory)."""
        try:
            cur = self.db.execute(sql, args)
            while True:
                chunk = cur.fetchmany(size)
                if not chunk:
                    return
                yield chunk
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: reading it failed ({exc}): a truncated or corrupt export; export the "
                            "report again") from exc

    def one(self, sql: str, args: tuple = ()) -> tuple:
        try:
            return self.db.execute(sql, args).fetchone()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: reading it failed ({exc}): a truncated or corrupt export; export the "
                            "report again") from exc

    def row_estimate(self, table: str) -> int:
        """How many rows a table holds, cheaply (its largest rowid, no scan)."""
        if table not in self.tables:
            return 0
        try:
            got = self.db.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()
        except sqlite3.DatabaseError:
            return 0
        return int(got[0] or 0)

    def _pairs(self, table: str) -> dict[str, str]:
        if not (self.has(table, "name") and self.has(table, "value")):
            return {}
        out: dict[str, str] = {}
        for chunk in self.rows(f'SELECT name, value FROM "{table}"'):
            for k, v in chunk:
                out.setdefault(str(k), str(v))
        return out

    @property
    def schema_version(self) -> str | None:
        return self.meta.get("EXPORT_SCHEMA_VERSION")

    @property
    def product_version(self) -> str | None:
        return self.meta.get("EXPORT_PRODUCT_VERSION")

    # ------------------------------------------------------------------ strings and enums
    def strings(self, ids) -> dict[int, str]:
        """StringIds values of the given ids (only those)."""
        ids = sorted({int(i) for i in ids if i is not None and int(i) >= 0})
        out: dict[int, str] = {}
        for k in range(0, len(ids), 900):  # SQLite's bound-parameter limit
            part = ids[k:k + 900]
            marks = ",".join("?" * len(part))
            for chunk in self.rows(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", tuple(part)):
                out.update((int(i), str(v)) for i, v in chunk)
        return out

    def enum(self, table: str) -> dict[int, tuple[str, str]]:
        """An ENUM_* table: id -> (name, label); {} when the export has none (older versions)."""
        if table not in self._enum_cache:
            got: dict[int, tuple[str, str]] = {}
            if self.has(table, "id"):
                name = "name" if self.has(table, "name") else "NULL"
                label = "label" if self.has(table, "label") else "NULL"
                for chunk in self.rows(f'SELECT id, {name}, {label} FROM "{table}"'):
                    got.update((int(i), (str(n or ""), str(lb or ""))) for i, n, lb in chunk)
            self._enum_cache[table] = got
        return self._enum_cache[table]

    def copy_kind(self, k: int) -> str:
        """A memcpy kind as Kineto names it (HtoD, DtoH, DtoD, PtoP...)."""
        name = self.enum("ENUM_CUDA_MEMCPY_OPER").get(int(k), ("", ""))[0]
        m = _COPY_RE.search(name)
        if m:
            return _letters(m.group(1), m.group(2))
        return COPY_KINDS.get(int(k), "Unknown")

    def mem_kind(self, k: int) -> str:
        """A memory kind label (Pageable, Pinned, Device...), -1: Unknown."""
        if int(k) < 0:
            return "Unknown"
        label = self.enum("ENUM_CUDA_MEM_KIND").get(int(k), ("", ""))[1]
        return label or MEM_KINDS.get(int(k), "Unknown")

    def close(self) -> None:
        self.db.close()


def check_file(path: Path) -> None:
    """A UserError naming the file unless it exists and starts as an SQLite database does."""
    if not path.exists():
        raise UserError(f"{path}: no such file; pass an Nsight Systems export (.sqlite) or report (.nsys-rep)")
    if path.is_dir():
        raise UserError(f"{path} is a directory; pass an Nsight Systems export (.sqlite) or report (.nsys-rep)")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc})") from exc
    if head != SQLITE_MAGIC:
        what = "an empty file" if not head else f"it starts with {head[:8]!r}"
        raise UserError(f"{path}: not an Nsight Systems export: not an SQLite database ({what}); expected the "
                        "file `nsys export --type=sqlite --output=X.sqlite X.nsys-rep` writes")


def is_nsys_export(path: str | Path) -> bool:
    """True when PATH is an SQLite database holding Nsight Systems' tables (no error either way)."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                return False
        db = sqlite3.connect(f"file:{quote(str(p.resolve()))}?mode=ro", uri=True)
        try:
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except (OSError, sqlite3.DatabaseError):
        return False
    return "StringIds" in names and any(t in names for t in NSYS_TABLES)


def pid_range(global_pid: int) -> tuple[int, int]:
    """The globalTid values of a process's threads: [globalPid, globalPid + 2**24)."""
    return global_pid, global_pid + (1 << TID_BITS)


def process_of(global_tid: int) -> int:
    return (int(global_tid) >> TID_BITS) << TID_BITS


def pid_number(global_pid: int) -> int:
    """The operating system's pid inside a serialized globalPid."""
    return (int(global_pid) >> TID_BITS) & 0xFFFFFF


__all__ = ["COPY_KINDS", "Export", "MEM_KINDS", "check_file", "is_nsys_export", "pid_number", "pid_range",
           "process_of"]

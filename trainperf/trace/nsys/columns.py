"""The Timeline's growing columns, sized up front for an export: a column's buffer is reserved at the row count
the export's table has (its largest rowid: no scan), in an anonymous mapping whose pages become resident only
as rows are written. So reading a table never doubles a buffer and copies it (with the columns of one table
growing together, those copies were the read's transient peak), and a rank holding a part of the table costs
only the part it wrote."""

from __future__ import annotations

import numpy as np

from trainperf.trace.columns import _Column, _empty


def column(dtype, capacity: int = 0, wide: bool = False) -> _Column:
    """A :class:`~trainperf.trace.timeline._Column` with room for ``capacity`` rows. ``wide``: an integer column
    whose values need int64 from the first row (a serialized thread id), never kept as int32 first."""
    col = _Column(dtype)
    if wide:
        col.narrow = False
        col.buf = np.empty(0, dtype=np.int64)
    if capacity > 0:
        col.buf = _empty(int(capacity), col.buf.dtype)
    return col


__all__ = ["column"]

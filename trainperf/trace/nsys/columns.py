"""The Timeline's growing columns, sized up front for an export: a column's buffer is reserved at the row count
the export's table has (its largest rowid: no scan), in an anonymous mapping whose pages become resident only
as rows are written. So reading a table never doubles a buffer and copies it (with the columns of one table
growing together, those copies were the read's transient peak), and a rank holding a part of the table costs
only the part it wrote."""

from __future__ import annotations

from trainperf.trace.columns import reserved as column

__all__ = ["column"]

"""Traces with known answers, made from real ones: the development and test data of the trace diagnosis.

Generators live here, apart from :mod:`trainperf.trace` (the shipped reader). Each module makes one kind of
case and returns (or writes beside its output) the truth a reader should find: :mod:`.causes` edits a real
rank to carry a known host cause of GPU idle time (allocator frees, a sync drain, a late DataLoader, a
Python-heavy host, an unfused optimizer step).
"""

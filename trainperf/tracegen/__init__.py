"""Generators of profiler captures with known contents: test and benchmark fixtures, kept apart from the readers
they exercise (nothing in ``trainperf`` proper imports this package). Each module writes one kind of file
from a description of the job, deterministically (a seed), and returns what it put in."""

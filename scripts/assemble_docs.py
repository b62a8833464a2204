#!/usr/bin/env python3
"""Assemble README.md and BENCHMARKS.md from docs/ (a head, one fragment per area, a tail).

Edit the pieces under docs/, then run ``python scripts/assemble_docs.py``; ``--check`` exits 1
when a generated file is out of date (the test suite runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
AREAS = ["doctor", "train", "data", "memory", "distributed", "balance", "monitor", "compare", "integrations", "tune",
         "planner", "xla"]


def _parts(head: str, kind: str, tail: str | None = None) -> list[Path]:
    frags = [DOCS / "fragments" / f"{a}-{kind}.md" for a in AREAS]
    return [DOCS / head, *(f for f in frags if f.exists()), *([DOCS / tail] if tail else [])]


TARGETS = {
    "README.md": _parts("README.head.md", "readme", "README.tail.md"),
    "BENCHMARKS.md": _parts("BENCHMARKS.head.md", "benchmarks"),
}


def assemble(name: str) -> str:
    return "\n".join(p.read_text() for p in TARGETS[name])


def main(argv: list[str]) -> int:
    stale = []
    for name in TARGETS:
        text, path = assemble(name), ROOT / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; edit docs/ and run: python scripts/assemble_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

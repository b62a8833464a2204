"""README.md and BENCHMARKS.md are generated from docs/: they must not drift from their sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_docs_match_their_sources():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "assemble_docs.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr

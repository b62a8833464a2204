"""How far trainperf's per-rank figures are from HTA's and the TensorBoard plugin's, over every trace that has
stored peer figures: the largest difference per figure, and what was not compared and why.

    python scripts/trace_agreement.py          # generated traces (tests/data/traces) and the peers' own
                                               # traces committed under tests/data/real

The comparison is the one tests/unit/test_trace_figures.py asserts (``compare``: its tolerances, its
exclusions); this prints the margins instead of pass/fail.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.test_trace_figures import CORPUS_ORACLES, GENERATED, REAL, TRACES, compare, sha256  # noqa: E402
from trainperf.trace import analyze_file  # noqa: E402


def main() -> int:
    for label, oracles, root in (("generated", GENERATED, TRACES), ("corpus", CORPUS_ORACLES, REAL)):
        worst: dict = defaultdict(lambda: (0.0, None))
        n: dict = defaultdict(int)
        skipped: dict = defaultdict(list)
        files = 0
        for name, o in oracles.items():
            p = root / name
            if not p.is_file() or sha256(p) != o["sha256"]:
                continue
            files += 1
            pairs, sk = compare(analyze_file(p), o)
            for s in sk:
                skipped[s.split("(")[0].strip()].append(name)
            for k, (a, b, _tol) in pairs.items():
                n[k] += 1
                d = abs(a - b)
                if d >= worst[k][0]:
                    worst[k] = (d, name)
        print(f"== {label}: {files} traces")
        for k in sorted(n):
            print(f"  {k:<38} compared on {n[k]:>3}  max |diff| {worst[k][0]:.3f}  ({worst[k][1]})")
        for s, names in skipped.items():
            print(f"  not compared: {s}: {len(names)} trace(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

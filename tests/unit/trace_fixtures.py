"""The generated traces kept under tests/data/traces (their bytes are checked against the generator), the
peers' figures on them and on the real traces (tests/data/trace_oracles), and where the real traces are:
a subset committed under tests/data/real (run everywhere, CI included), the rest under
$TRAINPERF_TRACE_CORPUS (default /work/peers), both with the relative paths the oracle file uses."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests/data/traces"
ORACLES = ROOT / "tests/data/trace_oracles"
REAL = ROOT / "tests/data/real"
CORPUS = Path(os.environ.get("TRAINPERF_TRACE_CORPUS", "/work/peers"))

# name -> make_trace(path, **kwargs)
FIXTURES = {
    "a100_ddp_gen_lines_ns.json.gz": dict(kind="a100_ddp", steps=4, layout="lines", units="ns", seed=1),
    "a100_ddp_gen_single_us.json.gz": dict(kind="a100_ddp", steps=3, layout="single", units="us", seed=2),
    "v100_18_gen_lines_us.json.gz": dict(kind="v100_18", steps=4, layout="lines", seed=3),
    "v100_18_gen_single_us.json": dict(kind="v100_18", steps=2, layout="single", seed=4),
    "moe_a2a_gen_lines_ns.json.gz": dict(kind="moe_a2a", steps=4, layout="lines", units="ns", seed=5),
    "fp8_tuned_gen_single_ns.json.gz": dict(kind="fp8_tuned", steps=4, layout="single", units="ns", seed=6),
    "launch_bound_gen_lines_us.json.gz": dict(kind="launch_bound", steps=3, layout="lines", units="us", seed=7),
    "cpu_only_gen_lines_us.json.gz": dict(kind="cpu_only", steps=3, layout="lines", units="us", seed=8),
}
OWN = ["trainperf_cpu_rank0_step4.json.gz"]


def oracles(name: str) -> dict:
    p = ORACLES / name
    return json.loads(p.read_text()) if p.is_file() else {"traces": {}}


def real_trace(rel: str) -> Path | None:
    """The real trace ``rel`` (e.g. ``hta-data/tests/data/...``): the committed copy, else the corpus's, else None."""
    for root in (REAL, CORPUS):
        if (root / rel).is_file():
            return root / rel
    return None


def missing(rel: str) -> str:
    return f"{rel} is neither in {REAL.relative_to(ROOT)} nor under $TRAINPERF_TRACE_CORPUS ({CORPUS})"


def write_fixtures(out: Path = TRACES) -> list[Path]:
    from trainperf.trace.generate import make_trace

    paths = []
    for name, kw in FIXTURES.items():
        p = out / name
        make_trace(p, **kw)
        paths.append(p)
    return paths


if __name__ == "__main__":  # regenerate: python -m tests.unit.trace_fixtures
    for p in write_fixtures():
        print(p, p.stat().st_size)

"""The generated traces kept under tests/data/traces (their bytes are checked against the generator), the
peers' figures on them and on the real traces (tests/data/trace_oracles), and the real traces themselves:
committed under tests/data/real with the relative paths the oracle file uses (their sources, commits and
licenses: tests/data/real/README.md). Every trace a test names is in the repository: one that is not there
fails the test that needs it, it is never skipped."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests/data/traces"
ORACLES = ROOT / "tests/data/trace_oracles"
REAL = ROOT / "tests/data/real"

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
    """The peers' figures stored in tests/data/trace_oracles/``name`` (FileNotFoundError when it is not there)."""
    return json.loads((ORACLES / name).read_text())


def real_trace(rel: str) -> Path:
    """The committed real trace ``rel`` (e.g. ``hta-data/tests/data/...``); FileNotFoundError, naming where it
    belongs and where it comes from, when it is not in the repository."""
    p = REAL / rel
    if not p.is_file():
        raise FileNotFoundError(f"{p.relative_to(ROOT)} is missing: the real traces are part of the repository "
                                f"(their sources and commits: {(REAL / 'README.md').relative_to(ROOT)})")
    return p


def write_fixtures(out: Path = TRACES) -> list[Path]:
    from trainperf.tracegen.generate import make_trace

    paths = []
    for name, kw in FIXTURES.items():
        p = out / name
        make_trace(p, **kw)
        paths.append(p)
    return paths


if __name__ == "__main__":  # regenerate: python -m tests.unit.trace_fixtures
    for p in write_fixtures():
        print(p, p.stat().st_size)

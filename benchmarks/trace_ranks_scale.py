"""``trainperf diagnose`` on a directory of many ranks against one rank: time per rank and peak memory.

    python benchmarks/trace_ranks_scale.py [SRC] [--world 256] [--repeat 1] [--workdir DIR] [--json OUT]

Makes ``--world`` ranks from the one real rank SRC (default: HTA's A100 NCCL rank committed under
tests/data/real) with ``trainperf.tracegen.ranks.make_job``: rank ``world * 3 // 4`` has a DataLoader 15 ms late
each step, every host's clock is off by a different amount (so the figures across ranks have work to do).
Then runs, as whole processes (``trainperf.bench.traces.run_child``), ``--repeat`` times alternating:

* ``python -m trainperf diagnose RANK0 --json``: one rank;
* ``python -m trainperf diagnose DIR --json``: every rank, read by one worker process per usable core.

Prints per run: wall and CPU seconds (CPU: user + system of the process and its workers), the main process's
peak RSS (VmHWM), the process tree's peak (sum over the workers, sampled), the largest process; and per rank:
wall / N, wall x workers / N (core-seconds per rank: what one core spends per rank) and CPU / N, each over the
one-rank figure. Checks the late rank and its cause against truth.json. The directory is made once per workdir
and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainperf.bench.traces import run_child  # noqa: E402
from trainperf.trace.job import usable_cores  # noqa: E402
from trainperf.tracegen.ranks import make_job  # noqa: E402

A100 = ROOT / "tests/data/real/hta-data/tests/data/nccl_parser_config/nccl_data.json.gz"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", nargs="?", default=str(A100))
    ap.add_argument("--world", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="trace-ranks-"))
    d = work / f"ranks{a.world}"
    late = a.world * 3 // 4
    if not (d / "truth.json").is_file():
        t0 = time.perf_counter()
        make_job(a.src, d, world=a.world, late=late, cause="dataloader", late_us=15_000.0, dataloader_us=1000.0,
                 clock_offsets_us={r: (r % 7) * 1500.0 - 4000.0 for r in range(a.world)}, end_jitter_us=5.0)
        print(f"made {a.world} ranks in {time.perf_counter() - t0:.0f} s: {d}", flush=True)
    truth = json.loads((d / "truth.json").read_text())
    files = sorted(d.glob("rank*.pt.trace.json.gz"))
    one = d / "rank0.pt.trace.json.gz"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    print(f"uptime at start: {os.popen('uptime').read().strip()}")
    print(f"{os.uname().machine}, {os.cpu_count()} CPUs ({usable_cores()} usable); python {sys.version.split()[0]}")
    runs: dict[str, list] = {"one": [], "all": []}
    found = None
    for _ in range(a.repeat):
        for key, path in (("one", one), ("all", d)):
            r = run_child([sys.executable, "-m", "trainperf", "diagnose", str(path), "--json"], env=env)
            if r["rc"] != 0:
                print(f"{path}: exit {r['rc']}: {r['stderr'][-800:]}", file=sys.stderr)
                return 1
            if key == "all":
                out = json.loads(r["stdout"])
                found = (out["ranks"].get("late_arrivals") or [{}])[0]
            runs[key].append({k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "tree_peak_rss_mb", "largest_rss_mb")})
    print(f"uptime at end:   {os.popen('uptime').read().strip()}")

    def med(key: str, f: str) -> float:
        return statistics.median(x[f] for x in runs[key])

    n, w = len(files), min(len(files), usable_cores())
    mb = sum(f.stat().st_size for f in files) / 2**20
    print(f"\n{n} ranks, {mb:.0f} MB gzipped ({one.stat().st_size / 2**20:.2f} MB each); {w} worker processes")
    print(f"{'diagnose':<14}{'wall s':>9}{'CPU s':>9}{'main RSS MB':>13}{'tree MB':>9}{'largest MB':>12}")
    for key, label in (("one", "one rank"), ("all", f"{n} ranks")):
        print(f"{label:<14}{med(key, 'wall_s'):>9.2f}{med(key, 'cpu_s'):>9.2f}{max(x['peak_rss_mb'] for x in runs[key]):>13.0f}"
              f"{max(x['tree_peak_rss_mb'] or 0 for x in runs[key]):>9.0f}{max(x['largest_rss_mb'] for x in runs[key]):>12.0f}")
    w1, c1 = med("one", "wall_s"), med("one", "cpu_s")
    wa, ca = med("all", "wall_s"), med("all", "cpu_s")
    per = {"wall_per_rank_s": wa / n, "core_s_per_rank": wa * w / n, "cpu_per_rank_s": ca / n}
    print(f"per rank: wall {per['wall_per_rank_s']:.3f} s ({per['wall_per_rank_s'] / w1:.2f}x one rank's diagnose), "
          f"core-seconds {per['core_s_per_rank']:.3f} s ({per['core_s_per_rank'] / w1:.2f}x), "
          f"CPU {per['cpu_per_rank_s']:.3f} s ({per['cpu_per_rank_s'] / c1:.2f}x one rank's CPU)")
    ok = found.get("rank") == truth["late_rank"] and found.get("cause") == truth["cause"]
    print(f"late arrival found: {found.get('summary')} (truth: rank {truth['late_rank']}, {truth['cause']}, "
          f"{truth['job']['delay_us_per_step'] / 1000:.2f} ms per step): {'agrees' if ok else 'DISAGREES'}")
    if a.json:
        Path(a.json).write_text(json.dumps({"ranks": n, "workers": w, "mb": mb, "runs": runs, "per_rank": per,
                                            "found": found, "truth_late": truth["late_rank"]}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

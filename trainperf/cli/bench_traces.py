"""``trainperf bench traces FILE|DIR [--json] [--repeat N] [--hta-python PATH]``: argument parsing and printing
(the measurement: trainperf.bench.traces)."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag, print_json, whole


def register(subparsers) -> None:
    import trainperf.bench.traces as bench

    p = subparsers.add_parser("traces", help="trainperf vs Holistic Trace Analysis on the same profiler traces: "
                                             "time, peak memory, the figures both compute",
                              description=bench.__doc__)
    p.add_argument("path", metavar="FILE|DIR", help="a trace file, a directory of traces (one per rank), or an "
                                                    "Nsight Systems export (.sqlite: its reader against sqlite3)")
    p.add_argument("--repeat", type=whole(1), default=1, metavar="N", help="runs of each tool, alternating (default 1)")
    p.add_argument("--hta-python", default=None, metavar="PATH",
                   help="python of a venv with HolisticTraceAnalysis (default: $TRAINPERF_HTA_PYTHON, else this "
                        "interpreter if it has hta)")
    p.add_argument("--generate-nsys-mb", type=whole(1), default=None, metavar="N",
                   help="first write a generated Nsight Systems export of at least N MB at FILE (kept and reused when "
                        "one that large is there), then measure it")
    add_json_flag(p)
    p.set_defaults(func=run)


def _v(x, fmt="{:.1f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def run(args) -> int:
    from trainperf.bench.traces import bench_traces, generate_nsys

    if args.generate_nsys_mb:
        generated = generate_nsys(args.path, args.generate_nsys_mb)
    res = bench_traces(args.path, repeat=args.repeat, hta_python=args.hta_python)
    if args.generate_nsys_mb:
        res["generated"] = generated
    if args.json:
        print_json(res)
        return 0
    if res.get("kind") == "nsys":
        return _print_nsys(res)
    mb = res["bytes"] / 2**20
    print(f"trainperf bench traces: {res['path']} ({len(res['files'])} file(s), {mb:.2f} MB on disk, "
          f"{_v(res['events'], '{:,}')} events); each tool a whole process, {res['repeat']} run(s), alternating")
    hdr = f"{'tool':<12}{'measures':<50}{'wall s':>9}{'CPU s':>9}{'peak RSS MB':>13}{'tree MB':>9}"
    print(hdr)
    print("-" * len(hdr))
    tp, hta = res["trainperf"], res["hta"]
    print(f"{'trainperf':<12}{'diagnose PATH --json (every figure + rules)':<50}{_v(tp['wall_s'], '{:.2f}'):>9}"
          f"{_v(tp.get('cpu_s'), '{:.2f}'):>9}{_v(tp['peak_rss_mb'], '{:.0f}'):>13}"
          f"{_v(tp.get('tree_peak_rss_mb'), '{:.0f}'):>9}")
    if hta:
        print(f"{'HTA 0.5':<12}{'load + temporal + idle breakdown':<50}{_v(hta['wall_s'], '{:.2f}'):>9}"
              f"{_v(hta.get('cpu_s'), '{:.2f}'):>9}{_v(hta['peak_rss_mb'], '{:.0f}'):>13}"
              f"{_v(hta.get('tree_peak_rss_mb'), '{:.0f}'):>9}")
        print(f"  HTA inside its process: load {hta['load_s']:.2f} s, breakdowns {hta['breakdowns_s']:.2f} s")
        print(f"  trainperf is {res['speedup']:.1f}x faster by wall time ({_v(res.get('cpu_speedup'))}x by CPU time), "
              f"with {res['rss_ratio']:.1f}x less peak memory ({_v(res.get('tree_rss_ratio'))}x over the process "
              "trees)")
    if res["figures"]:
        print()
        h2 = f"{'rank':>5}  {'figure':<62}{'trainperf':>11}{'HTA':>9}{'diff (pts)':>12}"
        print(h2)
        print("-" * len(h2))
        for r in res["figures"]:
            print(f"{r['rank']:>5}  {r['figure']:<62}{_v(r['trainperf'], '{:.2f}'):>11}{_v(r['hta'], '{:.2f}'):>9}"
                  f"{_v(r['diff_points'], '{:+.2f}'):>12}")
    for n in res["notes"]:
        print(f"note: {n}")
    print("wall, CPU (user + system, worker processes included): median over the runs; peak RSS: the child "
          "program's own high-water mark (VmHWM), imports included; tree: the largest sum over the child and its "
          "worker processes, sampled every ~20 ms (pages shared after a fork counted in each). Timings on a shared "
          "machine: compare the two in one run, not across runs.")
    return 0


def _print_nsys(res: dict) -> int:
    rows = ", ".join(f"{k.replace('CUPTI_ACTIVITY_KIND_', '').lower()} {v:,}" for k, v in res["rows"].items() if v)
    print(f"trainperf bench traces: {res['path']} (Nsight Systems export, {res['bytes'] / 1e6:,.1f} MB; {rows}; "
          f"{res['ranks']} rank(s)); each reader a whole process, {res['repeat']} run(s), alternating")
    hdr = f"{'reader':<14}{'measures':<62}{'wall s':>9}{'CPU s':>9}{'peak RSS MB':>13}"
    print(hdr)
    print("-" * len(hdr))
    for k in ("trainperf", "sqlite3_rows", "sqlite3_sum"):
        r = res[k]
        print(f"{k:<14}{res['measures'][k]:<62}{_v(r['wall_s'], '{:.2f}'):>9}{_v(r['cpu_s'], '{:.2f}'):>9}"
              f"{_v(r['peak_rss_mb'], '{:.0f}'):>13}")
    per_gb = f"; peak RSS {res['rss_mb_per_gb']:.0f} MB per GB of export" if res["bytes"] >= 1e8 else ""
    print(f"  trainperf: {_v(res['x_scan_wall'])}x the wall time of the kernel-table scan ({_v(res['x_scan_cpu'])}x its "
          f"CPU time), {res['kernel_rows']:,} kernel rows{per_gb}")
    print("wall, CPU (user + system): median over the runs; peak RSS: the child program's own high-water mark "
          "(VmHWM), imports included. Timings on a shared machine: compare the readers in one run, not across runs.")
    return 0

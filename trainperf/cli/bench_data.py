"""``trainperf bench data``: argument parsing and printing (the measurement: trainperf.bench.data)."""

from __future__ import annotations

from trainperf.bench.data import KINDS
from trainperf.cli._common import add_json_flag, finite, print_json, whole

MAX_ITEM_KB = 1024 * 1024  # 1 GiB per item: the benchmark holds twice an item's bytes as its source
MIN_COMPUTE_MS = 1.0


def register(subparsers) -> None:
    import trainperf.bench.data as bench

    p = subparsers.add_parser("data", help="HybridLoader vs torch DataLoader on a slow source", description=bench.__doc__)
    d, q = bench.DEFAULTS, bench.QUICK
    p.add_argument("--latency-ms", type=finite(0, strict=False), default=None,
                   help=f"simulated latency per read, ms (default {d['latency_ms']:g}; --quick: {q['latency_ms']:g})")
    p.add_argument("--bandwidth-mb-s", type=finite(0), default=None, help="simulated bandwidth cap per process")
    p.add_argument("--item-kb", type=finite(0, hi=MAX_ITEM_KB), default=None,
                   help=f"bytes per item in KiB, at most {MAX_ITEM_KB:g} (1 GiB; default {d['item_kb']:g}; --quick: "
                        f"{q['item_kb']:g})")
    p.add_argument("--decode-ms", type=finite(0, strict=False), default=None,
                   help=f"CPU time to decode one item (default {d['decode_ms']:g}; --quick: {q['decode_ms']:g})")
    p.add_argument("--epochs", type=whole(2), default=2, help="throughput epochs: 1 cold + N-1 warm, at least 2 "
                   "(default 2)")
    p.add_argument("--workers", type=whole(0), default=None, help="loader workers (default: min(32, usable CPUs))")
    p.add_argument("--samples", type=whole(1), default=None,
                   help=f"items per epoch (default {d['samples']}; --quick: {q['samples']})")
    p.add_argument("--batch", type=whole(1), default=None, help=f"batch size (default {d['batch']}; --quick: {q['batch']})")
    p.add_argument("--compute-ms", type=finite(MIN_COMPUTE_MS, strict=False), default=None,
                   help=f"compute per step in the data-wait loop, at least {MIN_COMPUTE_MS:g} ms (the loop runs "
                        "seconds of it: 0 would take thousands of reads per loader; default: 1.5 x batch x "
                        "decode-ms / workers, >= 5)")
    p.add_argument("--io-threads", type=whole(1), default=None,
                   help="HybridLoader IO threads per worker (default: derived from the measured read rate)")
    p.add_argument("--cache-dir", default=None,
                   help="where HybridLoader's disk cache goes (a fresh sub-directory; default: the temp directory)")
    p.add_argument("--only", action="append", choices=list(KINDS),
                   help="run only these loaders (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="a few-second smoke run: the sizes you do not give take the --quick values above, and the "
                        f"wait loop runs {bench.QUICK_WAIT_LOOP_S:g} s instead of {bench.WAIT_LOOP_S:g} s; a value "
                        "you give is kept (the run prints what --quick set)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.bench.data import measure

    out = measure(args)
    s, rows, summary = out["settings"], out["loaders"], out["summary"]
    if args.json:
        print_json(out)
        return 0
    print(f"bench data: {s['samples']} items of {s['item_kb']:g} KiB, {s['latency_ms']:g} ms per read, "
          f"decode {s['decode_ms']:g} ms CPU per item, batch {s['batch']}, {s['workers']} worker(s) "
          f"({s['usable_cpus']} usable CPUs, load average {s['load_avg_1m_at_start']}), "
          f"compute {s['compute_ms']:.1f} ms per step in the wait loop")
    if s["quick"]:
        chosen = ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in s["quick_set"].items() if k != "wait_loop_s")
        print(f"--quick set: {chosen or 'no size (all given)'}; wait loop {s['wait_loop_s']:g} s "
              "(values you gave are kept)")
    print(f"data wait: the median over {s['wait_windows']} windows of a {s['wait_loop_s']:g} s (or longer) steady-state "
          "loop of the time in next(); 'loop' its fraction over the whole loop; p50 / p95: per-step waits")
    print(f"{'loader':<20} {'cold samples/s':>15} {'warm samples/s':>15} {'data wait':>10} {'loop':>7} "
          f"{'p50 ms':>8} {'p95 ms':>8} {'CPU ms/sample':>14}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['name']:<20} skipped: {r['skipped']}")
            continue
        print(f"{r['name']:<20} {r['cold_samples_per_s']:>15.0f} {r['warm_samples_per_s']:>15.0f} "
              f"{100 * r['data_wait_fraction']:>9.1f}% {100 * r['data_wait_fraction_total']:>6.1f}% "
              f"{1e3 * r['step_wait_p50_s']:>8.2f} {1e3 * r['step_wait_p95_s']:>8.2f} {r['warm_cpu_ms_per_sample']:>14.2f}")
    load = max(s["load_avg_1m_at_start"], s["load_avg_1m_at_end"])
    if load >= s["usable_cpus"]:
        print(f"note: load average up to {load:g} on {s['usable_cpus']} usable CPUs: other processes compete for the "
              "CPUs the loaders decode on, and the CPU-bound loaders' data wait (hybrid's) measures that competition; "
              "compare figures from a quiet machine")
    if "warm_speedup_vs_tuned" in summary:
        print(f"hybrid vs dataloader_tuned: warm {summary['warm_speedup_vs_tuned']:.1f}x, "
              f"cold {summary['cold_speedup_vs_tuned']:.1f}x")
    for k, v in (summary.get("hybrid_warm_ratio_vs") or {}).items():
        print(f"hybrid warm-epoch samples/s / {k}'s: {v:.2f}x")
    for r in rows:
        if "prefetch" in r:
            pf, plan = r["prefetch"], r["prefetch"]["plan"]
            print(f"{r['name']}: {pf['io_threads']} IO threads per worker, {pf['host_slots']} host slots, {pf['depth']} "
                  f"ready (plan for a {1e3 * plan['step_s']:.1f} ms step, {1e3 * plan['read_s']:.1f} ms reads, "
                  f"{1e3 * plan['serial_s']:.2f} ms serial per sample; utilization {plan['utilization']:.2f})")
    return 0


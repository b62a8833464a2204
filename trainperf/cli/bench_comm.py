"""``trainperf bench comm``: argument parsing and printing (the measurement: trainperf.bench.comm)."""

from __future__ import annotations

from trainperf.cli._common import add_json_flag, print_json, whole


def register(subparsers) -> None:
    import trainperf.bench.comm as bench

    p = subparsers.add_parser("comm", help="bytes and time per step for each parallel layout and compression",
                              description=bench.__doc__)
    p.add_argument("--world", type=int, default=2, help="local gloo processes (default 2)")
    p.add_argument("--steps", type=whole(1, 10**6), default=4, help="steps per row (PowerSGD compresses from step 3)")
    p.add_argument("--rows", default=None, help="comma-separated row names to run (default: all)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from trainperf.bench.comm import measure

    names = [r.strip() for r in args.rows.split(",")] if args.rows else None
    res = measure(names, steps=args.steps, world=args.world)
    if args.json:
        print_json(res)
        return 0
    print("trainperf bench comm: tiny GPT (2 layers, hidden 128, seq 32, global batch 8), gloo on CPU, "
          f"{res['world']} processes; bytes per rank per optimizer step")
    hdr = f"{'layout':<26}{'payload B':>12}{'wire B':>12}{'formula B':>12}{'x fewer':>9}{'step ms':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in res["rows"]:
        fmt = lambda v: f"{v:,}" if v else "-"  # noqa: E731
        red = r.get("reduction_vs_data2")
        print(f"{r['layout']:<26}{fmt(r['measured_payload_bytes']):>12}{fmt(r['measured_wire_bytes']):>12}"
              f"{r['formula_wire_bytes']:>12,}{(f'{red:.1f}' if red else '-'):>9}{r['step_s'] * 1000:>9.0f}")
    print("payload/wire: measured in the DDP hooks (wire = ring estimate 2(n-1)/n x payload); formula: REFERENCE.md; "
          "'-' = those collectives are not hooked (FSDP2, DTensor, pipeline p2p). Step times on a shared CPU are "
          "indicative only.")
    return 0

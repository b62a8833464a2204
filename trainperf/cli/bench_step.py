"""``trainperf bench step``: argument parsing and printing (the measurement: trainperf.bench.step)."""

from __future__ import annotations

from trainperf.bench.step import VARIANTS, measure
from trainperf.cli._common import add_config_args, add_json_flag, print_json, whole


def register(subparsers) -> None:
    import trainperf.bench.step as bench

    p = subparsers.add_parser("step", help="trainer step vs a plain PyTorch loop on the same model and data",
                              description=bench.__doc__)
    add_config_args(p, required=False)
    p.add_argument("--rounds", type=whole(1), default=6, help="interleaved rounds (default 6)")
    p.add_argument("--steps", type=whole(1), default=8, help="steps of each loop per round (default 8)")
    p.add_argument("--warmup", type=whole(0), default=3, help="untimed steps of each loop first (default 3)")
    p.add_argument("--variants", nargs="*", default=None, metavar="NAME",
                   help=f"extra rows: {', '.join(VARIANTS)} (no name: all that this device can run)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    res = measure(args.config, args.overrides, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                  variants=args.variants, progress=not args.json)
    if args.json:
        print_json(res)
        return 0
    print("trainperf bench step: trainer vs hand-written loop, same model/data/optimizer")
    print(f"  trainer step  {res['trainer_step_s'] * 1000:9.2f} ms (median, fp32 eager)")
    print(f"  plain step    {res['plain_step_s'] * 1000:9.2f} ms (median)")
    print(f"  overhead      {100 * res['overhead']:+8.2f} %   (trainer / plain - 1)")
    for row in res["variants"]:
        extra = f", first step (compile) {row['compile_s']:.1f} s" if row["compile_s"] and "compile" in row["name"] else ""
        print(f"  {row['name']:<16}{row['step_s'] * 1000:9.2f} ms   x{row['speedup_vs_trainer_fp32']:.2f} vs fp32 eager{extra}")
    for name, why in res["skipped"].items():
        print(f"  {name:<16}skipped: {why}")
    print(f"  ({res['method']}; {res['model_params'] / 1e6:.2f}M params, batch {res['micro_batch']} x "
          f"{res['seq_len']}, {res['device']}, AdamW {res['optimizer_impl']})")
    return 0

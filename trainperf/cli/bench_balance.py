"""``trainperf bench balance``: argument parsing and printing (the measurement: trainperf.bench.balance)."""

from __future__ import annotations

import argparse

from trainperf.cli._common import add_json_flag, finite, print_json, whole


def register(subparsers) -> None:
    import trainperf.bench.balance as bench

    p = subparsers.add_parser("balance", help="dynamic load balancer on a straggler rank", description=bench.__doc__)
    p.add_argument("--ranks", type=int, default=2, help="gloo processes (data-parallel ranks)")
    p.add_argument("--slow-rank", type=int, default=1, help="the rank that does more work per sample")
    p.add_argument("--slowdown", type=float, default=2.0, help="work per sample on the slow rank, x the others' (>= 1)")
    p.add_argument("--busy", "--outside-straggler", dest="busy", action="store_true",
                   help="a straggler from outside instead: a busy process shares the slow rank's CPU (--slowdown "
                        "is then not applied)")
    p.add_argument("--rounds", type=int, default=1,
                   help="independent rounds (fresh ranks and balancer each): balanced / unbalanced per round and a "
                        "summary; with --control, a round without the straggler after each")
    p.add_argument("--target-ratio", type=finite(0.0), default=0.80,
                   help="with --rounds: count the rounds whose balanced / unbalanced step time is at or below this")
    p.add_argument("--steps", type=int, default=60, help="measured steps per arrangement (unbalanced, balanced)")
    p.add_argument("--block", type=int, default=5, help="steps per block when alternating the two arrangements")
    p.add_argument("--global-batch", type=int, default=None,
                   help="samples per step over all ranks (default 64; with --mid-run 16, gpt-tiny's own)")
    p.add_argument("--micro-steps", type=whole(1, 1024), default=2, help="micro-steps per rank per step (uneven sizes)")
    p.add_argument("--seq", type=whole(1, 2**20), default=256,
                   help="tokens per sample (the default makes a step ~0.2 s, like a real training step, so the "
                        "gradient all-reduce is a few percent of it)")
    p.add_argument("--dim", type=whole(1, 2**16), default=128, help="MLP width (the hidden layer is 4x)")
    p.add_argument("--window", type=int, default=60, help="balancer window (measurements kept)")
    p.add_argument("--min-steps", type=int, default=30, help="balancer measurements before a judgement")
    p.add_argument("--threshold", type=float, default=0.2, help="balancer trigger: CV of per-rank step compute time")
    p.add_argument("--min-gain", type=finite(0.0, strict=False), default=0.02,
                   help="balancer: smallest predicted cut of the step compute time worth a move")
    p.add_argument("--sync-every", type=whole(1), default=10,
                   help="balancer: exchange the measurements (one all_gather) every this many steps")
    p.add_argument("--settle-steps", type=whole(1), default=300, help="at most this many steps for the balancer to settle")
    p.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="try each move against the old shares and keep it only if the step got faster (default)")
    p.add_argument("--verify-steps", type=int, default=15, help="balancer: measured steps per arm of a trial")
    p.add_argument("--verify-block", type=int, default=5,
                   help="balancer: steps per trial block (a block ends at an exchange: at least --sync-every)")
    p.add_argument("--backoff-steps", type=whole(0), default=100,
                   help="balancer: steps before another move after a revert (doubled per consecutive revert)")
    p.add_argument("--control", action="store_true",
                   help="also measure the noise floor: the same run with equal speeds and equal shares")
    p.add_argument("--timeout-s", type=finite(0.0), default=300.0,
                   help="collective timeout: a rank that stops answering ends the bench with an error after this long")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin each rank to its own CPU when there are at least --ranks usable CPUs (default; each "
                        "rank's speed is then its own and steadier)")
    mid = p.add_argument_group("mid-run straggler in the real trainer (--mid-run)")
    mid.add_argument("--mid-run", action="store_true",
                     help="per round, two `trainperf train` runs of gpt-tiny (balanced, unbalanced) with a busy process "
                          "on the slow rank's CPU from --hog-step: the median step of the last --last steps compared")
    mid.add_argument("--hog-step", type=whole(1), default=30, help="the step after which the busy process starts")
    mid.add_argument("--run-steps", type=whole(2), default=120, help="steps of each training run")
    mid.add_argument("--last", type=whole(1), default=40, help="the run's figure: median step time of its last N steps")
    mid.add_argument("--model", choices=("gpt-tiny", "mlp"), default="gpt-tiny",
                     help="gpt-tiny through `trainperf train` (default), or the bench's own MLP (--seq, --dim) "
                          "through Trainer.train_step")
    mid.add_argument("--config", default=None,
                     help="train this config's model instead of gpt-tiny (the bench sets steps, layout, logging)")
    mid.add_argument("--keep", default=None, metavar="DIR",
                     help="keep the run directories under DIR (each can be read with `trainperf diagnose`)")
    add_json_flag(p)
    p.set_defaults(func=balance_command)


def balance_command(args) -> int:
    if args.mid_run:
        from trainperf.bench.balance_midrun import measure_midrun, print_midrun

        args.global_batch = (64 if args.model == "mlp" else 16) if args.global_batch is None else args.global_batch
        res = measure_midrun(args)
        print_json(res) if args.json else print_midrun(res)
        return 0
    from trainperf.bench.balance import measure

    args.global_batch = 64 if args.global_batch is None else args.global_batch
    res = measure(args)
    if args.json:
        print_json(res)
    elif args.rounds > 1:
        from trainperf.bench.balance_rounds import print_rounds

        print_rounds(res)
    else:
        who = (f"rank {args.slow_rank} shares its CPU with a busy process" if args.busy else
               f"rank {args.slow_rank} does {args.slowdown}x work per sample")
        print(f"balance bench: {args.ranks} gloo ranks, {who}, "
              f"global batch {args.global_batch}, {args.steps} measured steps per arrangement")
        print(f"  per-sample compute (ms): {', '.join(f'{1e3 * p:.2f}' for p in res['per_sample_s'])}")
        print(f"  ideal step      {1e3 * res['ideal_step_s']:8.1f} ms  (global batch / summed speeds; compute only)")
        print(f"  overhead        {1e3 * res['overhead_s']:8.1f} ms  (step wall - slowest compute: all-reduce, optimizer, "
              "scheduling)")
        print(f"  unbalanced step {1e3 * res['unbalanced_step_s']:8.1f} ms  {res['unbalanced_vs_ideal']:.2f}x ideal"
              f"  shares {res['equal_shares']}")
        print(f"  balanced step   {1e3 * res['balanced_step_s']:8.1f} ms  {res['balanced_vs_ideal']:.2f}x ideal"
              f"  shares {res['shares']}  ({res['speedup']:.2f}x faster than unbalanced; "
              f"{res['balanced_vs_ideal_plus_overhead']:.2f}x ideal + overhead)")
        if "ideal_arm_step_s" in res:
            print(f"  measured ideal  {1e3 * res['ideal_arm_step_s']:8.1f} ms  (every rank {res['ideal_arm_factor']:.3f}x "
                  f"work on equal shares: the work perfectly divided); balanced {res['balanced_vs_ideal_arm']:.3f}x it")
        print(f"  slowest compute {1e3 * res['balanced_slowest_compute_s']:8.1f} ms  "
              f"{res['balanced_slowest_compute_vs_ideal']:.2f}x ideal  (balanced steps: residual imbalance + jitter)")
        if "control" in res:
            c = res["control"]
            print(f"  control         {1e3 * c['step_s']:8.1f} ms  {c['vs_ideal']:.2f}x its ideal  (equal speeds, equal "
                  "shares: the noise floor)")
        for d in res["decisions"]:
            kind = "refinement" if d.get("refinement") else "trigger"
            print(f"  decision at step {d['step']} ({kind}): imbalance {d['imbalance']:.2f}, "
                  f"{d['old_shares']} -> {d['new_shares']}, predicted gain {d['predicted_gain']:.1%}")
        for v in res.get("verdicts", []):
            print(f"  verdict at step {v['step']}: {v['verdict']} {v['new_shares']} (measured gain "
                  f"{v['measured_gain']:+.1%} +- {v['gain_se']:.1%}; slowest rank: {v['cause'] or '-'})")
    return 0



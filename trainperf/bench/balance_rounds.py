"""``trainperf bench balance --rounds N``: the balancer judged over N independent rounds, not one lucky run.

Each round is a whole bench run (:func:`trainperf.bench.balance.run_bench`): its own rank processes, a
fresh balancer from equal shares, the settling phase, then equal and balanced shares in alternating
blocks. A round's figure is ``balanced / unbalanced``: the mean step time with the balancer's shares over
the mean step time with equal shares, measured side by side in that round (below 1: balancing paid).

``--busy`` (``--outside-straggler``): the straggler is a busy process pinned to the slow rank's CPU.
``--control``: each round is followed by a control round without any straggler (no busy process, every
rank the same work) with the balancer on as in the straggler round; its ratio is what the balancer
costs or gains when there is nothing to balance (1 when it leaves the shares alone or reverts what it
tried), and its spread is the machine's noise for this measurement.

The summary counts the rounds at or below ``--target-ratio`` and those above 1 (balancing made the
step slower), with the median, the worst and the best ratio; the 1-minute load average before and
after each round says how busy the machine was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Callable


def _round_row(res: dict) -> dict:
    row = {"ratio": res["balanced_step_s"] / res["unbalanced_step_s"],
           "median_ratio": res["balanced_step_median_s"] / res["unbalanced_step_median_s"],
           "balanced_step_s": res["balanced_step_s"], "unbalanced_step_s": res["unbalanced_step_s"],
           "shares": res["shares"], "settled_shares": res["settled_shares"], "per_sample_s": res["per_sample_s"],
           "moves": [d["new_shares"] for d in res["decisions"]],
           "verdicts": [{k: v[k] for k in ("verdict", "old_shares", "new_shares", "measured_gain", "gain_se", "cause")}
                        for v in res["verdicts"]],
           "settle_steps": res["settle_steps"]}
    if "balanced_vs_ideal_arm" in res:
        row["balanced_vs_ideal_arm"] = res["balanced_vs_ideal_arm"]
        row["balanced_vs_ideal"] = res["balanced_vs_ideal"]
    return row


def summarize_rounds(ratios: list[float], target: float) -> dict:
    """Counts and spread of per-round ratios (balanced / unbalanced)."""
    return {"rounds": len(ratios), "target_ratio": target,
            "at_or_below_target": sum(r <= target for r in ratios), "above_1": sum(r > 1.0 for r in ratios),
            "median": statistics.median(ratios), "worst": max(ratios), "best": min(ratios)}


def measure_rounds(args, run_bench: Callable[[argparse.Namespace], dict]) -> dict:
    from tqdm import tqdm

    rounds, controls = [], []
    label = "outside straggler" if args.busy else f"{args.slowdown}x straggler"
    bar = tqdm(total=args.rounds * (2 if args.control else 1), desc=f"balance rounds ({label})", unit="run",
               file=sys.stderr, disable=None if not args.json else True)
    for i in range(args.rounds):
        load0 = os.getloadavg()[0]
        row = _round_row(run_bench(args))
        row.update(round=i + 1, load_1m_before=round(load0, 2), load_1m_after=round(os.getloadavg()[0], 2))
        rounds.append(row)
        bar.update()
        if args.control:
            # the same bench with nothing to balance: no busy process, every rank the same work; the balancer on
            quiet = argparse.Namespace(**{**vars(args), "busy": False, "slowdown": 1.0})
            load0 = os.getloadavg()[0]
            ctl = _round_row(run_bench(quiet))
            ctl.update(round=i + 1, load_1m_before=round(load0, 2), load_1m_after=round(os.getloadavg()[0], 2))
            controls.append(ctl)
            bar.update()
    bar.close()
    out = {"mode": "outside_straggler" if args.busy else "synthetic_straggler", "rounds": rounds,
           "summary": summarize_rounds([r["ratio"] for r in rounds], args.target_ratio)}
    if any("balanced_vs_ideal_arm" in r for r in rounds):
        arm = [r["balanced_vs_ideal_arm"] for r in rounds]
        out["summary"]["balanced_vs_ideal_arm"] = {"median": statistics.median(arm), "worst": max(arm),
                                                   "best": min(arm)}
    if controls:
        out["controls"] = controls
        out["control_summary"] = summarize_rounds([c["ratio"] for c in controls], args.target_ratio)
    out["setup"] = {k: getattr(args, k, None) for k in (
        "ranks", "slow_rank", "slowdown", "busy", "steps", "block", "global_batch", "micro_steps", "seq", "dim",
        "window", "min_steps", "threshold", "min_gain", "sync_every", "settle_steps", "verify", "verify_steps",
        "verify_block", "backoff_steps", "pin", "rounds", "control", "target_ratio")}
    out["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return out


def print_rounds(res: dict) -> None:
    s = res["summary"]
    who = "a busy process shares rank 1's CPU" if res["mode"] == "outside_straggler" else "synthetic straggler"
    print(f"balance bench, {s['rounds']} rounds ({who}): balanced / unbalanced step time per round")
    ctl = {c["round"]: c for c in res.get("controls", [])}
    head = f"{'round':>5} {'ratio':>7} {'median':>7} {'shares':>10} {'verdicts':<34} {'load':>10}"
    print(head + ("  control ratio" if ctl else ""))
    for r in res["rounds"]:
        verdicts = ", ".join(f"{v['verdict']} {v['new_shares']}" for v in r["verdicts"]) or "-"
        line = (f"{r['round']:>5} {r['ratio']:>7.3f} {r['median_ratio']:>7.3f} {str(r['shares']):>10} "
                f"{verdicts[:34]:<34} {r['load_1m_before']:>4.1f}-{r['load_1m_after']:<4.1f}")
        if r["round"] in ctl:
            c = ctl[r["round"]]
            line += f"  {c['ratio']:.3f} {c['shares']}"
        print(line)
    print(f"  <= {s['target_ratio']:.2f}: {s['at_or_below_target']} of {s['rounds']}; above 1.0: {s['above_1']}; "
          f"median {s['median']:.3f}, worst {s['worst']:.3f}, best {s['best']:.3f}")
    if "balanced_vs_ideal_arm" in s:
        a = s["balanced_vs_ideal_arm"]
        print(f"  balanced / measured ideal: median {a['median']:.3f}, worst {a['worst']:.3f}")
    if "control_summary" in res:
        c = res["control_summary"]
        print(f"  control (no straggler, balancer on): median {c['median']:.3f}, worst {c['worst']:.3f}, "
              f"best {c['best']:.3f}; above 1.0: {c['above_1']} of {c['rounds']}")

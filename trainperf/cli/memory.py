"""``trainperf memory CONFIG [--set ...] [--measure] [--budget-gb N] [--json]``.

Per activation-checkpointing mode (none, ratio 0.25, ratio 0.5, full, selective, and the
config's own mode): estimated bytes of parameters, gradients, optimizer states and activations
per rank; with ``--measure`` the same measured on one real micro-batch, and the forward+backward
time (median, modes interleaved); the largest micro-batch whose estimate fits the budget.
"""

from __future__ import annotations

from trainperf.cli._common import add_config_args, add_json_flag, print_json

MAX_BUDGET_GB = 1e6  # GB per rank: trainperf.memory.report.MAX_BUDGET_GB (not imported here: it imports torch)


def register(subparsers) -> None:
    p = subparsers.add_parser("memory", help="will it fit? memory per checkpointing mode, estimated and measured")
    add_config_args(p, required=False)
    p.add_argument("--measure", action="store_true",
                   help="also build the model and measure one micro-batch per mode (and time forward+backward)")
    p.add_argument("--budget-gb", type=float, default=None, metavar="N",
                   help="memory per rank in GB for the largest-micro-batch column, above 0 and at most 1e6 "
                        "(default: memory.checkpointing.budget_gb, else the device's memory)")
    p.add_argument("--reps", type=int, default=5, help="timed forward+backward repetitions per mode (default 5)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f}"


def _pair(est: dict, meas: dict | None, key: str) -> str:
    if meas is None:
        return _mb(est[key])
    return f"{_mb(est[key])} / {_mb(meas[key])}"


def render(report: dict) -> str:
    lines = [
        f"model: {report['model']}  blocks: {report['block_path']} x{report['n_blocks']}",
        f"micro_batch={report['micro_batch']} seq_len={report['seq_len']} dtype={report['dtype']} "
        f"optimizer={report['optimizer']} device={report['device']}",
    ]
    measured = report["measured"]
    head = ["mode", "params", "grads", "optimizer", "activations", "act err", "total", "step s wall/cpu",
            "recompute", "max mb"]
    rows = []
    # Recompute cost from CPU time on a CPU device (robust to other jobs), from wall time on a GPU.
    key = "step_cpu_s" if report["device"] == "cpu" else "step_time_s"
    base_time = next((m[key] for m in report["modes"] if m["mode"] == "none"), None)
    for m in report["modes"]:
        est, meas = m["estimate_bytes"], m["measured_bytes"]
        err = "-"
        if meas and meas["activations"]:
            err = f"{(est['activations'] / meas['activations'] - 1) * 100:+.1f}%"
        t, c = m["step_time_s"], m.get("step_cpu_s")
        cost = f"{(m[key] / base_time - 1) * 100:+.0f}%" if m.get(key) and base_time else "-"
        rows.append([m["label"], _pair(est, meas, "params"), _pair(est, meas, "grads"), _pair(est, meas, "optimizer"),
                     _pair(est, meas, "activations"), err, _pair(est, meas, "total"),
                     f"{t:.3f}/{c:.3f}" if t and c else "-", cost,
                     "-" if m["max_micro_batch"] is None else str(m["max_micro_batch"])])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines.append("MB per rank" + (" (estimate / measured)" if measured else " (estimate; --measure to measure)"))
    lines.append(fmt(head))
    lines.extend(fmt(r) for r in rows)
    if report["budget_bytes"]:
        lines.append(f"max mb: largest micro-batch whose estimate fits {report['budget_bytes'] / 1e9:.2f} GB "
                     f"({report['budget_source']})")
    if measured:
        lines.append("activations measured: bytes the autograd graph holds after one forward (saved-tensor hooks "
                     "+ storages still alive; each storage once); step s: " + report["timing"]["what"]
                     + f", {report['timing']['reps']} reps, {report['threads']} threads")
    return "\n".join(lines)


def run(args) -> int:
    from trainperf.config import load_config
    from trainperf.errors import UserError
    from trainperf.memory.report import memory_report

    if args.budget_gb is not None and not 0 < args.budget_gb <= MAX_BUDGET_GB:  # before int(GB x 1e9) overflows
        raise UserError(f"--budget-gb={args.budget_gb:g} must be above 0 and at most {MAX_BUDGET_GB:g} GB per rank "
                        "(memory per GPU in GB, e.g. 80)")
    cfg = load_config(args.config, args.overrides)
    if args.reps < 1:
        raise UserError(f"--reps={args.reps} must be at least 1")
    try:
        report = memory_report(cfg, measure=args.measure, budget_gb=args.budget_gb, reps=args.reps,
                               progress=not args.json)
    except (RuntimeError, MemoryError) as exc:  # an allocation the estimate did not foresee (another process?)
        text = str(exc)
        if not isinstance(exc, MemoryError) and "allocate" not in text and "out of memory" not in text:
            raise
        raise UserError(f"--measure ran out of memory ({text.splitlines()[0][:200] if text else 'MemoryError'}): "
                        "lower train.micro_batch or model.block_size, or leave out --measure") from None
    if args.json:
        print_json(report)
    else:
        print(render(report))
    return 0

"""``trainperf plan``: which 3D-parallel layouts fit, and how fast each will be (no torch)."""

from __future__ import annotations

import time

from trainperf.cli._common import add_json_flag, print_json, whole
from trainperf.errors import UserError
from trainperf.limits import MAX_BATCH, MAX_CONTEXT, MAX_DEGREE, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB

FLOP_CONVENTION = (
    "model FLOPs (trainperf.analytic): 6*(l*W_layer + V*h) + 12*l*a*d*s per token, full (non-causal) "
    "attention; for a GPT layer Korthikanti et al. 2022's 72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l)) per step "
    "(recompute not counted)"
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="rank the 3D-parallel layouts that fit a model on N GPUs (analytical, no GPU needed)",
        description="Search tensor x pipeline x data layouts, micro-batch, interleaving, sequence parallelism, "
        "recompute and ZeRO for a transformer on a GPU cluster; estimate memory per GPU and step time of each "
        "with an analytical model (trainperf/planner). Any of --tp/--pp/--dp/... fixes that part.",
    )
    m = p.add_argument_group("model (a preset or an explicit shape)")
    m.add_argument("--model", help="preset: gpt3-175b, gpt3-1t, gpt-530b, gpt-22b, llama-70b, gpt2-124m, ...")
    m.add_argument("--hidden", type=whole(1, MAX_HIDDEN), help="hidden size h")
    m.add_argument("--layers", type=whole(1, MAX_LAYERS), help="transformer layers l")
    m.add_argument("--heads", type=whole(1, MAX_HEADS), help="attention heads a")
    m.add_argument("--seq", type=whole(1, MAX_CONTEXT), help="sequence length s (default: the preset's, else 2048)")
    m.add_argument("--vocab", type=whole(1, MAX_VOCAB), help="vocabulary size V (default: the preset's, else 51200)")
    m.add_argument("--ffn-hidden", type=whole(1, 8 * MAX_HIDDEN), help="MLP width (default 4h); with --gated for SwiGLU")
    m.add_argument("--gated", action="store_true", help="SwiGLU MLP (three matrices)")
    m.add_argument("--kv-heads", type=whole(1, MAX_HEADS), help="key/value heads (GQA; default: as many as --heads)")
    m.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its directory): Llama GQA, "
                   "SwiGLU, tied output, vocab; GPT-2 n_embd/n_layer/n_head/n_positions")
    m.add_argument("--attention", choices=["flash", "eager"], help="attention kernel (default flash: "
                   "FlashAttention / SDPA; eager keeps the s x s scores as Megatron 2022 did)")
    m.add_argument("--bias", action=argparse_bool(), default=None,
                   help="biases in the linear layers and norms (GPT-2/3, Megatron GPT: yes; Llama: no; default no)")
    m.add_argument("--tied", action=argparse_bool(), default=None,
                   help="output layer tied to the token embedding (default: the preset's, else tied)")
    m.add_argument("--position", choices=["learned", "rope", "none"],
                   help="position embedding: a learned table (GPT), rotary (Llama) or none (ALiBi); default learned")
    m.add_argument("--norm", choices=["layernorm", "rmsnorm"], help="normalization (default layernorm)")
    c = p.add_argument_group("cluster")
    c.add_argument("--gpus", type=whole(1, MAX_DEGREE), default=8, help="number of GPUs (default 8)")
    c.add_argument("--gpu", default="a100-80gb", help="catalog key or NVML name (default a100-80gb)")
    c.add_argument("--catalog", metavar="FILE", help="YAML file extending the hardware catalog")
    c.add_argument("--global-batch", type=whole(1, MAX_BATCH), help="sequences per step (default: published for the preset, else ~4M tokens)")
    f = p.add_argument_group("fix parts of the layout (the rest is searched)")
    f.add_argument("--tp", type=whole(1, MAX_DEGREE), help="tensor-parallel degree")
    f.add_argument("--pp", type=whole(1, MAX_DEGREE), help="pipeline-parallel degree")
    f.add_argument("--dp", type=whole(1, MAX_DEGREE), help="data-parallel degree")
    f.add_argument("--microbatch", type=whole(1, MAX_BATCH), help="micro-batch size (sequences)")
    f.add_argument("--max-microbatch", type=whole(1, MAX_BATCH), default=16, help="largest micro-batch searched (default 16)")
    f.add_argument("--interleave", type=whole(1, MAX_LAYERS), help="virtual pipeline stages per GPU (interleaved 1F1B)")
    f.add_argument("--recompute", choices=["none", "selective", "full", "partial"],
                   help="activation recompute: full = every layer of every stage; partial = --recompute-layers "
                        "whole layers per stage (searched when not given); selective = Megatron's attention core")
    f.add_argument("--recompute-layers", type=whole(0, MAX_LAYERS), metavar="N",
                   help="with --recompute partial (implied): whole layers recomputed per pipeline stage")
    f.add_argument("--sequence-parallel", action=argparse_bool(), default=None, help="sequence parallelism (with TP)")
    f.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (3 = FSDP full shard)")
    f.add_argument("--cp", type=whole(1, MAX_DEGREE), help="context-parallel degree (default 1)")
    f.add_argument("--hsdp-shard", type=whole(1, MAX_DEGREE), metavar="N", help="HSDP: shard ZeRO states within groups of N "
                   "data-parallel ranks, replicate across groups (e.g. 8: one node)")
    s = p.add_argument_group("training stack (a preset, and mechanisms that override it)")
    s.add_argument("--stack", metavar="PRESET", help="megatron-2021, megatron-core, fsdp, torchtitan (default: "
                   "trainperf's own stack); --stacks lists what each sets")
    s.add_argument("--stacks", action="store_true", help="list the --stack presets and the mechanisms each sets, "
                   "and exit")
    s.add_argument("--dp-reduce", choices=["overlap", "after"], help="data-parallel gradient reduction overlapped "
                   "with the backward (DDP, Megatron-Core, FSDP) or after it (Megatron-LM 2021)")
    s.add_argument("--fused", action=argparse_bool(), default=None, help="fused softmax / dropout / norm / "
                   "activation kernels (Megatron, torch.compile); --no-fused: one kernel per elementwise op (eager)")
    s.add_argument("--distributed-optimizer", action=argparse_bool(), default=None, help="shard the optimizer "
                   "states over data parallel (ZeRO-1: gradient reduce-scatter, parameter all-gather)")
    s.add_argument("--grad-reduce-op", choices=["reduce-scatter", "all-reduce"], help="how a ZeRO-1/2 layout "
                   "reduces the gradients: reduce-scatter (Megatron's distributed optimizer, DeepSpeed ZeRO) or "
                   "all-reduce of the whole gradient before each rank steps its shard (DeepSpeed's BF16_Optimizer "
                   "under its pipeline engine): twice the traffic")
    s.add_argument("--float8", action=argparse_bool(), default=None, help="FP8 GEMMs in the linear layers "
                   "(torchao / Transformer Engine dynamic scaling; needs an FP8 peak in the catalog)")
    s.add_argument("--async-tp", "--tp-comm-overlap", dest="async_tp", action=argparse_bool(), default=None,
                   help="tensor-parallel communication overlapped with the GEMMs by decomposition (Megatron-Core "
                        "--tp-comm-overlap with Transformer Engine userbuffers, torchtitan AsyncTP); the megatron-core "
                        "preset has it on")
    s.add_argument("--fp8-weight-cache", action=argparse_bool(), default=None, help="under --float8, each weight "
                   "cast to FP8 once per step and reused by every micro-batch (Transformer Engine, as Megatron-Core "
                   "runs it: the megatron-core preset); --no-fp8-weight-cache: cast every micro-batch (torchao)")
    s.add_argument("--param-gather", choices=["overlap", "after"], help="the distributed optimizer's parameter "
                   "all-gather overlapped with the next forward (Megatron-Core --overlap-param-gather) or before it "
                   "(default: as --dp-reduce)")
    s.add_argument("--nvls", action=argparse_bool(), default=None, help="NVLink SHARP all-reduce in an NVSwitch 3 "
                   "node (H100 / H200 HGX; NCCL >= 2.17 uses it by default): --no-nvls for NCCL_NVLS_ENABLE=0")
    s.add_argument("--attention-kernel", choices=["fa2", "fa3"], help="FlashAttention generation: fa2 (Ampere's "
                   "mma.sync: FlashAttention-2, SDPA flash / memory-efficient, xformers; 2/3 of the rate on Hopper) "
                   "or fa3 (the GPU's native instructions: FlashAttention-3, cuDNN / Transformer Engine)")
    o = p.add_argument_group("output and model")
    o.add_argument("--top", type=whole(1), default=10, help="candidates shown / in --json (default 10)")
    o.add_argument("--explain", action="store_true", help="what each mechanism of the stack and the part (GEMM "
                   "ceiling, NCCL bandwidths, NVLink SHARP, TP overlap, FP8, overlapped reductions, fused kernels, "
                   "attention kernel) contributed to the best layout's step: the step timed again without it")
    o.add_argument("--baseline", metavar="TP,PP,DP", help="show where this layout ranks and why the best beats it "
                   "(default for gpt3-175b on 512 GPUs: the founding document's 8,4,16)")
    o.add_argument("--emit-config", metavar="FILE", help="write the best layout as a trainperf YAML config")
    o.add_argument("--set-constant", action="append", default=[], metavar="NAME=VALUE",
                   help="override a cost-model constant (repeatable; see --constants)")
    o.add_argument("--constants", action="store_true", help="list the cost-model constants and exit")
    o.add_argument("--devset-report", action="store_true", help="leave-one-source-out report on the development "
                   "set (errors, constant baseline, interval coverage; ~2 min) and exit; with --fast-report the "
                   "intervals reuse the outer folds (~20 s)")
    o.add_argument("--fast-report", action="store_true", help=argparse_suppress())
    o.add_argument("--calibrate", metavar="RUN_DIR", help="fit the stack efficiency to a finished trainperf run")
    o.add_argument("--measured", type=float, metavar="STEP_TIME_S",
                   help="fit the stack efficiency to one measured step of the layout you ran (fix it with "
                        "--tp/--pp/--dp/--microbatch/--recompute/--zero; else the best layout is taken as the one "
                        "measured) and show how every layout's prediction moves")
    add_json_flag(p)
    p.set_defaults(func=plan_command)


def argparse_bool():
    import argparse

    return argparse.BooleanOptionalAction


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


STACK_FLAGS = ("dp_reduce", "fused", "attention", "attention_kernel", "distributed_optimizer", "grad_reduce_op", "float8",
               "async_tp", "fp8_weight_cache", "param_gather", "nvls")


def _stack_from_args(args):
    from trainperf.planner.stack import get_stack, provenance

    overrides = {k: getattr(args, k, None) for k in STACK_FLAGS}
    stack = get_stack(args.stack, **overrides)
    if overrides.get("attention_kernel") and stack.attention == "eager":
        why = "--attention eager" if overrides.get("attention") else f"--stack {args.stack} (eager attention)"
        raise UserError(f"--attention-kernel {overrides['attention_kernel']} times FlashAttention, but {why} keeps the "
                        "s x s scores in memory and runs no FlashAttention kernel; drop --attention-kernel, or give "
                        "--attention flash")
    # the layout pins that are also stack mechanisms (sequence parallelism, recompute) are held by the search's
    # Fixed, not put in the stack (a search that frees the layout, as --measured's moves table does, must not
    # keep them): they show in the stack as given, with "flag" as their source
    if overrides.get("async_tp") and getattr(args, "tp", None) == 1:
        raise UserError("--async-tp overlaps tensor-parallel collectives, but --tp 1 has none; drop --async-tp or "
                        "raise --tp")
    if overrides.get("grad_reduce_op") and getattr(args, "zero", None) in (0, 3):
        raise UserError(f"--grad-reduce-op applies to ZeRO-1/2 layouts (a sharded optimizer), but --zero "
                        f"{args.zero} is pinned ({'DDP all-reduces' if args.zero == 0 else 'FSDP reduce-scatters'} "
                        "its gradients by itself); drop one of them")
    zero, dist = getattr(args, "zero", None), overrides.get("distributed_optimizer")
    if zero is not None and dist is not None and (zero == 0) == dist:
        raise UserError(f"--zero {zero} with --{'' if dist else 'no-'}distributed-optimizer: "
                        + ("ZeRO-0 keeps the optimizer whole on every rank; drop one of them"
                           if dist else f"ZeRO-{zero} shards the optimizer (a distributed optimizer); drop one of them"))
    pins = dict(sequence_parallel=getattr(args, "sequence_parallel", None))
    if zero is not None and stack.zero_pin() is not None and stack.zero_pin() != zero:
        # --zero overrides the preset's sharding: the stack shown says what the rows use
        pins |= dict(fsdp=zero == 3, distributed_optimizer=zero in (1, 2))
    rc = getattr(args, "recompute", None) or ("partial" if getattr(args, "recompute_layers", None) is not None else None)
    pins["recompute"] = (rc,) if rc else None
    shown = get_stack(args.stack, **{**overrides, **pins})
    return stack, provenance(args.stack, {**overrides, **pins}), shown


def _model_from_args(args):
    from dataclasses import replace

    from trainperf.planner.model import ModelSpec, from_preset

    explicit = {"hidden": args.hidden, "layers": args.layers, "heads": args.heads}
    if args.model and args.hf_config:
        raise UserError("give --model PRESET or --hf-config PATH, not both")
    kw = {}
    if args.seq:
        kw["seq"] = args.seq
    if args.vocab:
        kw["vocab"] = args.vocab
    if args.ffn_hidden:
        kw["ffn_hidden"] = args.ffn_hidden
    if args.gated:
        kw["gated"] = True
    for key in ("bias", "tied", "position", "norm"):
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    if args.kv_heads:
        kw["kv_heads"] = args.kv_heads
    attention = args.attention or getattr(args, "_stack_attention", None)
    if attention:
        kw["attention"] = attention
    if args.hf_config or args.model:
        if args.hf_config:
            from trainperf.analytic.hf import from_hf_config

            base = from_hf_config(args.hf_config, seq=args.seq)
        else:
            base = from_preset(args.model)
        kw.update({k: v for k, v in explicit.items() if v is not None})
        if not kw:
            return base
        shape_changed = set(kw) - {"attention"}
        return replace(base, name=f"{base.name} (modified)" if shape_changed else base.name, **kw)
    missing = [f"--{k}" for k, v in explicit.items() if v is None]
    if missing:
        raise UserError(f"give --model PRESET, --hf-config PATH or a shape; missing {', '.join(missing)} "
                        "(e.g. --hidden 12288 --layers 96 --heads 96)")
    kw.setdefault("seq", 2048)
    kw.setdefault("vocab", 51200)
    return ModelSpec(hidden=args.hidden, layers=args.layers, heads=args.heads, name="custom",
                     **{k: v for k, v in kw.items()})


def _baseline(args, model, gpus):
    from trainperf.planner.search import SEED_BASELINES

    if args.baseline is not None:
        try:
            tp, pp, dp = (int(x) for x in args.baseline.replace("x", ",").split(","))
        except ValueError:
            raise UserError(f"--baseline {args.baseline!r}: expected TP,PP,DP, e.g. --baseline 8,4,16") from None
        if min(tp, pp, dp) < 1:
            raise UserError(f"--baseline {args.baseline!r}: each degree must be at least 1, e.g. --baseline 8,4,16")
        cp = args.cp or 1
        if tp * pp * dp * cp != gpus:
            raise UserError(f"--baseline {args.baseline!r}: tensor {tp} x pipeline {pp} x data {dp}"
                            + (f" x context {cp}" if cp > 1 else "") + f" = {tp * pp * dp * cp} GPUs, but --gpus is "
                            f"{gpus}; give degrees whose product is {gpus}")
        for flag, pinned, value in (("--tp", args.tp, tp), ("--pp", args.pp, pp), ("--dp", args.dp, dp)):
            if pinned is not None and pinned != value:
                raise UserError(f"--baseline {args.baseline!r} has {flag.lstrip('-')} {value}, but {flag} {pinned} is "
                                "pinned, so no candidate has it; drop the pin or change the baseline")
        return (tp, pp, dp), "--baseline"
    seed = SEED_BASELINES.get((model.name, gpus))
    return (seed, "the founding document's layout") if seed else (None, "")


def plan_command(args) -> int:
    from trainperf.hardware.catalog import get_gpu, load_catalog
    from trainperf.planner.constants import DEFAULTS
    from trainperf.planner.search import Fixed, default_global_batch, rank_of, search

    constants = DEFAULTS.with_overrides(args.set_constant)
    if args.constants:
        return _print_constants(constants, args.json)
    if args.stacks:
        return _print_stacks(args.json)
    if args.devset_report:
        from trainperf.planner.loso import report

        print(report(as_json=args.json, nested=not args.fast_report))
        return 0
    stack, stack_source, shown_stack = _stack_from_args(args)
    args._stack_attention = stack.attention
    catalog = load_catalog(args.catalog)
    gpu = get_gpu(args.gpu, catalog)
    if stack.float8 and not getattr(gpu, "fp8_tflops", 0):
        fp8 = ", ".join(k for k, g in catalog.items() if getattr(g, "fp8_tflops", 0))
        raise UserError(f"--float8: {gpu.key} has no FP8 tensor cores in the catalog (fp8_tflops); drop --float8 "
                        f"or pick an FP8 part ({fp8}) or give fp8_tflops in a --catalog file")
    model = _model_from_args(args)
    calibration = None
    if args.calibrate:
        from trainperf.planner.calibrate import calibrate

        calibration = calibrate(args.calibrate, gpu, catalog, constants, stack=stack)
        constants = calibration.constants
    if args.global_batch:
        batch, batch_note = args.global_batch, "--global-batch"
    else:
        batch, batch_note = default_global_batch(model, args.gpus)
    recompute = args.recompute or ("partial" if args.recompute_layers is not None else None)
    fixed = Fixed(args.tp, args.pp, args.dp, args.microbatch, args.interleave, recompute,
                  args.sequence_parallel, args.zero, args.max_microbatch, args.cp, args.hsdp_shard,
                  args.recompute_layers)
    t0 = time.perf_counter()
    plan = search(model, gpu, args.gpus, batch, fixed, constants, stack=stack, keep_oom=_degrees_fixed(fixed))
    elapsed = time.perf_counter() - t0
    _check_finite(plan, args)
    moves = None
    if args.measured is not None:
        from trainperf.planner.calibrate import calibrate_measured

        measured_layout = plan.best.layout
        calibration = calibrate_measured(args.measured, model, gpu, measured_layout, batch, constants, stack=stack)
        calibration.report["run_dir"] = f"--measured {args.measured:g} s of {measured_layout.short()}"
        if not _fully_fixed(fixed):
            calibration.report["notes"].append(
                f"the layout was not fully fixed: took the predicted best, {measured_layout.short()}, as the one "
                "measured; fix --tp/--pp/--dp/--microbatch/--recompute/--zero to name the layout you ran")
        # every layout, before and after (the moves table); the plan itself keeps every pin
        # (a --zero given beside a preset that implies a ZeRO stage overrides the stack, so it stays)
        free = Fixed(max_micro_batch=args.max_microbatch, cp=args.cp, shard=args.hsdp_shard,
                     zero=fixed.zero if stack.zero_pin() is not None else None)
        t0 = time.perf_counter()
        try:
            before = search(model, gpu, args.gpus, batch, free, constants, stack=stack, explain_failure=False)
            after = search(model, gpu, args.gpus, batch, free, calibration.constants, stack=stack,
                           explain_failure=False)
            moves = _moves(before, after, args.top)
        except UserError:
            moves = []
            calibration.report["notes"].append("no layout fits once the layout pins are dropped, so there is no "
                                               "table of how the other layouts move")
        constants = calibration.constants
        plan = search(model, gpu, args.gpus, batch, fixed, constants, stack=stack, keep_oom=_degrees_fixed(fixed))
        elapsed += time.perf_counter() - t0

    base_degrees, base_source = _baseline(args, model, args.gpus)
    baseline = None
    if base_degrees:
        found = rank_of(plan, *base_degrees)
        baseline = {"degrees": base_degrees, "source": base_source, "rank": found[0] if found else None,
                    "estimate": found[1] if found else None,
                    "rejected": [r for r in plan.rejected if (r.get("tp"), r.get("pp"), r.get("dp")) == base_degrees]}
    emitted = None
    if args.emit_config is not None:
        from trainperf.cli.plan_config import emit_config

        emitted = emit_config(plan, args.emit_config)
    from trainperf.planner.interval import ACROSS, CALIBRATED

    spread = CALIBRATED if calibration else ACROSS
    pins = _pins(args, fixed)
    far = _far_function(model, gpu, calibration)
    explained = None
    if args.explain:
        from trainperf.planner.explain import explain

        explained = explain(plan.best, model, gpu, batch, constants, stack)

    if args.json:
        out = _as_json(plan, gpu, batch, batch_note, args.top, baseline, constants, calibration, elapsed, emitted, spread,
                       far)
        out["pins"] = pins
        out["notes"] = plan.notes
        out["stack"] = {"name": stack.name, "mechanisms": shown_stack.mechanisms(), "source": stack_source}
        if moves is not None:
            out["measured_moves"] = moves
        if explained is not None:
            out["explain"] = {"layout": plan.best.layout.short(), "step_time_s": round(plan.best.step_time_s, 4),
                              "mechanisms": [m.as_dict(plan.best.step_time_s) for m in explained]}
        print_json(out)
    else:
        from trainperf.planner.explain import render as render_explain
        from trainperf.planner.report import render

        print(render(plan, batch_note=batch_note, top=args.top, baseline=baseline, calibration=calibration,
                     elapsed=elapsed, emitted=emitted, flop_convention=FLOP_CONVENTION, moves=moves,
                     spread=spread, stack=shown_stack, pins=pins, far=far,
                     explained=render_explain(explained, plan.best) if explained is not None else None))
    return 0


def _far_function(model, gpu, calibration):
    """est -> the respects in which it is far from every development source ({} once calibrated: the user's own run
    sets the level, on the part and stack in question)."""
    if calibration:
        return lambda est: {}
    from trainperf.planner.distance import development_points, far_from, point_of

    dev = development_points()
    return lambda est: far_from(point_of(est, model, gpu), dev)


PIN_FLAGS = {  # flag (as the user types it, without --) -> Fixed attribute
    "tp": "tp", "pp": "pp", "dp": "dp", "microbatch": "micro_batch", "interleave": "interleave",
    "recompute": "recompute", "recompute-layers": "recompute_layers", "sequence-parallel": "sequence_parallel",
    "zero": "zero", "cp": "cp", "hsdp-shard": "shard",
}


def _pins(args, fixed) -> dict:
    """Every value the user fixed, by flag: the layout pins (each held in every candidate), the stack
    (preset and mechanisms given) and the cluster and batch."""
    out = {flag: getattr(fixed, attr) for flag, attr in PIN_FLAGS.items() if getattr(fixed, attr) is not None}
    if args.stack:
        out["stack"] = args.stack
    for k in STACK_FLAGS:
        if getattr(args, k, None) is not None:
            out[k.replace("_", "-")] = getattr(args, k)
    if args.global_batch:
        out["global-batch"] = args.global_batch
    out["gpus"] = args.gpus
    out["gpu"] = args.gpu
    return out


def _degrees_fixed(fx) -> bool:
    """--tp, --pp and --dp all given: the user asks about one split of the GPUs (timed even over budget)."""
    return all(v is not None for v in (fx.tp, fx.pp, fx.dp))


def _fully_fixed(fx) -> bool:
    return all(v is not None for v in (fx.tp, fx.pp, fx.dp, fx.micro_batch, fx.recompute, fx.zero))


def _moves(before, after, top: int) -> list[dict]:
    """Per layout (the calibrated plan's top ones): step time before and after calibration."""
    old = {e.layout: e for e in before.candidates}
    rows = []
    for e in after.candidates[:top]:
        b = old.get(e.layout)
        rows.append({"layout": e.layout.short(), "before_s": round(b.step_time_s, 4) if b else None,
                     "after_s": round(e.step_time_s, 4),
                     "change": round(e.step_time_s / b.step_time_s - 1, 4) if b else None,
                     "rank_before": before.candidates.index(b) + 1 if b else None})
    return rows


def _with_interval(est, spread, far=None) -> dict:
    d = est.as_dict()
    respects = far(est) if far else {}
    lo, hi = spread.bounds_for(est, len(respects))
    d["step_time_interval_s"] = [round(lo, 4), round(hi, 4)]
    d["interval_far_from_development"] = respects or None
    d["interval_made_of"] = spread.made_of(est, len(respects))
    return d


def _as_json(plan, gpu, batch, batch_note, top, baseline, constants, calibration, elapsed, emitted, spread,
             far=None) -> dict:
    from trainperf.planner.interval import unvalidated_part
    from trainperf.planner.search import explain

    best = plan.best
    out = {
        "model": plan.model.as_dict(),
        "model_description": plan.model.describe(),
        "gpu": gpu.as_dict(),
        "gpus": plan.gpus,
        "global_batch": batch,
        "global_batch_source": batch_note,
        "flop_convention": FLOP_CONVENTION,
        "peak_tflops_per_gpu": gpu.half_tflops,
        "peak": f"dense {gpu.half_dtype.upper()}",
        "best": _with_interval(best, spread, far),
        "candidates": [_with_interval(e, spread, far) for e in plan.candidates[:top]],
        "interval": spread.as_dict(),
        "interval_unvalidated_part": None if calibration else unvalidated_part(gpu),
        "candidates_total": len(plan.candidates),
        "evaluated": plan.evaluated,
        "out_of_memory_variants": plan.out_of_memory,
        "rejected": plan.rejected,
        "constants": constants.as_dict(),
        "search_s": round(elapsed, 3),
    }
    if baseline:
        est = baseline["estimate"]
        out["baseline"] = {
            "tp": baseline["degrees"][0], "pp": baseline["degrees"][1], "dp": baseline["degrees"][2],
            "source": baseline["source"], "rank": baseline["rank"],
            "best_variant": _with_interval(est, spread, far) if est else None,
            "slower_than_best": round(est.step_time_s / best.step_time_s - 1, 4) if est else None,
            "why_best_is_faster": explain(best, est) if est and est is not best else [],
            "rejected": baseline["rejected"],
        }
    if calibration:
        out["calibration"] = calibration.report
    if emitted:
        out["emitted_config"] = emitted
    return out


def _print_constants(constants, as_json: bool) -> int:
    rows = constants.describe()
    if as_json:
        print_json({name: {"value": value, "doc": doc} for name, value, doc in rows})
        return 0
    width = max(len(n) for n, _, _ in rows)
    for name, value, doc in rows:
        print(f"{name:<{width}}  {value:<10g}  {doc}")
    return 0


def _print_stacks(as_json: bool) -> int:
    from trainperf.planner.stack import PRESETS

    if as_json:
        print_json({name: {"description": doc, "mechanisms": stack.mechanisms()} for name, (stack, doc) in PRESETS.items()})
        return 0
    for name, (stack, doc) in PRESETS.items():
        mech = ", ".join(f"{k}={'|'.join(v) if isinstance(v, tuple) else v}"
                         for k, v in stack.mechanisms().items() if v is not None)
        print(f"{name}\n  {doc}\n  sets: {mech}")
    print("\nA flag given beside --stack (--dp-reduce, --fused, --attention, --attention-kernel, --distributed-optimizer, "
          "--grad-reduce-op, --float8, "
          "--async-tp, --sequence-parallel, --recompute, --zero) overrides the preset's value.")
    return 0


def _check_finite(plan, args) -> None:
    """A step time that is not a finite positive number comes from a constant or a catalog value far outside
    what a GPU is (a rate of 1e-300, a weight of 1e300): refused instead of ranked."""
    import math

    s = plan.best.step_time_s
    if not (math.isfinite(s) and 0 < s < 1e9):
        given = [f"--set-constant {c}" for c in (args.set_constant or [])] + ([f"--catalog {args.catalog}"]
                                                                              if getattr(args, "catalog", None) else [])
        raise UserError(f"the model gives a step time of {s!r} s for the best layout ({plan.best.layout.short()}): "
                        f"not a plausible figure; check {', '.join(given) or 'the inputs'} (a rate, bandwidth or "
                        "fraction far from any GPU's; `trainperf plan --constants` lists the defaults)")

"""Calibration from a real run: fit the stack's compute efficiency to what a run measured.

Two sources: a trainperf run directory (``--calibrate RUN_DIR``: ``config.yaml`` with the model
shape, degrees and batch, ``summary.json`` with ``tokens_per_s`` or ``mfu`` and the device), or
one measured step time of the layout being planned (``--measured STEP_TIME_S``). The planner
re-estimates that run and solves, by bisection, for the ``stack_efficiency`` that reproduces it.
Only compute scales with it: communication, bubbles and memory-bound kernels keep their model, so
a layout dominated by compute moves with the calibration and a communication-bound one less.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from trainperf.errors import UserError
from trainperf.hardware.catalog import GPUSpec, lookup_gpu
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import Layout, estimate
from trainperf.planner.model import ModelSpec

LOW, HIGH = 0.02, 2.0  # bounds of stack_efficiency searched by the calibration
GPU_NAME_KEYS = ("gpu_name", "device_name", "cuda_name", "gpu")


@dataclass
class Calibration:
    constants: Constants
    report: dict


def _read_json(path: str) -> dict:
    from trainperf.analytic.hf import read_json_object

    if not os.path.exists(path):
        raise UserError(f"{path} does not exist; pass the run directory of a finished `trainperf train` run")
    return read_json_object(path, "calibration file")


def _number(summary: dict, key: str) -> float | None:
    val = summary.get(key)
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
        return None
    return float(val)


def _run_shape_and_layout(cfg: dict, source: str = "config.yaml") -> tuple[ModelSpec, Layout, int, str]:
    """Model, layout and global batch of the run from its config.yaml (a dict)."""
    from trainperf.config.load import build_config
    from trainperf.models.shape import model_shape

    config = build_config(cfg, source=source)
    shape = model_shape(config)
    vocab = shape["vocab_size"] if isinstance(shape["vocab_size"], int) else 50304
    model = ModelSpec(  # trainperf's GPT (trainperf.memory.estimate.GPTShape.spec): untied head, biases, SDPA
        hidden=shape["n_embd"], layers=shape["n_layer"], heads=shape["n_head"], seq=shape["block_size"],
        vocab=vocab, ffn_hidden=shape.get("ffn_hidden"), gated=shape.get("ffn_hidden") is not None,
        tied=False, bias=bool(shape.get("bias", True)), position="learned", attention="flash",
        name=config.model.preset,
    )
    p = config.parallelism
    mode = config.memory.checkpointing.mode
    recompute = mode if mode in ("none", "selective", "full") else "full"
    dp = max(1, p.data) * p.data_shard
    layout = Layout(
        tp=p.tensor, pp=p.pipeline, dp=dp, micro_batch=config.train.micro_batch,
        interleave=p.interleave, recompute=recompute, sequence_parallel=p.sequence_parallel,
        zero=3 if p.data_shard > 1 else 0,
    )
    note = "" if recompute == mode else f"checkpointing mode {mode!r} modelled as full recompute"
    if config.train.global_batch == "auto":  # a hand-written config.yaml (train writes the resolved integer)
        from trainperf.config.resolve import resolve_global_batch

        resolve_global_batch(config)
        note = "; ".join(x for x in (note, f"train.global_batch: auto in {source}, taken as "
                                           f"{config.train.global_batch} (micro_batch x data degree)") if x)
    return model, layout, config.train.global_batch, note


def calibrate(run_dir: str, gpu: GPUSpec | None = None, catalog: dict | None = None, base: Constants = DEFAULTS,
              stack=None) -> Calibration:
    """Constants with ``matmul_peak_fraction`` fitted to the run in `run_dir`."""
    if not os.path.isdir(run_dir):
        raise UserError(f"--calibrate {run_dir!r} is not a directory; pass a run directory (runs/NAME)")
    summary = _read_json(os.path.join(run_dir, "summary.json"))
    tokens_per_s = _number(summary, "tokens_per_s")
    mfu = _number(summary, "mfu")
    peak = _number(summary, "peak_flops")
    achieved = _number(summary, "achieved_flops_per_s")
    if mfu is None and peak and achieved:
        mfu = achieved / peak
    if tokens_per_s is None and mfu is None:
        present = ", ".join(sorted(summary)) or "nothing"
        raise UserError(
            f"{run_dir}/summary.json has no usable measurement: it needs 'tokens_per_s', or 'mfu', or both "
            f"'achieved_flops_per_s' and 'peak_flops' (positive numbers); it has: {present}. "
            "Re-run `trainperf train` to completion (with monitor.mfu on for MFU)."
        )
    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise UserError(
            f"{cfg_path} is missing: calibration needs the run's model shape and layout, which `trainperf train` "
            "writes there; pass the run directory itself"
        )
    from trainperf.hardware.catalog import read_yaml_mapping

    cfg = read_yaml_mapping(cfg_path, "calibration file", "the run's resolved trainperf config (a mapping)")
    model, layout, global_batch, note = _run_shape_and_layout(cfg, cfg_path)

    run_gpu = None
    for key in GPU_NAME_KEYS:
        if isinstance(summary.get(key), str):
            run_gpu = lookup_gpu(summary[key], catalog)
            if run_gpu:
                break
    if run_gpu is None and str(summary.get("device", "")).startswith("cpu"):
        run_gpu = lookup_gpu("cpu", catalog)
    run_gpu = run_gpu or gpu
    if run_gpu is None:
        raise UserError(
            f"{run_dir}/summary.json does not name the device (keys {', '.join(GPU_NAME_KEYS)}); pass --gpu with the "
            "GPU the run used"
        )
    if peak and abs(peak / 1e12 - run_gpu.half_tflops) > 0.05 * run_gpu.half_tflops:
        run_gpu = replace(run_gpu, fp16_tflops=peak / 1e12, **({"bf16_tflops": peak / 1e12} if run_gpu.bf16_tflops else {}))

    if tokens_per_s is not None:
        target, what = global_batch * model.seq / tokens_per_s, "step_time_s"
    else:
        target, what = mfu, "mfu"
    try:
        constants, clamped, matched = _fit_shrunk(model, run_gpu, layout, global_batch, target, base, what, stack)
    except UserError as exc:
        given = f"tokens_per_s={tokens_per_s:g}" if tokens_per_s is not None else f"mfu={mfu:g}"
        raise UserError(f"--calibrate {run_dir}: its summary.json has {given}: {exc}") from None
    report = {
        "run_dir": run_dir,
        "measured": {"tokens_per_s": tokens_per_s, "mfu": mfu, "matched": what, "target": target, **matched},
        "run": {"model": model.as_dict(), "layout": layout.as_dict(), "global_batch": global_batch, "gpu": run_gpu.key},
        "stack_efficiency": {"default": base.stack_efficiency, "calibrated": constants.stack_efficiency},
        "notes": [n for n in (note, clamped) if n],
    }
    if gpu is not None and gpu.key != run_gpu.key:
        report["notes"].append(f"calibrated on {run_gpu.key}, planning for {gpu.key}: the efficiency may not transfer")
    return Calibration(constants, report)


def fit_efficiency(model: ModelSpec, gpu: GPUSpec, layout: Layout, global_batch: int, target: float,
                   base: Constants = DEFAULTS, *, what: str = "step_time_s", stack=None) -> tuple[Constants, str | None]:
    """Constants whose ``stack_efficiency`` makes ``layout``'s estimate hit ``target`` (a step time
    in s, or an MFU); bisection within [LOW, HIGH]. Returns (constants, note when clamped)."""
    from trainperf.planner.stack import DEFAULT as _default_stack

    st = stack or _default_stack
    if what == "step_time_s":
        value = lambda c: estimate(model, gpu, layout, global_batch, c, stack=st).step_time_s  # noqa: E731
        slower_is_higher = True
    else:
        value = lambda c: estimate(model, gpu, layout, global_batch, c, stack=st).mfu  # noqa: E731
        slower_is_higher = False
    lo, hi = LOW, HIGH
    clamped = None
    if (value(replace(base, stack_efficiency=hi)) > target) == slower_is_higher:
        lo = hi = HIGH
        clamped = (f"the measurement is faster than the model allows even at stack_efficiency {HIGH} "
                   "(communication or memory-bound time the model overestimates); kept the bound")
    elif (value(replace(base, stack_efficiency=lo)) < target) == slower_is_higher:
        lo = hi = LOW
        clamped = f"the measurement is slower than the model explains even at stack_efficiency {LOW} (overheads outside the model)"
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        too_fast = (value(replace(base, stack_efficiency=mid)) < target) == slower_is_higher
        lo, hi = (lo, mid) if too_fast else (mid, hi)
    return replace(base, stack_efficiency=round(0.5 * (lo + hi), 4)), clamped


def _fit_shrunk(model, gpu, layout, global_batch, measured: float, base: Constants, what: str, stack):
    """fit_efficiency to the measurement pulled toward the model's own prediction by the shipped
    partial-pooling weight (:mod:`trainperf.planner.interval`): one run sets the level only in part, and
    at most ``held_back_max_log`` of a large deviation is held back (:func:`~trainperf.planner.interval.shrink_cap`)."""
    from trainperf.planner.interval import CALIBRATED, CALIBRATION_WEIGHT, shrink_cap, shrunk_target
    from trainperf.planner.stack import DEFAULT as _default_stack

    st = stack or _default_stack
    est = estimate(model, gpu, layout, global_batch, base, stack=st)
    predicted = est.step_time_s if what == "step_time_s" else est.mfu
    _check_possible(measured, what, est, gpu, st)
    target = shrunk_target(predicted, measured, CALIBRATION_WEIGHT)
    constants, clamped = fit_efficiency(model, gpu, layout, global_batch, target, base, what=what, stack=stack)
    return constants, clamped, {"predicted_before": round(predicted, 6), "calibration_weight": CALIBRATION_WEIGHT,
                                "held_back_max_log": round(shrink_cap(CALIBRATED, CALIBRATION_WEIGHT), 6),
                                "matched_value": round(target, 6)}


def _check_possible(measured: float, what: str, est, gpu: GPUSpec, stack) -> None:
    """A measurement no GPU can produce (more model FLOPs per second than the dense peak; with FP8 GEMMs, than
    the FP8 peak) is a typo or a corrupt summary, not a level to calibrate to: refused, with the figure."""
    implied = measured if what == "mfu" else (est.mfu * est.step_time_s / measured if measured > 0 else float("inf"))
    fp8 = getattr(gpu, "fp8_tflops", 0.0) or 0.0
    limit = fp8 / gpu.half_tflops if stack.float8 and fp8 else 1.0
    if what != "mfu" and 0 < implied < 1e-7:  # ten million times slower than the part's peak: a unit, not a run
        raise UserError(
            f"the measured {measured:.4g} s implies {100 * implied:.2g}% of {gpu.key}'s dense peak in model FLOPs "
            f"({layout_text(est)}): ten million times slower than the GPU can go, so not a measurement of this "
            "layout; give seconds per step (not microseconds), and check the global batch and the layout")
    if not implied <= limit:
        shown = f"{what} {measured:.4g}" + ("" if what == "mfu" else " s")
        raise UserError(
            f"the measured {shown} implies {100 * implied:.3g}% of {gpu.key}'s dense "
            f"{'FP8' if limit > 1 else gpu.half_dtype.upper()} peak in model FLOPs ({layout_text(est)}): no run does "
            "that, so it is not a measurement of this layout on this GPU; check the figure, the GPU (--gpu), the "
            "global batch and the layout the run used")


def layout_text(est) -> str:
    n = est.layout.gpus
    return f"{est.layout.short()} on {n} GPU{'s' if n != 1 else ''}"


def calibrate_measured(step_time_s: float, model: ModelSpec, gpu: GPUSpec, layout: Layout, global_batch: int,
                       base: Constants = DEFAULTS, stack=None) -> Calibration:
    """``--measured STEP_TIME_S``: fit the efficiency to one measured step of ``layout``."""
    if not step_time_s > 0 or step_time_s == float("inf"):
        raise UserError(f"--measured {step_time_s}: give the measured seconds per training step, a positive number")
    constants, clamped, matched = _fit_shrunk(model, gpu, layout, global_batch, step_time_s, base, "step_time_s", stack)
    report = {
        "measured": {"step_time_s": step_time_s, "matched": "step_time_s", "target": step_time_s, **matched},
        "run": {"layout": layout.as_dict(), "global_batch": global_batch, "gpu": gpu.key},
        "stack_efficiency": {"default": base.stack_efficiency, "calibrated": constants.stack_efficiency},
        "notes": [n for n in (clamped,) if n],
    }
    return Calibration(constants, report)

"""Calibration from a real run: replace the default GEMM efficiency by the one a run measured.

A trainperf run directory holds ``config.yaml`` (the resolved config: model shape, degrees,
batch) and ``summary.json`` (``tokens_per_s`` always; ``mfu``, ``peak_flops`` /
``achieved_flops_per_s`` and the device name when the monitor recorded them). The planner
re-estimates that same run and solves, by bisection, for the ``matmul_peak_fraction`` that
reproduces the measured step time (from ``tokens_per_s``) or, without it, the measured MFU.
Everything else (bandwidth fractions, overlaps) keeps its default; the result says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from trainperf.errors import UserError
from trainperf.hardware.catalog import GPUSpec, lookup_gpu
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import Layout, estimate
from trainperf.planner.model import ModelSpec

GPU_NAME_KEYS = ("gpu_name", "device_name", "cuda_name", "gpu")


@dataclass
class Calibration:
    constants: Constants
    report: dict


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; pass the run directory of a finished `trainperf train` run") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}; is the run finished?") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def _number(summary: dict, key: str) -> float | None:
    val = summary.get(key)
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
        return None
    return float(val)


def _run_shape_and_layout(cfg: dict) -> tuple[ModelSpec, Layout, int, str]:
    """Model, layout and global batch of the run from its config.yaml (a dict)."""
    from trainperf.config.load import build_config
    from trainperf.config.resolve import model_shape

    config = build_config(cfg, source="config.yaml")
    shape = model_shape(config)
    vocab = shape["vocab_size"] if isinstance(shape["vocab_size"], int) else 50304
    model = ModelSpec(
        hidden=shape["n_embd"], layers=shape["n_layer"], heads=shape["n_head"], seq=shape["block_size"],
        vocab=vocab, ffn_hidden=shape.get("ffn_hidden"), gated=shape.get("ffn_hidden") is not None,
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
    return model, layout, config.train.global_batch, note


def calibrate(run_dir: str, gpu: GPUSpec | None = None, catalog: dict | None = None, base: Constants = DEFAULTS) -> Calibration:
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
    import yaml

    with open(cfg_path, encoding="utf-8") as f:
        cfg = yaml.safe_load(f) or {}
    model, layout, global_batch, note = _run_shape_and_layout(cfg)

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
    if peak and abs(peak / 1e12 - run_gpu.bf16_tflops) > 0.05 * run_gpu.bf16_tflops:
        run_gpu = replace(run_gpu, bf16_tflops=peak / 1e12, fp16_tflops=peak / 1e12)

    if tokens_per_s is not None:
        target, what = global_batch * model.seq / tokens_per_s, "step_time_s"
        value = lambda c: estimate(model, run_gpu, layout, global_batch, c).step_time_s  # noqa: E731
        slower_is_higher = True
    else:
        target, what = mfu, "mfu"
        value = lambda c: estimate(model, run_gpu, layout, global_batch, c).mfu  # noqa: E731
        slower_is_higher = False
    lo, hi = 0.005, 1.0
    clamped = None
    if (value(replace(base, matmul_peak_fraction=hi)) > target) == slower_is_higher:
        lo = hi = 1.0
        clamped = "the run is faster than the model allows even at 100% GEMM efficiency; kept 1.0"
    elif (value(replace(base, matmul_peak_fraction=lo)) < target) == slower_is_higher:
        lo = hi = 0.005
        clamped = "the run is slower than the model explains even at 0.5% GEMM efficiency (overheads outside the model)"
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        too_fast = (value(replace(base, matmul_peak_fraction=mid)) < target) == slower_is_higher
        lo, hi = (lo, mid) if too_fast else (mid, hi)
    fitted = 0.5 * (lo + hi)
    constants = replace(base, matmul_peak_fraction=round(fitted, 4))
    report = {
        "run_dir": run_dir,
        "measured": {"tokens_per_s": tokens_per_s, "mfu": mfu, "matched": what, "target": target},
        "run": {"model": model.as_dict(), "layout": layout.as_dict(), "global_batch": global_batch, "gpu": run_gpu.key},
        "matmul_peak_fraction": {"default": base.matmul_peak_fraction, "calibrated": constants.matmul_peak_fraction},
        "notes": [n for n in (note, clamped) if n],
    }
    if gpu is not None and gpu.key != run_gpu.key:
        report["notes"].append(f"calibrated on {run_gpu.key}, planning for {gpu.key}: the efficiency may not transfer")
    return Calibration(constants, report)

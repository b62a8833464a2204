"""FLOPs per token, the peak they are compared against, MFU and HFU.

Conventions (every figure names its own):

* ``flops_per_token_formula``: model FLOPs, PaLM appendix B: ``6N + 12*l*h*s`` per token (N:
  parameters without the token and position embeddings, which are lookups; an untied lm_head
  counts). Forward + backward matmuls, no recompute. Found for trainperf's GPT, a model with
  ``flops_per_token(seq_len)``, a Hugging Face ``config`` anywhere inside the model (a user's
  wrapper around a transformers model: the outermost submodule that carries one; N counts the
  whole model), or ``model.cfg`` with ``n_layer``/``n_embd``.
* ``flops_per_token_formula_hfu``: the formula plus the forward FLOPs that activation
  checkpointing recomputes (full recompute of a block adds ``2*N_block + 4*h*s`` per token per
  block, Narayanan et al. 2021; trainperf's selective policy keeps matmul and attention outputs
  and adds none). The blocks counted are those :mod:`trainperf.analytic.recompute` assigns, the
  same count the checkpointing applies.
* ``flops_per_token_counted``: :class:`StepFlopCounter` (``torch.utils.flop_counter``) over one
  real training step, on the batch and targets that step used (matmuls and attention as torch
  counts them; includes recompute when checkpointing is on). **HFU** uses this figure when it
  exists, else the formula with recompute.
* ``flops_per_token_counted_forward``: the part of that count outside autograd's backward: the
  forward, without recompute (checkpointing recomputes inside the backward).
* **MFU** uses the formula; where no formula applies, the counted model FLOPs: ``3 x`` the counted
  forward (the backward costs two forwards: the convention behind 6N). ``mfu_convention`` says
  which (``mfu_source``: ``formula`` | ``counted``).

Peaks: on CUDA the catalog's **dense** peak for the precision (``trainperf.hardware.catalog``);
on CPU (or an unknown GPU) a measured matmul peak: the best of a few square matmuls, measured
once per process and cached on disk per machine.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

_PEAK_CACHE: dict[tuple, dict] = {}


# ---------------------------------------------------------------------- analytic formula
def _spec(model: nn.Module, seq_len: int):
    """trainperf's GPT as the analytic spec (:mod:`trainperf.analytic`), else None."""
    from trainperf.models.gpt import GPT

    if not isinstance(model, GPT):
        return None
    from trainperf.memory.estimate import GPTShape

    return GPTShape.of(model.cfg).spec(seq_len)


def _shape(model: nn.Module) -> dict | None:
    cfg = getattr(model, "cfg", None)
    if cfg is not None and all(hasattr(cfg, k) for k in ("n_layer", "n_embd")):
        return {"n_layer": int(cfg.n_layer), "n_embd": int(cfg.n_embd)}
    from trainperf.models.hf import find_hf_module, hf_shape

    found = find_hf_module(model)
    if found is None:
        return None
    s = hf_shape(found[1].config)
    return {"n_layer": int(s["n_layer"]), "n_embd": int(s["n_embd"])} if s["n_layer"] and s["n_embd"] else None


def formula_with_note(model: nn.Module, seq_len: int) -> tuple[float | None, str]:
    """Model FLOPs per token by the formula (6N + 12*l*h*s, PaLM / nanoGPT) and where its shape came from;
    (None, why) when no formula applies."""
    spec = _spec(model, seq_len)
    if spec is not None:
        return spec.palm_flops_per_token(seq_len), PALM_NOTE + " (trainperf GPT, analytic spec)"
    from trainperf.models.hf import find_hf_module, hf_flops_per_token

    if getattr(type(model), "_trainperf_hf_base", None) is not None:  # model.hf: its flops_per_token is this
        return hf_flops_per_token(model, seq_len)
    if hasattr(model, "flops_per_token"):
        try:
            fpt = model.flops_per_token(seq_len)
            value = None if fpt is None else float(fpt)
        except Exception as exc:  # noqa: BLE001 - a user's method: its failure costs the MFU, not the run
            return None, f"no FLOP formula: the model's flops_per_token({seq_len}) raised {type(exc).__name__}: {exc}"[:300]
        if value is not None and not (math.isfinite(value) and value > 0):
            return None, f"no FLOP formula: the model's flops_per_token({seq_len}) returned {fpt!r}, not a positive number"
        return value, "the model's flops_per_token(seq_len)"

    found = find_hf_module(model)  # a transformers model anywhere inside (a user's wrapper hides its config)
    if found is not None:
        path, hf = found
        fpt, note = hf_flops_per_token(model, seq_len, hf_module=hf)
        return fpt, note + (f"; config of submodule {path!r}" if path else "")
    shape = _shape(model)
    if shape is None:
        return None, ("no FLOP formula for this model: it has no flops_per_token(seq_len), no Hugging Face config in "
                      "any submodule and no cfg.n_layer / cfg.n_embd")
    n = sum(p.numel() for p in model.parameters())
    return 6.0 * n + 12.0 * shape["n_layer"] * shape["n_embd"] * seq_len, PALM_NOTE + " (model.cfg shape)"


PALM_NOTE = "6N + 12*l*h*s per token (PaLM appendix B; N without the token and position embeddings, lookups)"


def formula_flops_per_token(model: nn.Module, seq_len: int) -> float | None:
    """6N + 12*l*h*s (PaLM / nanoGPT), see :func:`formula_with_note`. None when the shape is unknown."""
    return formula_with_note(model, seq_len)[0]


def recompute_flops_per_token(model: nn.Module, seq_len: int, ac_cfg) -> tuple[float | None, str]:
    """Extra forward FLOPs per token that activation checkpointing recomputes, with the convention.

    Which blocks are recomputed comes from :func:`trainperf.analytic.recompute.plan_kinds`, the
    count the checkpointing itself (:mod:`trainperf.memory.ac`) uses, so the two cannot round
    differently. A fully checkpointed block re-runs its forward, ``2 N_block + 4 h s`` per token
    (Narayanan et al. 2021); trainperf's selective policy keeps the matmul and attention outputs,
    so it re-runs no matmul FLOPs."""
    from trainperf.analytic.recompute import counts

    mode = getattr(ac_cfg, "mode", "none") if ac_cfg is not None else "none"
    if mode == "none":
        return 0.0, "no recompute"
    if mode == "budget":
        return None, "checkpointing mode budget: recompute depends on the plan chosen, see the counted figure"
    shape = _shape(model)
    if shape is None:
        return None, f"unknown model shape (checkpointing {mode})"
    l, h, s = shape["n_layer"], shape["n_embd"], seq_len
    n_full, n_sel = counts(mode, l, ratio=float(getattr(ac_cfg, "ratio", 0.25)),
                           every_k=int(getattr(ac_cfg, "every_k", 4)))
    layers = getattr(model, "layers", None)
    n_block = (sum(p.numel() for p in layers.parameters()) / max(l, 1)) if layers is not None else 12.0 * h * h
    per_block = 2.0 * n_block + 4.0 * h * s  # one forward of one block, per token
    if mode == "selective":
        return 0.0, f"selective on {n_sel}/{l} blocks: matmul and attention outputs kept, no matmul re-run"
    return n_full * per_block, f"{mode}: + one forward of {n_full}/{l} blocks"


# ---------------------------------------------------------------------- counted
def _flop_counter_base():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode


class StepFlopCounter:
    """Counts the FLOPs of the real training step it wraps: ``with StepFlopCounter() as c: step()``.

    ``total``: every FLOP torch's FlopCounterMode counts (matmuls, convolutions, attention; forward,
    backward and recompute). ``forward``: the part outside autograd's backward (the forward, without
    the recompute that checkpointing runs inside the backward); None where this torch cannot tell.
    Counting never raises into the step it counts: a failing formula is kept in ``error`` and the op
    runs as usual. The step is the real one (its batch, its targets, its micro-batches and
    accumulation), so counted FLOPs need no second pass over made-up inputs."""

    def __init__(self):
        base = _flop_counter_base()
        owner = self

        class _Counter(base):  # FlopCounterMode's per-op hook, plus the forward share and no exceptions
            def _count_flops(self, func_packet, out, args, kwargs):
                try:
                    fn = self.flop_registry.get(func_packet)
                    if fn is not None and torch._C._current_graph_task_id() == -1:  # not inside backward
                        owner._forward += fn(*args, **kwargs, out_val=out)
                    return super()._count_flops(func_packet, out, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - counting is best effort, the step is not
                    owner.error = owner.error or f"{type(exc).__name__}: {str(exc)[:160]}"
                    return out

        self._split = hasattr(base, "_count_flops") and hasattr(torch._C, "_current_graph_task_id")
        self._counter = (_Counter if self._split else base)(display=False, custom_mapping=_missing_flop_formulas())
        self._forward = 0
        self.error: str | None = None
        self.total: int | None = None
        self.forward: int | None = None

    def __enter__(self) -> "StepFlopCounter":
        self._counter.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._counter.__exit__(*exc)
        self.total = int(self._counter.get_total_flops())
        self.forward = int(self._forward) if self._split else None
        return False

    def per_token(self, tokens: int) -> tuple[float | None, float | None, str]:
        """(total per token, forward per token, note)."""
        if self.error:
            return None, None, f"FlopCounterMode failed: {self.error}"
        if not self.total or not tokens:
            return None, None, "FlopCounterMode counted no FLOPs (no matmul/attention ops it knows)"
        fwd = self.forward / tokens if self.forward else None
        return self.total / tokens, fwd, "counted"


def _missing_flop_formulas() -> dict:
    """Formulas for ops FlopCounterMode does not know yet, from its own attention formulas.

    CPU's fused attention (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) is
    missing from torch's registry (2.13), so attention FLOPs went uncounted on CPU and HFU read
    lower than MFU. Same convention as torch's CUDA kernels: full (non-causal) attention.
    """
    import torch.utils.flop_counter as fc

    aten = torch.ops.aten
    pairs = [("_scaled_dot_product_flash_attention_for_cpu", fc.sdpa_flop),
             ("_scaled_dot_product_flash_attention_for_cpu_backward", fc.sdpa_backward_flop)]
    out = {}
    for name, formula in pairs:
        op = getattr(aten, name, None)
        if op is not None and op not in fc.flop_registry:
            out[op] = getattr(formula, "__wrapped__", formula)  # FlopCounterMode wraps it again
    return out


# ---------------------------------------------------------------------- peak
def _catalog_dtype(precision: str) -> str:
    return {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32"}.get(precision, "fp32")


def _catalog_peak(spec, dtype: str) -> float | None:
    """The catalog's dense peak for ``dtype`` on ``spec``; a part without TF32 tensor cores (V100)
    runs FP32 matmuls at its FP32 peak whatever the TF32 flag says; None where the catalog has no
    figure (no entry, or BF16 on a V100, which runs it without tensor cores: measured instead)."""
    if spec is None:
        return None
    table = {"bf16": spec.bf16_tflops, "fp16": spec.fp16_tflops, "tf32": spec.tf32_tflops or spec.fp32_tflops,
             "fp32": spec.fp32_tflops}
    return table.get(dtype) or None


def peak_flops(device: torch.device, precision: str = "fp32") -> dict:
    """{"peak_flops", "peak_source"} for one device of this process.

    CUDA: the catalog's dense figure for the precision (fp32 precision means FP32 non-tensor-core
    peak unless TF32 matmuls are allowed). CPU or unknown GPU: a measured matmul peak."""
    if device.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(device)
        dtype = _catalog_dtype(precision)
        if dtype == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            dtype = "tf32"
        try:
            from trainperf.hardware.catalog import lookup_gpu

            spec = lookup_gpu(name)
        except Exception:  # noqa: BLE001 - the catalog is optional here
            spec = None
        tf = _catalog_peak(spec, dtype)
        if tf:
            if dtype == "tf32" and not spec.tf32_tflops:
                dtype = "fp32 (no TF32 tensor cores)"
            return {"peak_flops": tf * 1e12,
                    "peak_source": f"catalog {spec.key} dense {dtype} peak {tf:g} TFLOP/s ({name})"}
        return measured_matmul_peak(device, "bf16" if dtype in ("bf16", "fp16") else "fp32")
    if device.type == "xla":  # lazy tensors: an untimed trace, not a matmul; no peak rather than a wrong one
        return {"peak_flops": None, "peak_source": "not measured on XLA devices (MFU not reported)"}
    return measured_matmul_peak(device, "fp32")


def _cache_file() -> Path:
    root = os.environ.get("TRAINPERF_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainperf")
    return Path(root) / "matmul_peak.json"


def measured_matmul_peak(device: torch.device, dtype: str = "fp32", *, n: int | None = None, reps: int = 5,
                         use_disk_cache: bool = True) -> dict:
    """Best-of-``reps`` throughput of an ``n x n x n`` matmul: 2n^3 FLOPs / time.

    Measured once per process. The disk cache keeps the best figure seen on this machine (keyed by
    device name, dtype, size, threads and torch version), so a measurement taken while the machine
    was busy does not lower the peak for good; the figure used is max(this measurement, the cache)."""
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    if device.type == "cuda":
        name, n = torch.cuda.get_device_name(device), n or 8192
    else:
        name, n = platform.processor() or platform.machine(), n or 1024
    key = (device.type, name, dtype, n, torch.get_num_threads(), torch.__version__)
    if key in _PEAK_CACHE:
        return _PEAK_CACHE[key]
    a = torch.randn(n, n, dtype=tdtype, device=device)
    b = torch.randn(n, n, dtype=tdtype, device=device)
    best = float("inf")
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first is warm-up
            best = min(best, time.perf_counter() - t0)
    flops = 2.0 * n**3 / best
    how = "this run"
    skey, cache, data = "|".join(map(str, key)), _cache_file(), {}
    if use_disk_cache:
        try:
            data = json.loads(cache.read_text()) if cache.exists() else {}
            old = float(data.get(skey, {}).get("peak_flops", 0.0))
        except (OSError, ValueError, AttributeError, TypeError):  # unreadable or garbage: measure afresh
            data, old = {}, 0.0
        if old > flops:
            flops, how = old, f"best seen on this machine, cached in {cache}"
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    out = {"peak_flops": flops,
           "peak_source": f"measured: best of {reps} {dtype} {n}x{n} matmuls on {device.type}{threads} "
                          f"({flops / 1e9:.1f} GFLOP/s, {how})"}
    _PEAK_CACHE[key] = out
    if use_disk_cache and how == "this run":
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            data[skey] = {"peak_flops": flops}
            tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(cache)
        except OSError:
            pass
    return out


# ---------------------------------------------------------------------- MFU / HFU
MFU_FORMULA = "model FLOPs 6N+12*l*h*s per token (PaLM app. B) x tokens/s / peak"
MFU_COUNTED = ("model FLOPs counted on a real training step: 3 x its forward FLOPs (FlopCounterMode; the backward "
               "costs two forwards, as 6N assumes; no recompute) per token x tokens/s / peak (no formula for this model)")


def model_flops_per_token(flops: dict[str, Any]) -> tuple[float | None, str | None]:
    """The model FLOPs per token MFU uses and its source: the formula, else 3 x the counted forward."""
    if flops.get("flops_per_token_formula"):
        return flops["flops_per_token_formula"], "formula"
    fwd = flops.get("flops_per_token_counted_forward")
    if fwd:
        return 3.0 * fwd, "counted"
    return None, None


def utilization(tokens_per_s: float | None, flops: dict[str, Any], peak: dict, world: int = 1) -> dict:
    """MFU and HFU of a run from its throughput (tokens/s over all ranks) and a peak per device."""
    out: dict[str, Any] = {"mfu": None, "hfu": None, "mfu_convention": None, "hfu_convention": None,
                           "mfu_source": None}
    p = peak.get("peak_flops")
    if not tokens_per_s or not p:
        return out
    total_peak = p * max(world, 1)
    fpt, source = model_flops_per_token(flops)
    if fpt:
        out["mfu"] = tokens_per_s * fpt / total_peak
        out["mfu_source"] = source
        out["mfu_convention"] = MFU_FORMULA if source == "formula" else MFU_COUNTED
    hfu_fpt = flops.get("flops_per_token_counted") or flops.get("flops_per_token_formula_hfu")
    if hfu_fpt:
        out["hfu"] = tokens_per_s * hfu_fpt / total_peak
        out["hfu_convention"] = ("FlopCounterMode-counted FLOPs per token (incl. recompute) x tokens/s / peak"
                                 if flops.get("flops_per_token_counted")
                                 else "formula + recompute FLOPs per token x tokens/s / peak")
    return out

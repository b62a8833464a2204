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
on CPU (or an unknown GPU) a measured matmul peak: the best single timing of the model's own matmul
shapes (forward, input and weight gradients of every ``nn.Linear`` at the run's micro-batch rows)
and a square one, in the run's dtype and thread count, each timed in turn for a fraction of a
second; measured at the start of a run and again at its end (the best kept), and cached on disk
per machine (the best seen).
"""

from __future__ import annotations

import hashlib
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


def peak_flops(device: torch.device, precision: str = "fp32", *, shapes: list | None = None) -> dict:
    """{"peak_flops", "peak_source"} for one device of this process.

    CUDA: the catalog's dense figure for the precision (fp32 precision means FP32 non-tensor-core
    peak unless TF32 matmuls are allowed). CPU or unknown GPU: a measured matmul peak, over
    ``shapes`` (the model's own matmuls, :func:`matmul_shapes`) and a square one, in the precision's
    dtype; the dict then also holds ``measure`` (what :func:`remeasured_peak` repeats at the end)."""
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
        return measured_matmul_peak(device, "bf16" if dtype in ("bf16", "fp16") else "fp32", shapes=shapes)
    if device.type == "xla":  # lazy tensors: an untimed trace, not a matmul; no peak rather than a wrong one
        return {"peak_flops": None, "peak_source": "not measured on XLA devices (MFU not reported)"}
    # CPU: the matmuls in the run's own dtype (autocast to bf16 / fp16 runs its matmuls in it)
    return measured_matmul_peak(device, precision if precision in ("bf16", "fp16") else "fp32", shapes=shapes)


# The largest matmul the peak times (FLOPs): rows of a larger shape are cut to stay under it, so one
# timing stays near 10 ms on a CPU (a 1024^3 matmul is 2.1e9).
MAX_MATMUL_FLOPS = 2.2e9
MAX_SHAPES = 8  # the model's shapes timed: those with the largest share of its matmul FLOPs
MAX_OPERAND_BYTES = 64 * 2**20  # a shape whose fp32 operands and result pass this is left out (memory; a matmul
# that large runs at the machine's best, which the square one measures)


def matmul_shapes(model: nn.Module, rows: int, *, limit: int = MAX_SHAPES) -> list[tuple[int, int, int, bool, bool]]:
    """The matmuls a training step of ``model`` runs, as ``(m, k, n, a_transposed, b_transposed)``.

    ``rows``: the tokens of one micro-batch (micro_batch x seq_len). Each ``nn.Linear(in, out)``
    runs three: the forward ``x @ W.T`` (rows, in, out), the input gradient ``g @ W`` (rows, out,
    in) and the weight gradient ``g.T @ x`` (out, rows, in), with the operands laid out as autograd
    has them. The distinct ones, those with the largest share of the step's matmul FLOPs first, at
    most ``limit``; the rows of one above :data:`MAX_MATMUL_FLOPS` are cut, and one whose operands pass
    :data:`MAX_OPERAND_BYTES` is left out (a shape that large runs at the machine's best anyway)."""
    weight: dict[tuple, float] = {}
    for mod in model.modules():
        if isinstance(mod, nn.Linear) and mod.weight.dim() == 2:
            out_f, in_f = (int(x) for x in mod.weight.shape)  # the local shard under tensor parallelism
            for shape in ((rows, in_f, out_f, False, True), (rows, out_f, in_f, False, False),
                          (out_f, rows, in_f, True, False)):
                weight[shape] = weight.get(shape, 0.0) + 2.0 * rows * in_f * out_f
    out = []
    for (m, k, n, at, bt) in sorted(weight, key=lambda s: -weight[s])[:limit]:
        if 2.0 * m * k * n > MAX_MATMUL_FLOPS:  # cut the token dimension (m, or k for a weight gradient)
            if at:
                k = max(1, int(MAX_MATMUL_FLOPS / (2.0 * m * n)))
            else:
                m = max(1, int(MAX_MATMUL_FLOPS / (2.0 * k * n)))
        if (m, k, n, at, bt) not in out and 4 * (m * k + k * n + m * n) <= MAX_OPERAND_BYTES:
            out.append((m, k, n, at, bt))
    return out


def _cache_file() -> Path:
    root = os.environ.get("TRAINPERF_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainperf")
    return Path(root) / "matmul_peak.json"


def _operands(shape, tdtype, device):
    m, k, n, at, bt = shape
    a = torch.randn(k, m, dtype=tdtype, device=device).t() if at else torch.randn(m, k, dtype=tdtype, device=device)
    b = torch.randn(n, k, dtype=tdtype, device=device).t() if bt else torch.randn(k, n, dtype=tdtype, device=device)
    return a, b


BURST = 3  # timings of one shape in a row (a round): the first after another shape finds a cold cache


def _time_matmuls(device: torch.device, tdtype, shapes: list[tuple], reps: int, budget_s: float) -> tuple[float, tuple, int]:
    """(best FLOP/s, its shape, timings taken): every shape once untimed, then rounds of :data:`BURST`
    timings of each shape in turn until ``reps`` rounds are done and ``budget_s`` has passed (or 2 x
    ``budget_s`` whatever the count)."""
    ops = [(s, *_operands(s, tdtype, device)) for s in shapes]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _, a, b in ops:  # warm-up: thread pool, packing buffers, clocks
        a @ b
    best, best_shape, taken, done = 0.0, shapes[0], 0, 0
    t_begin = time.perf_counter()
    while True:
        for shape, a, b in ops:
            for _ in range(BURST):  # back to back, as a layer's matmuls run: its operands in cache
                sync()
                t0 = time.perf_counter()
                a @ b
                sync()
                dt = time.perf_counter() - t0
                taken += 1
                rate = 2.0 * shape[0] * shape[1] * shape[2] / dt if dt > 0 else 0.0
                if rate > best:
                    best, best_shape = rate, shape
        done += 1
        spent = time.perf_counter() - t_begin
        if (done >= reps and spent >= budget_s) or (done >= 1 and spent >= 2 * budget_s):
            return best, best_shape, taken


def _shape_text(shape: tuple) -> str:
    m, k, n, at, bt = shape
    return f"{f'({k}x{m})^T' if at else f'({m}x{k})'}@{f'({n}x{k})^T' if bt else f'({k}x{n})'}"


def measured_matmul_peak(device: torch.device, dtype: str = "fp32", *, n: int | None = None, reps: int = 2,
                         shapes: list | None = None, budget_s: float | None = None, use_disk_cache: bool = True,
                         fresh: bool = False) -> dict:
    """The best throughput (2mkn FLOPs / time) of the model's own matmuls (``shapes``, from
    :func:`matmul_shapes`) and an ``n x n x n`` one, each timed in turn (:func:`_time_matmuls`: at least
    ``reps`` rounds, for ``budget_s``, 0.25 s by default, at most twice that), the best single timing kept.

    Measured once per process (``fresh``: again, the end of a run). The disk cache keeps the best
    figure seen on this machine (keyed by device name, dtype, shapes, threads and torch version), so
    a measurement taken while the machine was busy does not lower the peak for good; the figure used
    is max(this measurement, the cache). ``measure`` in the result says how to measure it again."""
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    if device.type == "cuda":
        name, n = torch.cuda.get_device_name(device), n or 8192
    else:
        name, n = platform.processor() or platform.machine(), n or 1024
    all_shapes = [tuple(s) for s in (shapes or [])]
    if (n, n, n, False, False) not in all_shapes:
        all_shapes.append((n, n, n, False, False))
    budget = 0.25 if budget_s is None else budget_s
    digest = hashlib.sha1(repr(all_shapes).encode()).hexdigest()[:10]
    key = (device.type, name, dtype, n if not shapes else f"{len(all_shapes)} shapes {digest}",
           torch.get_num_threads(), torch.__version__)
    if key in _PEAK_CACHE and not fresh:
        return _PEAK_CACHE[key]
    flops, best_shape, taken = _time_matmuls(device, tdtype, all_shapes, reps, budget)
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
    what = (f"the model's {len(set(map(tuple, shapes)))} matmul shapes and {n}x{n}x{n}" if shapes else f"{n}x{n}")
    best_at = f", best {_shape_text(best_shape)}" if shapes and how == "this run" else ""
    out = {"peak_flops": flops,
           "peak_source": f"measured: best of {taken} {dtype} matmuls of {what} on {device.type}{threads} "
                          f"({flops / 1e9:.1f} GFLOP/s{best_at}, {how})",
           "measure": {"device": device, "dtype": dtype, "n": n, "reps": reps, "shapes": shapes, "budget_s": budget,
                       "use_disk_cache": use_disk_cache}}
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


def remeasured_peak(peak: dict) -> dict:
    """The best of ``peak`` (measured at the start of a run) and the same matmuls measured again now
    (the end of the run: a machine busy at the start, or clocks not yet up, set too low a peak).
    ``peak_flops_start`` keeps the figure the run's step records divided by. A catalog peak (no
    ``measure``) is returned as it is."""
    how = peak.get("measure")
    if not how or not peak.get("peak_flops"):
        return peak
    end = measured_matmul_peak(fresh=True, **how)
    start = float(peak["peak_flops"])
    best = max(start, float(end["peak_flops"] or 0.0))
    which = "the start" if best == start else "the end"
    src = end["peak_source"] if best > start else peak["peak_source"]
    return {**peak, "peak_flops": best, "peak_flops_start": start,
            "peak_source": f"{src}; measured at the start and end of the run, the best kept (from {which}: start "
                           f"{start / 1e9:.1f}, end {float(end['peak_flops']) / 1e9:.1f} GFLOP/s)"}


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

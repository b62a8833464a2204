"""GPU suite: an ablation table for gpt2-124m on one GPU, in one command (fits in 8 minutes on an H200).

    python benchmarks/gpu_suite.py                 # CUDA: gpt2-124m, the full table
    python benchmarks/gpu_suite.py --smoke         # CPU, tiny shapes, seconds: the same code path (a test)
    python benchmarks/gpu_suite.py --json out.json # also write the rows as JSON

Rows are cumulative, each adds one optimization to the previous one:

    fp32 eager -> bf16 -> + compile -> + fused AdamW -> + HybridLoader -> + checkpointing (full) at the
    largest micro-batch that fits

Per row: tokens/s (wall clock over the timed steps, after warm-up steps that include compilation),
MFU (model FLOPs 6N + 12*l*h*s per token, against ONE peak for every row: the catalog's dense BF16
peak on CUDA, a measured fp32 matmul peak on CPU), peak memory (torch.cuda.max_memory_allocated;
not measured on CPU), and the memory estimate of trainperf.memory.estimate beside it.
Tune row (CUDA only, after the table): the command `trainperf tune configs/gpt-tiny.yaml --budget-min 3`
as a user runs it (a subprocess, --json), reported as its side-by-side speed-up of the tuned config over
the default and the settings it changed. Largest batch: doubling the micro-batch until CUDA runs out of memory (eager, with checkpointing);
on CPU (--smoke) the estimate against --cpu-budget-mb decides instead. Data: synthetic tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

ROWS = [
    ("fp32 eager", ["precision.dtype=fp32", "optimizer.type=adamw", "optimizer.impl=foreach"]),
    ("bf16", ["precision.dtype=bf16"]),
    ("+ compile", ["compile.enabled=true"]),
    ("+ fused AdamW", ["optimizer.type=fused_adam", "optimizer.impl=fused"]),
    ("+ HybridLoader", ["data.loader=hybrid"]),
    ("+ checkpointing, largest batch", ["memory.checkpointing.mode=full"]),
]


def base_overrides(smoke: bool, micro: int) -> list[str]:
    common = ["data.source=synthetic", "run.eval_every=0", "run.sample_tokens=0", "run.progress=false",
              "checkpoint.at_end=false", "monitor.jsonl=false", "schedule.warmup_steps=2", "run.steps=1000"]
    if smoke:
        return common + ["run.device=cpu", "model.preset=tiny", "model.n_layer=2", "model.n_head=2",
                         "model.n_embd=32", "model.block_size=32", "run.threads=1", "compile.backend=eager",
                         f"train.micro_batch={micro}", f"train.global_batch={micro}"]
    # vocab_size explicit: with "auto" the synthetic data's 256 tokens would shrink the embedding (124M -> 85M)
    return common + ["run.device=cuda", "model.preset=gpt2-124m", "model.vocab_size=50304",
                     f"train.micro_batch={micro}",
                     f"train.global_batch={micro}"]


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _close(trainer) -> None:
    close = getattr(getattr(trainer, "data", None) and trainer.data.train, "close", None)
    if close is not None:
        close()  # loader threads / worker processes / shared memory


def build(overrides: list[str]):
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.train.build import build_trainer

    cfg = load_config(None, overrides)
    return build_trainer(resolve(cfg, world_size=1), verbose=False)


def estimate_bytes(trainer) -> int | None:
    from trainperf.memory.estimate import GPTShape, estimate_gpt
    from trainperf.memory.plan import plan_of

    cfg, model = trainer.cfg, trainer.model
    if not hasattr(model, "cfg"):
        return None
    ac = cfg.memory.checkpointing
    plan = plan_of(ac.mode, model.cfg.n_layer, ratio=ac.ratio, every_k=ac.every_k) if ac.mode != "none" else None
    kw = {"plan": plan} if plan is not None else {}
    est = estimate_gpt(GPTShape.of(model.cfg), micro_batch=cfg.train.micro_batch, seq_len=trainer.data.seq_len,
                       dtype=cfg.precision.dtype, optimizer=cfg.optimizer.type, device=trainer.device.type, **kw)
    return est.total


def time_row(overrides: list[str], *, warmup: int, steps: int, peak: float) -> dict:
    from trainperf.monitor.flops import formula_flops_per_token

    trainer = build(overrides)
    cuda = trainer.device.type == "cuda"
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(warmup):
            trainer.train_step()
        warm_s = time.perf_counter() - t0
        tokens, secs = 0, 0.0
        for _ in range(steps):
            res = trainer.train_step()  # the timer's end-of-step event sync bounds the step on CUDA
            tokens += res.tokens
            secs += res.step_time
        float(res.loss)  # host-device sync point: everything above has run
        tps = tokens / secs
        fpt = formula_flops_per_token(trainer.model, trainer.data.seq_len)
        return {"micro_batch": trainer.cfg.train.micro_batch, "tokens_per_s": tps, "step_ms": 1000 * secs / steps,
                "mfu": tps * fpt / peak if fpt else None, "warmup_s": warm_s,
                "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "estimate_bytes": estimate_bytes(trainer), "notes": dict(trainer.notes)}
    finally:
        _close(trainer)
        del trainer
        _free()


def largest_batch(overrides_for, start: int, *, smoke: bool, cpu_budget: int, cap: int, deadline: float) -> tuple[int, str]:
    """Double the micro-batch while a step fits."""
    best, b = start, start
    while b * 2 <= cap and time.time() < deadline:
        b *= 2
        ov = overrides_for(b) + ["compile.enabled=false"]
        if smoke:
            trainer = build(ov)
            est = estimate_bytes(trainer)
            _close(trainer)
            del trainer
            if est is None or est > cpu_budget:
                break
            best = b
            continue
        trainer = None
        try:
            trainer = build(ov)
            trainer.train_step()
            trainer.train_step()
            torch.cuda.synchronize()
            best = b
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            _close(trainer)
            trainer = None
            _free()
    how = (f"estimate <= {cpu_budget / 2**20:.0f} MiB (CPU smoke)" if smoke
           else "doubling until CUDA OOM (eager, checkpointing on)")
    return best, how + (f"; capped at {cap}" if best * 2 > cap else "")


def run_suite(smoke: bool, *, warmup: int, steps: int, micro: int, budget_s: float, cpu_budget_mb: int) -> dict:
    from trainperf.monitor.flops import peak_flops

    device = torch.device("cpu" if smoke else "cuda")
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_suite: no CUDA device here; run with --smoke for the CPU path")
    if smoke:
        torch.set_num_threads(1)  # as the rows run (run.threads=1), so the measured peak matches
    peak = peak_flops(device, "bf16" if device.type == "cuda" else "fp32")
    deadline = time.time() + budget_s
    rows, acc = [], []
    for name, extra in ROWS:
        acc = acc + extra
        row = {"row": name, "overrides": list(acc)}
        if time.time() > deadline:
            row["skipped"] = f"time budget of {budget_s:.0f} s spent"
            rows.append(row)
            continue
        mb = micro
        if name.startswith("+ checkpointing"):
            mb, how = largest_batch(lambda b: base_overrides(smoke, b) + acc, micro, smoke=smoke,
                                    cpu_budget=cpu_budget_mb * 2**20, cap=4 * micro if smoke else 512,
                                    deadline=deadline - 90)
            row["largest_batch"] = how
        try:
            row.update(time_row(base_overrides(smoke, mb) + acc, warmup=warmup, steps=steps, peak=peak["peak_flops"]))
        except Exception as exc:  # noqa: BLE001 - a row that cannot run says why; the table goes on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if name.startswith("+ HybridLoader"):
                acc = [o for o in acc if o != "data.loader=hybrid"]
        rows.append(row)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "smoke": smoke,
            "torch": torch.__version__, "peak_flops": peak["peak_flops"], "peak_source": peak["peak_source"],
            "mfu_convention": "6N + 12*l*h*s FLOPs per token x tokens/s / the peak above (same peak every row)",
            "warmup_steps": warmup, "timed_steps": steps, "rows": rows}


TUNE_CONFIG = "configs/gpt-tiny.yaml"


def tune_row(budget_min: float) -> dict:
    """``trainperf tune configs/gpt-tiny.yaml --budget-min N --json``, the user's command, in a subprocess."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    cmd = ["trainperf", "tune", TUNE_CONFIG, "--budget-min", f"{budget_min:g}"]
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-m", *cmd, "--json", "--out", out], capture_output=True, text=True,
                              cwd=str(root), timeout=budget_min * 60 + 300)
    row = {"row": "tune", "command": " ".join(cmd)}
    if proc.returncode != 0:
        return {**row, "error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] or ''}"}
    doc = json.loads(proc.stdout)
    d, b = doc["default"], doc["best"]
    changes = {k: v for k, v in b["settings"].items() if d["settings"].get(k) != v}
    return {**row, "speedup": doc["speedup"], "default_tokens_per_s": d["tokens_per_s"],
            "best_tokens_per_s": b["tokens_per_s"], "changes": changes, "elapsed_s": doc["elapsed_s"],
            "budget_s": doc["budget_s"], "trials": len(doc["trials"]),
            "statuses": {s: sum(t["status"] == s for t in doc["trials"]) for s in ("ok", "pruned", "oom", "failed")}}


def _gib(x):
    return f"{x / 2**30:.3g}" if x else "-"


def table(result: dict) -> str:
    lines = [f"device {result['device']}, torch {result['torch']}; MFU against {result['peak_source']}",
             "| row | micro-batch | tokens/s | ms/step | MFU | peak mem GiB (measured) | estimate GiB | est/meas |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['row']} | - | - | - | - | - | - | {r.get('skipped') or r.get('error')} |")
            continue
        ratio = (f"{r['estimate_bytes'] / r['peak_mem_bytes']:.2f}"
                 if r.get("estimate_bytes") and r.get("peak_mem_bytes") else "-")
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(f"| {r['row']} | {r['micro_batch']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {mfu} | "
                     f"{_gib(r.get('peak_mem_bytes'))} | {_gib(r.get('estimate_bytes'))} | {ratio} |")
    t = result.get("tune")
    if t and "speedup" in t:
        lines.append(f"tune: `{t['command']}`: x{t['speedup']:.3f} side by side ({t['default_tokens_per_s']:,.0f} -> "
                     f"{t['best_tokens_per_s']:,.0f} tokens/s), changes {t['changes'] or 'none'}, "
                     f"{t['elapsed_s']:.0f} s of {t['budget_s']:.0f} s, trials {t['statuses']}")
    elif t:
        lines.append(f"tune: {t.get('skipped') or t.get('error')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, seconds (the same code path)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default 20; smoke 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per row, incl. compilation (default 5; smoke 1)")
    p.add_argument("--micro-batch", type=int, default=None, help="micro-batch of rows 1-5 (default 16; smoke 4)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting rows after this many seconds")
    p.add_argument("--cpu-budget-mb", type=int, default=8, help="--smoke: memory budget for the largest batch")
    p.add_argument("--tune-budget-min", type=float, default=3.0,
                   help="CUDA: budget of the tune row (trainperf tune configs/gpt-tiny.yaml); 0 skips it")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    a = p.parse_args(argv)
    steps = a.steps or (3 if a.smoke else 20)
    warmup = a.warmup or (1 if a.smoke else 5)
    micro = a.micro_batch or (4 if a.smoke else 16)
    result = run_suite(a.smoke, warmup=warmup, steps=steps, micro=micro, budget_s=a.budget_s,
                       cpu_budget_mb=a.cpu_budget_mb)
    if a.smoke or not a.tune_budget_min:
        result["tune"] = {"row": "tune", "skipped": "GPU only (--smoke)" if a.smoke else "--tune-budget-min 0"}
    else:
        result["tune"] = tune_row(a.tune_budget_min)
    print(table(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``fit``: the run around the step — resume, log, evaluate, checkpoint, summarize."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from trainperf.config.load import dump_yaml
from trainperf.monitor.monitor import Monitor
from trainperf.monitor.sinks import JSONLSink
from trainperf.runio import previous_name, write_json  # noqa: F401 - previous_name: importable from here
from trainperf.train.loop import Trainer


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=False,
                disable=not (enabled and sys.stderr.isatty()))


def fit(trainer: Trainer, *, resume: str = "auto", verbose: bool = True) -> dict:
    cfg = trainer.cfg
    run_dir = Path(cfg.run_dir())
    main = trainer.is_main
    resumed_from = trainer.resume(resume)  # the trainer's Checkpointer: one file, or sharded DCP (collective)
    say = print if (verbose and main) else (lambda *a, **k: None)
    if resumed_from is not None and resumed_from >= cfg.run.steps:
        return _already_finished(trainer, run_dir, resumed_from, say)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resumed_from is None:
            _set_aside_previous_run(run_dir, say)
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    if resumed_from is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank opens its log after rank 0 set the previous run's aside
    sink = JSONLSink(run_dir / "metrics.jsonl", truncate_after_step=resumed_from) if (main and cfg.monitor.jsonl) else None
    # Every rank: device sampler, profiler window, FLOPs/peak; records go through it (JSONL, TensorBoard, Prometheus).
    monitor = sink = Monitor.for_trainer(trainer, run_dir, jsonl=sink, resumed_from=resumed_from)
    if resumed_from is not None:
        say(f"resume: continuing from the checkpoint of step {resumed_from}")

    n_params = sum(p.numel() for p in trainer.pm.parameters())  # this rank's parts (the whole model in one process)
    say(f"train: {n_params / 1e6:.2f}M parameters | device {trainer.device} | precision {cfg.precision.dtype} | "
        f"global batch {cfg.train.global_batch} x {trainer.data.seq_len} tokens | accumulation {trainer.accum} | "
        f"{cfg.run.steps} steps -> {run_dir}")

    initial_val = trainer.evaluate() if trainer.step == 0 else None
    if initial_val is not None:
        say(f"step 0: val loss {initial_val:.4f}")
    last_loss = float("nan")
    val_loss = initial_val
    tokens = 0
    train_time = 0.0
    bar = _progress(cfg.run.steps, trainer.step, cfg.run.progress and main)
    start_step = trainer.step
    t_start = time.perf_counter()
    try:
        while trainer.step < cfg.run.steps:
            monitor.before_step(trainer.step)
            # CUDA OOM: allocator snapshot written before the error propagates; FLOPs counted on one real step
            with monitor.oom_guard(), monitor.counting():
                res = trainer.train_step()
            monitor.after_step(trainer.step, res)
            tokens += res.tokens
            train_time += res.step_time
            bar.update(1)
            done = trainer.step >= cfg.run.steps
            interval = trainer.step % cfg.run.log_every == 0 or done
            # each data rank's compute over the window (collective: every rank at the same steps)
            ranks = trainer.rank_compute() if interval else None
            # queued: on disk within monitor.flush_s; the loss follows when it reaches the host (no sync here)
            monitor.log_step(_step_record(trainer.step, res, ranks), loss=res.loss, grad_norm=res.grad_norm)
            if interval:
                last_loss = _show(monitor.wait_values(), res, bar, say, cfg, run_dir)  # sync point: once per interval
            if cfg.run.eval_every and trainer.step % cfg.run.eval_every == 0 and not done:
                val_loss = trainer.evaluate()
                say(f"step {trainer.step}: val loss {val_loss:.4f}")
                if sink:
                    sink.write({"step": trainer.step, "val_loss": val_loss})
            if cfg.checkpoint.every and trainer.step % cfg.checkpoint.every == 0 and not done:
                trainer.save_checkpoint()
    except BaseException:
        monitor.close(wait=False)  # what is known reaches the disk; values not on the host yet are not awaited
        raise
    bar.close()
    elapsed = time.perf_counter() - t_start
    if trainer.step > start_step or val_loss is None:
        val_loss = trainer.evaluate()
    if cfg.checkpoint.at_end and trainer.step > start_step:
        trainer.save_checkpoint()
    sample = generate_sample(trainer) if (main and cfg.run.sample_tokens and trainer.can_sample) else None
    phase_totals = dict(trainer.timer.totals)
    summary = {
        "final_loss": last_loss,
        "val_loss": val_loss,
        "initial_val_loss": initial_val,
        "steps": trainer.step,
        "steps_this_run": trainer.step - start_step,
        "resumed_from": resumed_from,
        "tokens": tokens,
        "tokens_per_s": tokens / train_time if train_time else None,
        "elapsed_s": elapsed,
        "train_time_s": train_time,
        "params": n_params,
        "phase_seconds": phase_totals,  # "compile": the first step of a compiled model, kept apart
        "device": str(trainer.device),
        "precision": cfg.precision.dtype,
        "notes": trainer.notes,
        "sample": sample,
    }
    monitor.finish(summary)  # mfu, hfu, peak and conventions, sampler status; stops the threads
    if main:
        write_json(run_dir / "summary.json", summary)  # strict JSON (NaN -> null), atomic
        if sink:
            sink.close()
    if verbose and main:
        print_report(summary, run_dir)
        from trainperf.diagnosis.engine import print_findings

        print_findings(run_dir)
    return summary


# A previous run's records in the run directory: on a fresh start they are renamed, never read as this run's
PREVIOUS_RUN_FILES = ("summary.json", "metrics.jsonl", "samples.jsonl", "config.yaml", "failures.jsonl")
"""With every rank's metrics.rankN.jsonl / samples.rankN.jsonl, set aside by rank 0 before any rank opens its log."""




def _set_aside_previous_run(run_dir: Path, say) -> None:
    """A fresh start (``--resume never``, or no checkpoint) in a directory holding another run's records:
    summary.json, metrics.jsonl, samples.jsonl, config.yaml and every rank's metrics.rankN.jsonl /
    samples.rankN.jsonl are renamed to NAME.previous.EXT (nothing is deleted), so
    diagnose/report never read the old run's summary as this run's. A finished run's records (it has a
    summary.json) replace older ``.previous`` ones; the records of an attempt that never finished do not replace
    the previous run's already set aside (the metrics sink starts this run's log afresh)."""
    finished = (run_dir / "summary.json").is_file()
    moved = []
    ranks = sorted(p.name for pat in ("metrics.rank*.jsonl", "samples.rank*.jsonl") for p in run_dir.glob(pat))
    for name in (*PREVIOUS_RUN_FILES, *ranks):
        src, dst = run_dir / name, run_dir / previous_name(name)
        if src.is_file() and (finished or not dst.exists()):
            src.replace(dst)
            moved.append(dst.name)
    if moved:
        say(f"train: starting over in {run_dir}; the previous run's {', '.join(moved)} kept beside this run's")


def _diverged_message(loss: float, step: int, cfg, run_dir) -> str:
    """What a diverged run says: the step, the settings that usually cause it and where its records are."""
    if cfg is None:
        return f"loss became {loss} at step {step}; lower optimizer.lr or use precision fp32/bf16"
    lr, dtype, clip = cfg.optimizer.lr, cfg.precision.dtype, cfg.train.grad_clip
    ways = [f"lower optimizer.lr (e.g. {min(lr / 10, 3e-4):g})"]  # a tenth, and never above a usual peak
    if not clip:
        ways.append("clip gradients (train.grad_clip: 1.0)")
    if dtype == "fp16":
        ways.append("train in bf16 or fp32 (fp16 overflows where they do not)")
    if cfg.schedule.warmup_steps < 10:
        ways.append("warm the learning rate up over more steps (schedule.warmup_steps)")
    where = f"; the steps before it are in {run_dir}/metrics.jsonl (trainperf diagnose {run_dir})" if run_dir else ""
    return (f"the loss became {loss} at step {step}: training diverged (optimizer.lr={lr:g}, precision {dtype}, "
            f"train.grad_clip={clip:g}); " + ", or ".join(ways) + where)


def _step_record(step: int, res, ranks: dict | None) -> dict:
    """The step's host figures; its loss and grad_norm (device tensors) are the monitor's to bring over."""
    rec = {"step": step, "lr": res.lr, "step_time_s": res.step_time, "tokens_per_s": res.tokens / res.step_time,
           "phases_s": res.phases}
    rec.update(res.extras)  # e.g. gradient bytes on the wire (distributed), XLA figures
    if ranks:
        rec.update(ranks)  # rank_compute_s / rank_cpu_s: mean per step over the window, per data rank
    return rec


def _show(values: list, res, bar, say, cfg=None, run_dir=None) -> float:
    """The window's losses (on the host now): stop on a non-finite one, show the last; returns it."""
    for step, v in values:
        loss = v.get("loss")
        if loss is not None and not math.isfinite(loss):
            from trainperf.errors import DivergedError

            bar.close()
            raise DivergedError(_diverged_message(loss, step, cfg, run_dir))
    if not values:
        return float("nan")
    step, last = values[-1]
    loss = last.get("loss", float("nan"))
    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{res.tokens / res.step_time:,.0f}")
    if bar.disable:
        say(f"step {step}: loss {loss:.4f} | {res.step_time * 1000:.0f} ms/step | "
            f"{res.tokens / res.step_time:,.0f} tokens/s")
    return loss


def _already_finished(trainer: Trainer, run_dir: Path, step: int, say) -> dict:
    """Running a finished run again: nothing to train; the summary on disk stays as it is."""
    from trainperf.errors import UserError
    from trainperf.runio import read_json

    try:
        summary = read_json(run_dir / "summary.json", what="run summary")
    except UserError:
        summary = {"steps": step, "final_loss": None}
    summary["already_finished"] = True
    say(f"train: {run_dir} already finished ({step} of run.steps={trainer.cfg.run.steps} steps, checkpoint at step "
        f"{step}); nothing to do. Raise run.steps to train further, or start over with --resume never")
    return summary


def generate_sample(trainer: Trainer, prompt: str = "def ") -> str | None:
    from trainperf.models.gpt import GPT

    if trainer.data.meta.get("tokenizer") != "bytes" or not isinstance(trainer.model, GPT):
        return None
    from trainperf.data.prepare import decode, encode

    model, device = trainer.backend.sampling_model(trainer.model)  # XLA: a CPU copy (each length would compile)
    was_training = model.training
    model.eval()
    idx = torch.from_numpy(encode(prompt.encode()).astype("int64"))[None].to(device)
    gen = torch.Generator(device=device).manual_seed(trainer.cfg.run.seed)
    out = model.generate(idx, trainer.cfg.run.sample_tokens, generator=gen)
    model.train(was_training)
    return decode(out[0].tolist())


def print_report(summary: dict, run_dir: Path) -> None:
    def fmt(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) and v is not None else "-"

    print("\n== trainperf run summary ==")
    rows = [
        ("steps", summary["steps"]),
        ("final train loss", fmt(summary["final_loss"], ".4f")),
        ("val loss (start -> end)", f"{fmt(summary['initial_val_loss'], '.4f')} -> {fmt(summary['val_loss'], '.4f')}"),
        ("throughput", f"{fmt(summary['tokens_per_s'], ',.0f')} tokens/s (wall clock over training steps)"),
        ("elapsed", f"{fmt(summary['elapsed_s'], '.1f')} s"),
        ("device / precision", f"{summary['device']} / {summary['precision']}"),
    ]
    phases = dict(summary.get("phase_seconds") or {})
    compile_s = phases.pop("compile", None)  # the first, compiling step: not steady state
    total = sum(phases.values())
    if total:
        rows.append(("time by phase", ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in phases.items())
                     + (" (steady state; first-step compilation apart)" if compile_s else "")))
    if compile_s:
        rows.append(("compilation", f"{compile_s:.1f} s (first step)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    if summary.get("sample"):
        print("\n-- generated sample (prompt 'def ') --")
        print(summary["sample"])
        print("--")
    print(f"\nrun directory: {run_dir} (metrics.jsonl, checkpoints/, summary.json)")

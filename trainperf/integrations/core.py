"""``StepRecorder``: the one engine behind the integrations (Lightning, Hugging Face, plain loops).

It owns a :class:`trainperf.monitor.Monitor` (device sampler, sinks, PhaseTimer) and writes the run
directory exactly as ``trainperf train`` does, so ``trainperf diagnose``, ``report`` and ``compare``
read it unchanged::

    metrics.jsonl   {"step","loss","lr","step_time_s","tokens_per_s","phases_s","phases_cpu_s","mfu"?}
                    on disk within monitor.flush_s (the Monitor's StepLog thread) and every log_every
                    steps; on CUDA the loss may follow in {"step","part":"values","loss"} (readers merge)
    samples.jsonl   device sampler records
    summary.json    tokens/s, phase seconds, MFU/HFU with the FLOP convention and the peak used

A step's life, as the frameworks' hooks drive it::

    open_step()        end of the previous batch: the data phase starts (data wait = from the end of
                       one batch to the start of the next; the framework fetches in between)
    mark("forward")    the batch is on the device, compute starts
    mark("backward"), mark("optimizer")
    close_step(...)    end of the batch: one step record

FLOPs: the model FLOPs per token come from the model's shape (``flops_per_token(seq_len)`` when the
model has it, else a Hugging Face ``config`` in any submodule: see
:func:`trainperf.monitor.flops.formula_with_note`); the hardware FLOPs are counted with
:class:`~trainperf.monitor.flops.StepFlopCounter` over the forward + backward of one real step (the
second: the first warms up), recompute included. Without a formula, MFU uses 3 x the counted
forward FLOPs (``mfu_convention`` says so). The peak is :func:`trainperf.monitor.flops.peak_flops`
(catalog on CUDA; on CPU measured at the end on the model's own matmul shapes at the rows of an average step).

Overhead: the time spent inside the recorder's own calls is accumulated (``overhead_s``) and
reported per step in summary.json (``monitor_overhead``), next to the mean step time: the sum
over the run, the median step's share (a few calls held up by a loaded machine's scheduler
move the sum of a short run, not the median), and the same calls' thread CPU time.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import torch

from trainperf.monitor.monitor import Monitor

# Which real step's forward + backward FlopCounterMode counts (0-based: the second step).
COUNT_STEP = 1
STEP_FRACTIONS = 10_000  # the last steps whose share in the hooks the median is taken over


def count_tokens(batch) -> tuple[int, int, int | None]:
    """(tokens, samples, seq_len) of a batch: the ``input_ids`` of a dict batch, else the first integer
    tensor (token ids: every element is a token), else the first tensor's leading dimension as
    samples (tokens = samples, seq_len unknown)."""
    t = None
    if isinstance(batch, dict):
        t = batch.get("input_ids")
        if t is None:
            t = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, (list, tuple)):
        ints = [v for v in batch if isinstance(v, torch.Tensor) and not v.is_floating_point()]
        t = ints[0] if ints else next((v for v in batch if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, torch.Tensor):
        t = batch
    if t is None or t.dim() == 0:
        return 0, 0, None
    if t.is_floating_point():
        return int(t.shape[0]), int(t.shape[0]), None
    seq = int(t.shape[-1]) if t.dim() >= 2 else None
    return int(t.numel()), int(t.shape[0]), seq


def model_flops_per_token(model, seq_len: int | None) -> tuple[float | None, str]:
    """Model FLOPs per token from the model's shape, with the convention; (None, why) when unknown."""
    if model is None or not seq_len:
        return None, "no model or sequence length seen"
    from trainperf.monitor.flops import formula_with_note

    return formula_with_note(getattr(model, "module", model), seq_len)  # DDP wrappers; any submodule's HF config


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
_ACTIVE: "weakref.WeakValueDictionary[tuple[str, int], StepRecorder]" = weakref.WeakValueDictionary()
"""(run directory, rank) -> the open recorder writing it in this process (one dropped unclosed frees its claim)."""


def _check_args(run_dir, device, precision, log_every, monitor) -> tuple[Path, torch.device, int, Any]:
    """The constructor's arguments as the recorder uses them, or a UserError naming the value and the fix."""
    from pydantic import ValidationError

    from trainperf.config.load import format_validation_error
    from trainperf.config.schema import MonitorConfig
    from trainperf.errors import ConfigError, UserError
    from trainperf.runio import ensure_dir

    if run_dir is None or not str(run_dir).strip():
        raise UserError(f"run_dir={run_dir!r}: give the directory the run writes, e.g. 'runs/mine'")
    ensure_dir(run_dir, "run_dir")
    if precision not in PRECISIONS:
        raise UserError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}: the dtype the model "
                        "computes in (it picks the peak MFU divides by)")
    if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
        raise UserError(f"log_every={log_every!r}: give a whole number >= 1 (steps between writes to disk)")
    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as exc:
        raise UserError(f"device={device!r} is not a torch device ({exc}); use 'cpu', 'cuda', 'cuda:1', ...") from None
    if dev.type == "meta":
        raise UserError("device='meta' holds no data and runs no kernel: nothing to time; give the device the "
                        "model trains on")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={device!r}: this torch build has no usable CUDA device; use device='cpu' (or "
                        "leave it out: the model's device is taken)")
    if monitor is not None and not isinstance(monitor, dict):
        raise UserError(f"monitor={monitor!r}: give a dict of monitor settings (e.g. {{'flush_s': 2}}) or None")
    try:
        cfg = MonitorConfig(**(monitor or {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "monitor=").replace("\n  ", "\n  monitor.")) from None
    return Path(run_dir), dev, log_every, cfg


def _claim(run_dir: Path, rank: int, owner: "StepRecorder") -> Path:
    """This recorder's claim on (run_dir, rank): refused while another recorder (this process or another
    live one) writes there; returns the lock file it holds until :meth:`StepRecorder.finish`."""
    import os

    from trainperf.errors import UserError

    key = (str(run_dir.resolve()), rank)
    lock = run_dir / (".trainperf.lock" if rank == 0 else f".trainperf.rank{rank}.lock")
    if _ACTIVE.get(key) is not None:
        raise UserError(f"{run_dir} is already being written by another tracker in this process (rank {rank}); "
                        "close it first (tp.close()), or give this one another run_dir")
    try:
        pid = int(lock.read_text().strip() or 0) if lock.is_file() else 0
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid():
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if alive:
            raise UserError(f"{run_dir} is being written by process {pid} (its lock {lock.name}); give this run "
                            "another run_dir, or wait for that run to end")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock.write_text(str(os.getpid()))
    _ACTIVE[key] = owner
    return lock


def _release(run_dir: Path, rank: int, lock: Path | None) -> None:
    import contextlib

    _ACTIVE.pop((str(run_dir.resolve()), rank), None)
    if lock is not None:
        with contextlib.suppress(OSError):
            lock.unlink()


def _set_aside(run_dir: Path, rank: int) -> list[str]:
    """Another run's records in this directory are renamed NAME.previous.EXT (NAME.previous2.EXT, ... when
    that is taken), never deleted nor read as this run's: summary.json, metrics.jsonl and samples.jsonl (rank
    r: metrics.rankR.jsonl, samples.rankR.jsonl)."""
    from trainperf.runio import previous_name

    names = (("summary.json", "metrics.jsonl", "samples.jsonl") if rank == 0
             else (f"metrics.rank{rank}.jsonl", f"samples.rank{rank}.jsonl"))
    moved = []
    for name in names:
        src = run_dir / name
        if not src.is_file():
            continue
        dst, k = run_dir / previous_name(name), 2
        while dst.exists():
            stem, dot, ext = previous_name(name).partition(".previous")
            dst = run_dir / f"{stem}.previous{k}{ext}"
            k += 1
        src.replace(dst)
        moved.append(f"{name} -> {dst.name}")
    return moved


class StepRecorder:
    def __init__(self, run_dir: str | Path, *, framework: str, device: str | torch.device | None = None,
                 precision: str = "fp32", monitor: dict | None = None, count_flops: bool = True,
                 log_every: int = 10, rank: int | None = None, world: int | None = None):
        import warnings

        run_dir, dev, log_every, mcfg = _check_args(run_dir, device, precision, log_every, monitor)
        self.run_dir = run_dir
        self.framework = framework
        self.precision = precision
        self.log_every = log_every
        self.count_flops = count_flops
        self._rank = rank or 0
        self._lock = _claim(run_dir, self._rank, self)
        moved = _set_aside(run_dir, rank or 0)
        if moved:
            warnings.warn(f"{run_dir} held another run's records: {'; '.join(moved)} (kept, not read as this run's)",
                          UserWarning, stacklevel=3)
        try:
            self.mon = Monitor(mcfg, self.run_dir, device=dev, rank=rank, world=world)
        except BaseException:
            _release(run_dir, self._rank, self._lock)
            raise
        self.timer = self.mon.timer
        self.device = dev
        self.step = 0
        self.in_step = False
        self.model = None
        self.seq_len: int | None = None
        self.notes: dict[str, str] = {}
        self.overhead_s = 0.0
        self.overhead_cpu_s = 0.0  # the same calls' CPU time (this thread's): what they compute
        self._overhead_at_open = 0.0
        self._step_fractions: deque[float] = deque(maxlen=STEP_FRACTIONS)  # each step's share in the hooks
        self._t0 = 0.0
        self._tokens = 0
        self._samples = 0
        self._loss_parts: list = []
        self._since_wait = 0  # steps queued since the last wait for their losses
        self._counter = None
        self._counted: float | None = None
        self._counted_forward: float | None = None
        self._counted_note = "not counted (no step reached the counting step)"
        self.tokens_total = 0
        self.train_time_s = 0.0
        self.last_loss: float | None = None
        self._t_start = time.perf_counter()
        self._closed = False
        self._watched: dict[int, Any] = {}  # id(optimizer) -> its step post-hook's handle (watch_optimizer)

    # ------------------------------------------------------------------ the step
    def _spent(self, t: float, c: float) -> None:
        """A hook call that began at perf_counter ``t`` and thread_time ``c`` ends: its wall and CPU time."""
        self.overhead_s += time.perf_counter() - t
        self.overhead_cpu_s += time.thread_time() - c

    def open_step(self) -> None:
        """The previous batch ended: the data phase of the next step starts (restarts if already open)."""
        t, c = time.perf_counter(), time.thread_time()
        self._overhead_at_open = self.overhead_s
        self.timer.start_step()
        self.timer.phase("data")
        self._t0 = t
        self._tokens = self._samples = 0
        self._loss_parts = []
        self.in_step = True
        self._spent(t, c)

    def cancel_step(self) -> None:
        """Drop an open step (the framework is evaluating or saving, not waiting for data)."""
        self.timer.start_step()
        self.in_step = False
        self._stop_counter(None)

    def mark(self, name: str) -> None:
        t, c = time.perf_counter(), time.thread_time()
        if not self.in_step:
            self.open_step()
        self.timer.phase(name)
        if name == "forward" and self.count_flops and self.step == COUNT_STEP and self._counter is None \
                and self._counted is None:
            self._start_counter()
        elif name == "optimizer":
            self._stop_counter(self._tokens)
        self._spent(t, c)

    def end_phase(self, name: str) -> None:
        """The framework's ``name`` work is over (e.g. the optimizer's step returned): what runs from here to the
        step's end (callbacks, logging, a user's own sleep) is the ``other`` phase, not ``name``'s time, so the
        CPU-per-wall-second of the phases trainperf times (host_contention) reads only their work."""
        t, c = time.perf_counter(), time.thread_time()
        if self.in_step and self.timer.current == name:
            self.timer.phase("other")
        self._spent(t, c)

    def watch_optimizer(self, optimizer) -> None:
        """End the optimizer phase when ``optimizer.step()`` returns (a step post-hook, registered once per
        optimizer): the framework's hooks after it (on_train_batch_end, a user's callbacks) are not its time."""
        import torch

        opt = optimizer
        while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):  # framework wrappers
            opt = opt.optimizer
        if not isinstance(opt, torch.optim.Optimizer) or id(opt) in self._watched:
            return
        self._watched[id(opt)] = opt.register_step_post_hook(lambda *_: self.end_phase("optimizer"))

    def add_batch(self, batch=None, *, tokens: int | None = None, samples: int | None = None,
                  seq_len: int | None = None) -> None:
        """Count one micro-batch's tokens (from the batch, or given)."""
        t, c = time.perf_counter(), time.thread_time()
        if batch is not None and tokens is None:
            tokens, samples, seq_len = count_tokens(batch)
        self._tokens += int(tokens or 0)
        self._samples += int(samples or 0)
        if seq_len:
            self.seq_len = seq_len
        self._spent(t, c)

    def add_loss(self, loss) -> None:
        """One micro-batch's loss (a tensor stays on the device until the next flush)."""
        if loss is not None:
            self._loss_parts.append(loss.detach() if isinstance(loss, torch.Tensor) else float(loss))

    def close_step(self, *, lr: float | None = None) -> None:
        t, c = time.perf_counter(), time.thread_time()
        if not self.in_step:
            return
        self._stop_counter(self._tokens)
        phases = self.timer.end_step()
        dt = time.perf_counter() - self._t0
        self.in_step = False
        self.step += 1
        self.mon.after_step(self.step)
        tokens = self._tokens or self._samples
        rec: dict[str, Any] = {"step": self.step, "lr": lr, "step_time_s": dt,
                               "tokens_per_s": tokens / dt if dt > 0 and tokens else None, "phases_s": phases}
        self.tokens_total += tokens
        self.train_time_s += dt
        # queued: on disk within monitor.flush_s; the loss (mean of the micro-batches') when it reaches the host
        self.mon.log_step(rec, loss=list(self._loss_parts))
        self._since_wait += 1
        if self._since_wait >= self.log_every:
            self.flush()
        self._spent(t, c)
        if dt > 0:
            self._step_fractions.append((self.overhead_s - self._overhead_at_open) / dt)
        # the next step's data phase starts now
        self.open_step()

    def flush(self) -> None:
        """Bring the queued losses to the host (one sync for several steps) and write every record."""
        self._since_wait = 0
        for _, values in self.mon.wait_values():
            if values.get("loss") is not None:
                self.last_loss = values["loss"]

    # ------------------------------------------------------------------ FLOPs
    def _start_counter(self) -> None:
        from trainperf.monitor.flops import StepFlopCounter

        try:
            self._counter = StepFlopCounter()
            self._counter.__enter__()
        except Exception as exc:  # noqa: BLE001 - counting is best effort
            self._counter = None
            self._counted_note = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"[:200]

    def _stop_counter(self, tokens: int | None) -> None:
        if self._counter is None:
            return
        counter, self._counter = self._counter, None
        try:
            counter.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001
            self._counted_note = f"FlopCounterMode failed: {type(exc).__name__}: {exc}"[:200]
            return
        if tokens is None:
            self._counted_note = "counting step interrupted (evaluation); not counted"
            return
        total, fwd, note = counter.per_token(tokens)
        if total is None:
            self._counted_note = note
            return
        self._counted, self._counted_forward = total, fwd
        self._counted_note = (f"FlopCounterMode over the forward + backward of real step {COUNT_STEP + 1} "
                              f"({tokens} tokens), recompute included; forward = the FLOPs outside autograd's backward")

    # ------------------------------------------------------------------ end of run
    def finish(self, extra: dict | None = None, *, verbose: bool = False) -> dict:
        """Write summary.json (rank 0) and stop the monitor's threads; returns the summary."""
        if self._closed:
            return {}
        self._closed = True
        self._unwatch()
        try:
            return self._finish(extra, verbose=verbose)
        finally:
            _release(self.run_dir, self._rank, self._lock)

    def _unwatch(self) -> None:
        for handle in self._watched.values():
            handle.remove()
        self._watched.clear()

    def _finish(self, extra: dict | None, *, verbose: bool) -> dict:
        from trainperf.monitor.flops import matmul_shapes, peak_flops

        self._stop_counter(None)
        self.timer.start_step()  # an open data phase after the last batch is not a step
        self.flush()
        fpt, fnote = model_flops_per_token(self.model, self.seq_len)
        self.mon.flops = {
            "flops_per_token_formula": fpt,
            "flops_per_token_formula_hfu": None,
            "flops_per_token_counted": self._counted,
            "flops_per_token_counted_forward": self._counted_forward,
            "flops_formula_note": fnote,
            "flops_recompute_note": "in the counted figure (HFU)",
            "flops_counted_note": self._counted_note,
        }
        # measured peaks: the model's own matmuls at the rows of an average step (its micro-batches are unknown)
        rows = int(self.tokens_total / self.step) if (self.step and self.tokens_total) else 0
        shapes = matmul_shapes(self.model, rows) if (rows and self.model is not None) else None
        self.mon.seq_len = self.seq_len
        n_params = sum(p.numel() for p in self.model.parameters()) if self.model is not None else None
        steps = self.step
        if steps and not self.tokens_total:
            self.notes["tokens"] = ("no tokens counted: the steps passed no batch (or one with no tensor) and no "
                                    "tokens=; step times and phases are measured, throughput and MFU are not "
                                    "(pass the batch, or tokens=N, to tp.step())")
        summary: dict[str, Any] = {
            "final_loss": self.last_loss, "val_loss": None, "initial_val_loss": None,
            "steps": steps, "steps_this_run": steps, "resumed_from": None,
            "tokens": self.tokens_total,
            "tokens_per_s": self.tokens_total / self.train_time_s if (self.train_time_s and self.tokens_total) else None,
            "elapsed_s": time.perf_counter() - self._t_start, "train_time_s": self.train_time_s,
            "params": n_params, "phase_seconds": dict(self.timer.totals), "device": str(self.device),
            "precision": self.precision, "notes": dict(self.notes), "sample": None,
            "integration": self.framework,
            "data_wait_definition": "data phase = from the end of one batch to the start of the next "
                                    "(the framework fetches and moves the batch in between)",
            "monitor_overhead": {
                "s_per_step": self.overhead_s / steps if steps else None,
                # over the steps' time plus the hooks' own (a flush after a step's end is outside its time):
                # at most 1, where 5,000 empty steps once read 1.91
                "fraction_of_step": (self.overhead_s / (self.train_time_s + self.overhead_s))
                if self.train_time_s else None,
                "median_fraction_of_step": (statistics.median(self._step_fractions) if self._step_fractions
                                            else None),
                "cpu_s_per_step": self.overhead_cpu_s / steps if steps else None,
                "cpu_fraction_of_step": (self.overhead_cpu_s / self.train_time_s) if self.train_time_s else None,
                "method": "perf_counter time spent inside trainperf's hooks, over the run's steps "
                          "(fraction_of_step: their sum over the steps' sum plus theirs; median_fraction_of_step: the median "
                          f"step's share, over the last {STEP_FRACTIONS:,} steps at most, which a few calls "
                          "held up by a loaded machine's scheduler do not move); cpu_*: the same calls' thread CPU "
                          "time (what they compute, without the time a busy machine or another thread holding "
                          "the GIL kept them waiting; a device sync's wait is not CPU time) over the steps' wall time",
            },
        }
        summary.update(extra or {})
        # the peak measured once the Monitor's threads have stopped (its matmuls are not the run's load)
        self.mon.finish(summary, measure_peak=lambda: peak_flops(self.device, self.precision, shapes=shapes))
        if self.mon.rank == 0:
            from trainperf.runio import write_json

            write_json(self.run_dir / "summary.json", summary)  # strict JSON (NaN -> null), atomic
            if verbose:
                from trainperf.diagnosis.engine import print_findings

                print_findings(self.run_dir)
        return summary

    def close(self) -> None:
        if not self._closed:
            self.finish()

    @property
    def closed(self) -> bool:
        return self._closed

    def abandon(self) -> None:
        """The run ended without its end hook (the framework raised): what reached the host is written, no
        summary.json (so the directory reads as a run that did not finish) and the directory is free again."""
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        try:
            self.mon.close(wait=False)
        finally:
            _release(self.run_dir, self._rank, self._lock)

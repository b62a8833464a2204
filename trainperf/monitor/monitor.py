"""``Monitor``: what the trainer calls around each step, and where every record goes.

Files in the run directory (rank 0; rank R > 0 writes ``*.rank{R}.jsonl`` beside them)::

    metrics.jsonl     step records {"step","loss","lr","step_time_s","tokens_per_s","phases_s",
                      "phases_cpu_s","mfu","mem_peak_bytes"?, ...} and eval records {"step","val_loss"};
                      on CUDA a step's loss/grad_norm may come in a later line {"step","part":"values",
                      "loss","grad_norm"} (trainperf.monitor.steplog; the readers merge). On disk within
                      monitor.flush_s (a thread) and every run.log_every steps.
    samples.jsonl     device sampler records (see trainperf.monitor.sampler)
    profile/          torch.profiler traces (monitor.profile)
    summary.json      the run's figures, with mfu/hfu and the peak and conventions they use

Hooks, in the order ``fit`` calls them::

    mon = Monitor.for_trainer(trainer, run_dir, jsonl=sink)   # sampler, sinks, FLOPs, peak
    mon.before_step(step)            # profiler window
    with mon.oom_guard(), mon.counting():   # CUDA OOM -> allocator snapshot; FLOPs of one real step
        res = trainer.train_step()
    mon.after_step(trainer.step, res)
    mon.log_step(record, loss=res.loss, grad_norm=res.grad_norm)   # queued: on disk within flush_s
    mon.wait_values()                # each log interval: the window's values (one host sync)
    mon.write(record)                # eval records (and a library user's): written at once
    mon.finish(summary)              # adds MFU/HFU etc. to summary.json, stops the threads
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from trainperf.monitor.sinks import JSONLSink
from trainperf.monitor.steplog import StepLog


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return 0, 1


def rank_file(run_dir: Path, stem: str, rank: int) -> Path:
    """``metrics.jsonl`` for rank 0, ``metrics.rank3.jsonl`` for rank 3."""
    return Path(run_dir) / (f"{stem}.jsonl" if rank == 0 else f"{stem}.rank{rank}.jsonl")


class Monitor:
    def __init__(self, cfg, run_dir: str | os.PathLike = "runs/monitor", *, device: torch.device | str = "cpu",
                 rank: int | None = None, world: int | None = None, jsonl: JSONLSink | None = None,
                 resumed_from: int | None = None):
        from trainperf.monitor.phases import PhaseTimer
        from trainperf.monitor.profiling import OomSnapshot, ProfileWindow
        from trainperf.monitor.sampler import DeviceSampler

        r, w = _dist_rank_world()
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.rank, self.world = (r if rank is None else rank), (w if world is None else world)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.step = resumed_from or 0
        self.status: dict[str, Any] = {}
        self.flops: dict[str, Any] = {}
        self.peak: dict[str, Any] = {}
        self._peak_at_start = False  # measured before the first step (setup_flops): measured again in finish
        self._extras: dict[int, dict] = {}
        self.seq_len: int | None = None
        # The PhaseTimer whose per-phase CPU time is logged; for_trainer uses the trainer's.
        self.timer = PhaseTimer(self.device.type, nvtx=cfg.nvtx)
        self._closed = False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resumed_from is None and self.rank == 0:
            self._remove_stale_rank_files()

        self.jsonl = jsonl
        if jsonl is None and cfg.jsonl:
            self.jsonl = JSONLSink(rank_file(self.run_dir, "metrics", self.rank), truncate_after_step=resumed_from)
        self.sinks: list = []
        if cfg.tensorboard:
            try:
                from trainperf.monitor.sinks import TensorBoardSink

                self.sinks.append(TensorBoardSink(self.run_dir / "tensorboard" / f"rank{self.rank}"))
                self.status["tensorboard"] = str(self.run_dir / "tensorboard")
            except ImportError as exc:
                warnings.warn(str(exc), stacklevel=2)
                self.status["tensorboard"] = f"off: {exc}"
        self.prometheus = None
        if cfg.prometheus_port is not None:
            from trainperf.monitor.sinks import PrometheusEndpoint

            port = cfg.prometheus_port + self.rank if cfg.prometheus_port else 0
            self.prometheus = PrometheusEndpoint(port, cfg.prometheus_host, rank=self.rank)
            self.sinks.append(self.prometheus)
            self.status["prometheus"] = f"http://{self.prometheus.host}:{self.prometheus.port}/metrics"

        # Step records on their way to the sinks: a thread writes them within monitor.flush_s (steplog.py).
        self.steps = StepLog(self._emit, flush_s=getattr(cfg, "flush_s", 2.0))
        self._count_skip: int | None = None  # steps before the one counted with FlopCounterMode; None: no count
        self._counter = None
        self._samples = JSONLSink(rank_file(self.run_dir, "samples", self.rank),
                                  truncate_after_step=resumed_from) if cfg.jsonl else None
        self.sampler = DeviceSampler(self._on_sample, period_s=cfg.sample_every_s, rank=self.rank,
                                     use_gpu=self.cuda, step_fn=lambda: self.step).start()
        self.profile = ProfileWindow(self.run_dir / "profile", cfg.profile.start_step, cfg.profile.steps,
                                     rank=self.rank, cuda=self.cuda)
        self.oom = OomSnapshot(self.run_dir / f"oom_snapshot_rank{self.rank}.pickle",
                               getattr(cfg, "oom_snapshot", True) and self.cuda)

    def _remove_stale_rank_files(self) -> None:
        """A run must not be diagnosed with the files of an earlier, wider run in the same directory: the ranks
        beyond this run's world are renamed NAME.previous.EXT (kept, not read)."""
        from trainperf.runio import previous_name, rank_of

        for f in list(self.run_dir.glob("metrics.rank*.jsonl")) + list(self.run_dir.glob("samples.rank*.jsonl")):
            if rank_of(f) >= self.world:
                with contextlib.suppress(OSError):
                    f.replace(f.with_name(previous_name(f.name)))

    # ------------------------------------------------------------------ setup from a Trainer
    @classmethod
    def for_trainer(cls, trainer, run_dir, *, jsonl: JSONLSink | None = None,
                    resumed_from: int | None = None) -> "Monitor":
        cfg = trainer.cfg
        rank, world = _dist_rank_world()
        mon = cls(cfg.monitor, run_dir, device=trainer.device, rank=rank, world=world,
                  jsonl=jsonl if trainer.is_main else None, resumed_from=resumed_from)
        trainer.timer.nvtx = bool(cfg.monitor.nvtx) and trainer.timer.cuda
        mon.timer = trainer.timer
        mon.tokens_per_step = trainer.tokens_per_step
        mon.seq_len = trainer.data.seq_len
        if cfg.monitor.mfu:
            mon.setup_flops(trainer)
        return mon

    def setup_flops(self, trainer) -> None:
        from trainperf.monitor import flops as F

        cfg, model = trainer.cfg, trainer.model
        fpt, fnote = F.formula_with_note(model, trainer.data.seq_len)
        extra, note = F.recompute_flops_per_token(model, trainer.data.seq_len, cfg.memory.checkpointing)
        if self.world > 1:  # DDP/FSDP hooks would run (and could collect gradients) on an extra pass
            cnote = "not counted in distributed runs; HFU uses the formula with recompute"
        elif not trainer.backend.counts_flops:  # XLA: an extra pass would trace and compile one more graph
            cnote = "not counted on XLA devices"
        else:  # counted on a real step (the batch and targets it trains on): the first eager one
            cnote = "not counted (the run ended before the counting step)"
            self._count_skip = 1 if cfg.compile.enabled else 0  # the first step of a compiled model compiles
        self.flops = {
            "flops_per_token_formula": fpt,
            "flops_per_token_formula_hfu": (fpt + extra) if (fpt is not None and extra is not None) else None,
            "flops_per_token_counted": None,
            "flops_per_token_counted_forward": None,
            "flops_formula_note": fnote,
            "flops_recompute_note": note,
            "flops_counted_note": cnote,
        }
        # the model's own matmuls at the micro-batch's rows: a CPU peak that the run itself cannot outrun
        shapes = F.matmul_shapes(model, int(getattr(trainer, "micro_batch", 1)) * int(trainer.data.seq_len))
        self.peak = F.peak_flops(trainer.device, cfg.precision.dtype, shapes=shapes)
        self._peak_at_start = True

    def counting(self):
        """Around ``trainer.train_step()``: FlopCounterMode over the step due to be counted (the first eager
        step of a one-process run), else nothing. ``after_step`` reads the count."""
        if self._count_skip is None:
            return contextlib.nullcontext()
        if self._count_skip > 0:
            self._count_skip -= 1
            return contextlib.nullcontext()
        from trainperf.monitor.flops import StepFlopCounter

        self._counter = StepFlopCounter()
        return self._counter

    def _take_count(self, step: int, res) -> None:
        counter, self._counter = self._counter, None
        if counter is None or res is None:
            return
        if any(k.startswith("oom/") for k in (getattr(res, "extras", None) or {})):
            return  # an out-of-memory retry ran inside this step: count the next one
        self._count_skip = None
        total, fwd, note = counter.per_token(res.tokens)
        self.flops["flops_per_token_counted"] = total
        self.flops["flops_per_token_counted_forward"] = fwd
        self.flops["flops_counted_note"] = note if total is None else (
            f"FlopCounterMode over real training step {step} (its batch and targets, {res.tokens} tokens, every "
            "micro-batch), recompute included; forward = the FLOPs outside autograd's backward")

    # ------------------------------------------------------------------ per step
    def before_step(self, step: int) -> None:
        self.profile.before_step(step)

    def oom_guard(self):
        return self.oom.guard() if self.oom.enabled else contextlib.nullcontext()

    def after_step(self, step: int, res=None) -> None:
        self.step = step
        self._take_count(step, res)
        extra: dict[str, Any] = {}
        cpu = getattr(self.timer, "last_cpu", None)
        if cpu:
            extra["phases_cpu_s"] = cpu
        if self.cuda:
            extra["mem_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
        if extra:
            self._extras[step] = extra
        self.profile.after_step(step)

    def _complete(self, record: dict) -> dict:
        """A step record: this step's extras (CPU per phase, memory), the rank, MFU."""
        from trainperf.monitor.flops import model_flops_per_token

        record.update(self._extras.pop(record.get("step"), {}))
        if self.world > 1:
            record["rank"] = self.rank
        fpt = model_flops_per_token(self.flops)[0]
        if fpt and self.peak.get("peak_flops") and record.get("tokens_per_s"):
            record["mfu"] = record["tokens_per_s"] * fpt / (self.peak["peak_flops"] * self.world)
        return record

    def log_step(self, record: dict, **values) -> None:
        """A step record whose ``values`` (loss, grad_norm: device tensors or numbers) may not be on the host
        yet: queued, written within monitor.flush_s, the values when they reach the host (no sync here)."""
        self.steps.add(self._complete(record), **values)

    def wait_values(self) -> list[tuple[int, dict]]:
        """Wait for the queued values (one host sync), write everything; (step, values) since the last call."""
        return self.steps.wait()

    def write(self, record: dict) -> None:
        """A record written at once (eval records; a library user's step records with host values), after the
        queued ones."""
        if "loss" in record:
            self._complete(record)
        self.steps.write_now(record)

    def _emit(self, records: list[dict]) -> None:
        """The StepLog's writer (under its lock): JSONL, then TensorBoard / Prometheus."""
        from trainperf.runio import dumps_strict

        if self.jsonl is not None:
            self.jsonl.write_lines([dumps_strict(r, indent=None) for r in records])  # strict: NaN -> null
        for s in self.sinks:
            for r in records:
                s.write(r)

    def _on_sample(self, record: dict) -> None:
        if self._samples is not None:
            self._samples.write(record)
        if self.prometheus is not None and "meta" not in record:
            self.prometheus.write({k: v for k, v in record.items() if k not in ("t", "elapsed_s", "step")})

    # ------------------------------------------------------------------ end of run
    def finish(self, summary: dict, measure_peak=None) -> dict:
        """Add the monitor's figures to ``summary`` (in place) and stop the threads. ``measure_peak``: a call
        that returns the peak (an integration measures it at the end), run once the threads have stopped."""
        from trainperf.monitor.flops import remeasured_peak, utilization

        tps = summary.get("tokens_per_s")
        summary.update(self.flops)
        if self.cuda:  # before a measured peak's matmuls allocate
            summary["mem_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
            summary["mem_capacity_bytes"] = torch.cuda.get_device_properties(self.device).total_memory
        self.close()  # the sampler stopped first: the peak's matmuls below are not sampled as the run's load
        # a peak measured at the start is measured again now, the best of start and end kept; the step records'
        # MFU divided by the start's (peak_flops_start): diagnose / report read them against peak_flops
        if measure_peak is not None:
            self.peak = measure_peak()
        elif self._peak_at_start:
            self.peak = remeasured_peak(self.peak)
        summary.update({"peak_flops": self.peak.get("peak_flops"), "peak_source": self.peak.get("peak_source")})
        if self.peak.get("peak_flops_start") is not None:
            summary["peak_flops_start"] = self.peak["peak_flops_start"]
        summary.update(utilization(tps, self.flops, self.peak, self.world))
        if tps and self.seq_len:
            summary["samples_per_s"] = tps / self.seq_len
        summary["world_size"] = self.world
        self.status["sampler"] = self.sampler.meta
        self.status["samples_written"] = self.sampler.samples
        if self.profile.path is not None:
            self.status["profile_trace"] = str(self.profile.path)
        summary["monitor"] = self.status
        return summary

    def close(self, wait: bool = True) -> None:
        """Write what is queued and stop the threads. ``wait=False`` (after an error): only the values already
        on the host, so a broken device cannot hang the exit."""
        if self._closed:
            return
        self._closed = True
        self.steps.close(wait=wait)
        self.sampler.stop()
        self.profile.close()
        self.oom.close()
        for s in self.sinks:
            with contextlib.suppress(Exception):
                s.close()
        if self._samples is not None:
            self._samples.close()
        if self.jsonl is not None:
            self.jsonl.close()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def measure_overhead(n_steps: int = 2000) -> dict:
    """Cost per step of the whole per-step monitor path on CPU: PhaseTimer (4 phases) +
    ``after_step`` + ``write`` of one step record to metrics.jsonl (a record every step, as with
    ``run.log_every=1``), sampler thread running; best of 3 rounds, in a temporary directory."""
    import tempfile
    import time

    from trainperf.config.schema import MonitorConfig

    with tempfile.TemporaryDirectory() as d:
        mon = Monitor(MonitorConfig(mfu=False), d, device="cpu", rank=0, world=1)
        t = mon.timer
        best = float("inf")
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                for i in range(n_steps):
                    t.start_step()
                    for p in ("data", "forward", "backward", "optimizer"):
                        t.phase(p)
                    phases = t.end_step()
                    mon.after_step(i)
                    mon.write({"step": i, "loss": 1.0, "lr": 1e-3, "step_time_s": 0.01, "tokens_per_s": 1e5,
                               "phases_s": phases})
                best = min(best, (time.perf_counter() - t0) / n_steps)
        finally:
            mon.close()
    return {"monitor_s_per_step": best, "method": f"best of 3 rounds of {n_steps} empty steps, a JSONL record each"}

"""One trial: a few warm steps of a candidate through the ordinary trainer, measured.

    build_trainer(resolve(candidate)) -> first step (booked apart: it compiles when compile is
    on; a compile that fell back to eager fails the trial) -> warm-up steps -> timed steps

tokens/s = tokens of one optimizer step / the median step time of the timed steps (the median
resists the other jobs of a shared machine). Peak memory: ``torch.cuda.max_memory_allocated``
on CUDA (reset before the build); on CPU the process's peak resident set (VmHWM, reset through
/proc/self/clear_refs before the build) minus the resident set before it; where VmHWM cannot be
reset, none (the caller reports the estimate instead and says so).

:func:`side_by_side` measures two candidates in one process, interleaved: R rounds of K steps
each, the order alternating per round, after their first step and a warm-up (as ``trainperf
bench step`` does), so that both see the same machine load. The speed-up is the median of the
per-round ratios (a paired estimate: a load change between rounds hits both sides of a round
alike); beside it the rounds ``b`` won and the ratio of the pooled medians.

:class:`Paired` (what the search uses on a CPU, shared with other jobs): the default's trainer
and the best's stay alive, and each trial is interleaved with the best's in the same way, so a
candidate is judged by its ratio to the best measured at the same moment, not against a figure
taken minutes earlier under another load; the final default-vs-best measurement reuses the two
live trainers (no rebuild, no second compilation).
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from trainperf.config.schema import Config
from trainperf.errors import ConfigError


EXTRA_WARMUP = 8  # warm-up steps beyond the asked ones while step times still move


@dataclass
class Measured:
    tokens_per_s: float
    step_s: float  # median
    first_step_s: float  # the compile step when compile is on
    build_s: float
    elapsed_s: float  # the whole trial: build, first step, warm-up and timed steps
    peak_memory_bytes: int | None
    peak_memory_source: str
    notes: dict
    warm_steps: int = 0  # untimed steps after the first one
    paired: dict | None = None  # Paired: the interleaved measurement against the best (see interleave())


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of what runs between :meth:`start` and :meth:`stop` (see the module doc)."""

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self.base: int | None = None

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = _status_kb("VmRSS")
        except OSError:
            self.base = None

    def stop(self) -> tuple[int | None, str]:
        import torch

        if self.cuda:
            return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
        hwm = _status_kb("VmHWM")
        if self.base is None or hwm is None:
            return None, "not measured (VmHWM cannot be reset here)"
        return max(0, hwm - self.base), "process peak RSS delta (VmHWM)"


def build(cfg: Config):
    """The ordinary trainer for ``cfg`` (one process)."""
    from trainperf.config.resolve import resolve
    from trainperf.train.build import build_trainer

    return build_trainer(resolve(cfg), verbose=False)


def release(trainer) -> None:
    import torch

    close = getattr(getattr(getattr(trainer, "data", None), "train", None), "close", None)
    if close is not None:
        close()  # loader threads / worker processes / shared memory
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_batch(trainer, global_batch: int) -> None:
    """The candidate trains the same global batch (micro-batch x accumulation x data ranks)."""
    got = trainer.micro_batch * trainer.accum * trainer.dp_world if trainer.pm.schedule is None else \
        trainer.local_batch * trainer.dp_world
    if got != global_batch or trainer.cfg.train.global_batch != global_batch:
        raise ConfigError(f"candidate trains a global batch of {got} sequences, not the default's {global_batch}")


def first_step(trainer) -> float:
    t0 = time.perf_counter()
    res = trainer.train_step()
    float(res.loss)  # host-device sync
    note = trainer.notes.get("compile", "")
    if trainer.cfg.compile.enabled and note.startswith("fell back"):
        raise RuntimeError(f"torch.compile failed: {note}")
    return time.perf_counter() - t0


def prime(cfg: Config) -> None:
    """One unmeasured step of ``cfg``: the process's one-time allocations (libraries, thread pools,
    allocator arenas) happen here, not in the first trial's peak resident set."""
    trainer = build(cfg)
    try:
        trainer.train_step()
    finally:
        release(trainer)


def warm_up(trainer, at_least: int, at_most: int) -> int:
    """Untimed steps until two in a row agree within 25% (a compiled model's first steps after the
    compile step can still be slow), at least ``at_least``, at most ``at_most``; the count run."""
    prev = None
    for i in range(at_most):
        t = trainer.train_step().step_time
        if i + 1 >= at_least and prev is not None and max(t, prev) <= 1.25 * min(t, prev):
            return i + 1
        prev = t
    return at_most


def prepare(cfg: Config, *, global_batch: int, warmup: int):
    """Build, check the global batch, run the first step and the warm-up, with the peak memory of
    all that: (trainer, Measured without step figures). The caller releases the trainer."""
    t0 = time.perf_counter()
    peak = PeakMemory(cfg.run.device)  # cfg is resolved: cpu | cuda | xla
    peak.start()
    trainer = build(cfg)
    try:
        build_s = time.perf_counter() - t0
        check_batch(trainer, global_batch)
        first = first_step(trainer)
        warm = warm_up(trainer, warmup, warmup + EXTRA_WARMUP)
    except BaseException:
        release(trainer)
        raise
    mem, source = peak.stop()
    return trainer, Measured(0.0, 0.0, first, build_s, time.perf_counter() - t0, mem, source, dict(trainer.notes), warm)


def run_trial(cfg: Config, *, global_batch: int, warmup: int = 2, steps: int = 5) -> Measured:
    """Build and measure one candidate; exceptions (OOM, compile or config errors) propagate."""
    t0 = time.perf_counter()
    trainer, m = prepare(cfg, global_batch=global_batch, warmup=warmup)
    try:
        times = [trainer.train_step().step_time for _ in range(steps)]
        m.step_s = statistics.median(times)
        m.tokens_per_s = trainer.tokens_per_step / m.step_s
        m.elapsed_s = time.perf_counter() - t0
        return m
    finally:
        release(trainer)


def _own_threads(trainer) -> None:
    """The intra-op thread count is the process's: each trainer's steps run with its own
    ``run.threads`` (build_trainer set it for the one built last)."""
    import torch

    if trainer.device.type == "cpu":
        torch.set_num_threads(int(trainer.cfg.run.threads))


def interleave(ta, tb, *, rounds: int, steps: int, deadline: float | None = None, warmup: int = 0) -> dict:
    """``rounds`` rounds of ``steps`` steps of each trainer, the order alternating; once two are
    done, no round starts that would end (as long as the last one took) past ``deadline``
    (``time.monotonic()``)."""
    trainers = {"a": ta, "b": tb}
    times: dict[str, list[float]] = {"a": [], "b": []}
    done, last = 0, 0.0
    for r in range(rounds):
        if deadline is not None and r >= 2 and time.monotonic() + last > deadline:
            break  # the next round would end past the deadline
        t0 = time.monotonic()
        for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
            _own_threads(trainers[name])
            for _ in range(steps):
                times[name].append(trainers[name].train_step().step_time)
        done, last = done + 1, time.monotonic() - t0
    tokens = ta.tokens_per_step
    med = {n: statistics.median(t) for n, t in times.items()}
    per_round = [statistics.median(times["a"][r * steps:(r + 1) * steps])
                 / statistics.median(times["b"][r * steps:(r + 1) * steps]) for r in range(done)]
    return {"a_tokens_per_s": tokens / med["a"], "b_tokens_per_s": tokens / med["b"],
            "speedup": statistics.median(per_round), "ratio_of_medians": med["a"] / med["b"],
            "a_step_s": med["a"], "b_step_s": med["b"],
            "b_faster_rounds": sum(x > 1 for x in per_round), "rounds": done, "rounds_planned": rounds,
            "round_ratios": per_round,
            "method": f"median over {done} interleaved rounds (order alternating) of the round's step-time ratio "
                      f"default / candidate, {steps} step(s) of each per round, after the first step and {warmup} or "
                      "more warm-up steps (until two agree within 25%); tokens/s: tokens / median step time"}


def side_by_side(a: Config, b: Config, *, global_batch: int, rounds: int = 4, steps: int = 3,
                 warmup: int = 2, deadline: float | None = None) -> dict:
    """Median step time and tokens/s of ``a`` and ``b`` built afresh, interleaved in one process.
    With a ``deadline`` the figures are those of the rounds done (``rounds`` says how many)."""
    trainers = {}
    try:
        for name, cfg in (("a", a), ("b", b)):
            trainers[name] = prepare(cfg, global_batch=global_batch, warmup=warmup)[0]
        return interleave(trainers["a"], trainers["b"], rounds=rounds, steps=steps, deadline=deadline, warmup=warmup)
    finally:
        for t in list(trainers.values()):
            release(t)
        trainers.clear()


class Paired:
    """Trials interleaved with the best so far (see the module doc). ``run`` leaves the candidate's
    trainer pending until :meth:`adopt` keeps or releases it; :meth:`close` releases everything."""

    def __init__(self, *, global_batch: int, warmup: int, rounds: int, steps: int):
        self.global_batch, self.warmup, self.rounds, self.steps = global_batch, warmup, rounds, steps
        self.default = self.best = self.pending = None

    def run_default(self, cfg: Config, *, steps: int) -> Measured:
        t0 = time.perf_counter()
        trainer, m = prepare(cfg, global_batch=self.global_batch, warmup=self.warmup)
        self.default = self.best = trainer
        m.step_s = statistics.median(trainer.train_step().step_time for _ in range(steps))
        m.tokens_per_s, m.elapsed_s = trainer.tokens_per_step / m.step_s, time.perf_counter() - t0
        return m

    def run(self, cfg: Config, *, deadline: float | None = None) -> Measured:
        t0 = time.perf_counter()
        trainer, m = prepare(cfg, global_batch=self.global_batch, warmup=self.warmup)
        try:
            res = interleave(self.best, trainer, rounds=self.rounds, steps=self.steps, deadline=deadline,
                             warmup=self.warmup)
        except BaseException:
            release(trainer)
            raise
        self.pending = trainer
        m.step_s, m.tokens_per_s, m.paired = res["b_step_s"], res["b_tokens_per_s"], res
        m.elapsed_s = time.perf_counter() - t0
        return m

    def adopt(self, keep: bool) -> None:
        if self.pending is None:
            return
        if keep:
            if self.best is not self.default:
                release(self.best)
            self.best = self.pending
        else:
            release(self.pending)
        self.pending = None

    def final(self, *, rounds: int, steps: int, deadline: float | None = None) -> dict:
        """The default against the best, both live: no rebuild."""
        return interleave(self.default, self.best, rounds=rounds, steps=steps, deadline=deadline, warmup=self.warmup)

    def close(self) -> None:
        for t in {id(t): t for t in (self.pending, self.best, self.default) if t is not None}.values():
            release(t)
        self.default = self.best = self.pending = None

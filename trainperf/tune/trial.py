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

:class:`Paired` (what the search uses on a CPU, shared with other jobs): each candidate trains
in its own process (:class:`Worker`, forked from a server that imported torch once), the
default's and the best's stay alive, and each trial is interleaved with the best's in the same
way, so a candidate is judged by its ratio to the best measured at the same moment, not against
a figure taken minutes earlier under another load; the final default-vs-best measurement reuses
the two live workers (no rebuild, no second compilation). A process per candidate is what makes
process-wide settings comparable side by side (``run.threads``, ``run.host_memory``: the C
allocator's), gives each its own peak resident memory, and keeps a candidate that crashes or
is killed from taking the search with it.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from trainperf.config.schema import Config
from trainperf.errors import ConfigError
from trainperf.tune import stats


GROUP_TIMEOUT_S = 150.0  # a trial's collectives (a compile step included) end within this, or the group is stopped
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
    """The ordinary trainer for ``cfg``: one process, or this rank of a group (RANK / WORLD_SIZE in
    the environment, the process group initialized: see :func:`_worker_main`)."""
    from trainperf.train.resolve import resolve
    from trainperf.distributed.init import env_world
    from trainperf.train.build import build_trainer

    env = env_world()
    return build_trainer(resolve(cfg, world_size=env.world_size), verbose=False, rank=env.rank,
                         local_rank=env.local_rank)


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
        settled = i + 1 >= at_least and prev is not None and max(t, prev) <= 1.25 * min(t, prev)
        if _all_ranks(settled, trainer.device):  # a group's ranks stop together: an extra step on one would hang
            return i + 1
        prev = t
    return at_most


def _all_ranks(flag: bool, device) -> bool:
    """``flag`` on every rank of the process group (this process alone when there is none); the
    vote travels on the trainer's device (NCCL needs CUDA tensors, gloo takes CPU ones)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


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


class InProcess:
    """A trainer of this process, stepped by :func:`interleave`."""

    def __init__(self, trainer):
        self.trainer, self.tokens_per_step = trainer, trainer.tokens_per_step
        self.faults = 0

    def steps(self, k: int) -> list[float]:
        _own_threads(self.trainer)
        f0 = _minor_faults()
        out = [self.trainer.train_step().step_time for _ in range(k)]
        self.faults += _minor_faults() - f0
        return out


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def interleave(ta, tb, *, rounds: int, steps: int, deadline: float | None = None, warmup: int = 0,
               margin: float | None = None, max_rounds: int | None = None, min_rounds: int = 1) -> dict:
    """``rounds`` rounds of ``steps`` steps of each side (a trainer of this process, or anything with
    ``steps(k)`` and ``tokens_per_step``: a :class:`Worker`), the order alternating; after ``min_rounds``
    (at least the first: the least a figure needs), no round starts that would end (as long as the last one
    took) past ``deadline`` (``time.monotonic()``). With a ``margin``: while the per-round ratios give no
    verdict after ``rounds`` rounds (:func:`trainperf.tune.stats.verdict`), more rounds follow, up to
    ``max_rounds``."""
    from trainperf.tune.stats import p_faster, verdict

    sides = {n: (t if hasattr(t, "steps") else InProcess(t)) for n, t in (("a", ta), ("b", tb))}
    faults0 = {n: s.faults for n, s in sides.items()}
    times: dict[str, list[float]] = {"a": [], "b": []}
    done, last = 0, 0.0
    limit = max(rounds, max_rounds or 0) if margin is not None else rounds
    per_round: list[float] = []
    for r in range(limit):
        if r >= rounds and verdict(per_round, margin) is not None:
            break  # decided
        if deadline is not None and r >= max(1, min_rounds) and time.monotonic() + last > deadline:
            break  # the next round would end past the deadline
        t0 = time.monotonic()
        for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
            times[name] += sides[name].steps(steps)
        done, last = done + 1, time.monotonic() - t0
        per_round.append(statistics.median(times["a"][r * steps:(r + 1) * steps])
                         / statistics.median(times["b"][r * steps:(r + 1) * steps]))
    tokens = sides["a"].tokens_per_step
    faults = {n: (sides[n].faults - faults0[n]) / max(1, len(times[n])) for n in sides}
    med = {n: statistics.median(t) for n, t in times.items()}
    return {"a_tokens_per_s": tokens / med["a"], "b_tokens_per_s": tokens / med["b"],
            "speedup": statistics.median(per_round) if per_round else float("nan"), "ratio_of_medians": med["a"] / med["b"],
            "a_step_s": med["a"], "b_step_s": med["b"],
            "b_faster_rounds": sum(x > 1 for x in per_round), "rounds": done, "rounds_planned": rounds,
            "round_ratios": per_round, "p_faster": p_faster(per_round),
            "a_minor_faults_per_step": faults["a"], "b_minor_faults_per_step": faults["b"],
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
        return interleave(trainers["a"], trainers["b"], rounds=rounds, steps=steps, deadline=deadline, warmup=warmup,
                          min_rounds=stats.MIN_ROUNDS)
    finally:
        for t in list(trainers.values()):
            release(t)
        trainers.clear()


# ------------------------------------------------------------------ a candidate in its own process
_CONTEXT = None


def _context():
    """The forkserver context: the server imports torch and the trainer once; each worker is a
    fork of it (milliseconds, not the seconds of a fresh interpreter), with no OpenMP or CUDA
    state to inherit (the server never runs a torch op)."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing as mp

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "trainperf.train.build", "trainperf.tune.trial"])
        _CONTEXT = ctx
    return _CONTEXT


@contextlib.contextmanager
def _without_main():
    """While a worker starts: the parent's ``__main__`` out of sight. The workers' code lives in
    trainperf, and multiprocessing would otherwise import the parent's main module again in the
    server and the workers (a user's script calling ``tune()`` without an ``if __name__ ==
    "__main__"`` guard would run again there)."""
    import sys
    import types

    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


class WorkerError(RuntimeError):
    """A candidate's worker raised ``kind`` (the exception's type name, kept so that an
    out-of-memory error is still classified as one) or died."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _send(conn, msg) -> bool:
    """Send to the parent; False when it has gone or closed its end (see :mod:`trainperf.interrupt`)."""
    from trainperf.interrupt import parent_gone

    try:
        conn.send(msg)
        return True
    except BaseException as exc:
        if parent_gone(exc) or isinstance(exc, ValueError):  # ValueError: this end already closed
            return False
        raise


def _error(exc: BaseException) -> tuple:
    return "error", (type(exc).__name__, str(exc).splitlines()[0][:500] if str(exc) else "")


def _worker_main(conn, cfg_data: dict, global_batch: int, warmup: int, env: dict | None = None) -> None:
    """A candidate's process. Ctrl-C is the parent's to handle (it closes its workers); SIGTERM (the
    parent closing a busy worker, or the user's) is a ``SystemExit`` that releases the trainer; a
    parent that went away (pipe closed) ends the worker quietly. It never prints a traceback of its own."""
    import os

    from trainperf import interrupt

    interrupt.worker_signals(term="exit")
    os.environ.update(env or {})  # a rank of a group: RANK, WORLD_SIZE, MASTER_ADDR/PORT, as torchrun sets them
    from trainperf.config.load import build_config

    trainer = None
    try:
        try:
            cfg = build_config(cfg_data, source="tune worker")
            if env:
                from trainperf.distributed.init import init_distributed

                init_distributed(backend=cfg.distributed.backend, device_type=cfg.run.device,
                                 timeout_s=min(float(cfg.distributed.timeout_s), GROUP_TIMEOUT_S), flight_recorder=False)
            trainer, m = prepare(cfg, global_batch=global_batch, warmup=warmup)
        except SystemExit:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which records the candidate's failure
            _send(conn, _error(exc))
            return
        if not _send(conn, ("ok", (m, trainer.tokens_per_step))):
            return
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent closed its end or went away
                return
            if msg[0] != "steps":
                return
            try:
                f0 = _minor_faults()
                times = [trainer.train_step().step_time for _ in range(msg[1])]
            except SystemExit:
                return
            except BaseException as exc:  # noqa: BLE001
                _send(conn, _error(exc))
                return
            if not _send(conn, ("ok", (times, _minor_faults() - f0))):
                return
    except SystemExit:  # SIGTERM between two steps of the above
        return
    finally:
        if trainer is not None:
            with contextlib.suppress(SystemExit):
                release(trainer)  # the loader's threads, worker processes and shared memory
        if env:  # a rank: end here, without a process-group teardown that could wait on a peer gone first
            os._exit(0)


_LIVE: set = set()  # every Worker started and not yet closed: close_all() stops them whatever was interrupted


def close_all() -> None:
    """Close every worker this process started and has not closed (after an interrupt, the ones a
    caller had no handle on yet)."""
    live = list(_LIVE)
    for w in live:
        w.stop()
    for w in live:
        w.close()


class Worker:
    """One candidate's trainer in its own process: built, first step and warm-up on start
    (``measured``: a :class:`Measured` without step figures, its peak memory the process's own),
    then ``steps(k)`` on request. Errors in the worker raise :class:`WorkerError` here.

    Stopping (:meth:`close`, also after Ctrl-C): an idle worker is asked to exit; a busy one (building,
    stepping) gets SIGTERM, which ends it through its ``finally`` (the trainer released); either is
    killed if still there after ``timeout_s``; this end of the pipe is closed last, once the worker is
    gone, so a worker never writes into a closed pipe while its parent is alive."""

    def __init__(self, cfg: Config, *, global_batch: int, warmup: int, env: dict | None = None, wait: bool = True,
                 timeout_s: float | None = None):
        from trainperf import interrupt

        ctx = _context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main,
                                args=(child, cfg.model_dump(mode="json"), global_batch, warmup, env),
                                daemon=False, name="trainperf-tune-trial")  # not daemonic: a loader
        # of the candidate may start its own workers; the worker exits when this end of the pipe closes
        self.faults = 0
        self.busy = True  # an answer is owed: to the start, then to each steps()
        with _without_main(), interrupt.starting():  # a Ctrl-C now is delivered once it is registered
            self.proc.start()
            _LIVE.add(self)
        child.close()
        if wait:
            try:
                self.started(self._recv(timeout_s))
            except BaseException:
                self.close()
                raise

    def started(self, answer) -> None:
        self.measured, self.tokens_per_step = answer

    def _recv(self, timeout_s: float | None = None):
        """The worker's answer; with ``timeout_s``, none by then kills the worker (the budget's end)."""
        if timeout_s is not None and not self.conn.poll(max(0.0, timeout_s)):
            self.kill()
            raise WorkerError("Timeout", f"the trial gave no answer within {max(0.0, timeout_s):.0f} s, the time left "
                                         "in the budget: it was stopped")
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            self.proc.join(5)
            code = self.proc.exitcode
            why = (f"killed by signal {-code}" + (" (SIGKILL: perhaps the kernel's out-of-memory killer)"
                                                   if code == -9 else "")) if code is not None and code < 0 \
                else f"exit code {code}"
            raise WorkerError("WorkerDied", f"the trial's process ended without an answer ({why})") from None
        self.busy = False
        if status == "error":
            raise WorkerError(*payload)
        return payload

    def steps(self, k: int, timeout_s: float | None = None) -> list[float]:
        self.busy = True
        self.conn.send(("steps", k))
        times, faults = self._recv(timeout_s)
        self.faults += faults
        return times

    def kill(self) -> None:
        _LIVE.discard(self)
        if self.proc.is_alive():
            self.proc.kill()
        if self.proc.pid is not None:
            self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to end (see the class doc) without waiting: :meth:`close` waits."""
        if not self.proc.is_alive():
            return
        if not self.busy:
            try:
                self.conn.send(("exit",))
                return
            except (OSError, ValueError):
                pass
        with contextlib.suppress(OSError):
            self.proc.terminate()

    def close(self, timeout_s: float = 10.0) -> None:
        _LIVE.discard(self)
        if self.proc.is_alive():
            self.stop()
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


class WorkerGroup:
    """A candidate on ``nproc`` ranks of this machine, each a :class:`Worker` launched the way torchrun
    would launch it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT; gloo on a CPU, NCCL on CUDA).
    The ranks step together; a step's time is the slowest rank's (they meet in every collective),
    its peak memory the largest rank's. One rank's error or death ends the whole group (the
    others are killed, not left waiting in a collective), and a group that answers nothing within
    ``timeout_s`` is killed and reported."""

    def __init__(self, cfg: Config, *, global_batch: int, warmup: int, nproc: int, timeout_s: float | None = None,
                 start_timeout_s: float | None = None):
        from trainperf.distributed.spawn import free_port

        self.timeout_s = timeout_s or GROUP_TIMEOUT_S + 30
        port = str(free_port())
        self.workers: list[Worker] = []
        try:
            for r in range(nproc):
                env = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
                self.workers.append(Worker(cfg, global_batch=global_batch, warmup=warmup, env=env, wait=False))
            answers = self._recv_all(start_timeout_s)
        except BaseException:
            self.close()
            raise
        for w, a in zip(self.workers, answers):
            w.started(a)
        ms = [w.measured for w in self.workers]
        self.measured = ms[0]
        self.measured.first_step_s = max(m.first_step_s for m in ms)
        self.measured.build_s = max(m.build_s for m in ms)
        peaks = [m.peak_memory_bytes for m in ms]
        self.measured.peak_memory_bytes = None if None in peaks else max(peaks)
        self.measured.peak_memory_source += f" (the largest of {nproc} ranks)"
        self.tokens_per_step = self.workers[0].tokens_per_step
        self.faults = 0
        self.proc = self.workers[0].proc

    def _recv_all(self, timeout_s: float | None = None) -> list:
        from multiprocessing.connection import wait

        answers: dict[int, object] = {}
        pending = {w.conn: i for i, w in enumerate(self.workers)}
        timeout_s = self.timeout_s if timeout_s is None else min(self.timeout_s, max(0.0, timeout_s))
        deadline = time.monotonic() + timeout_s
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                late = sorted(pending.values())
                self.kill()
                raise WorkerError("Timeout", f"rank(s) {late} answered nothing in {timeout_s:.0f} s (the collective "
                                             "timeout, or the time left in the budget): the group was stopped")
            for conn in ready:
                i = pending.pop(conn)
                try:
                    answers[i] = self.workers[i]._recv()
                except WorkerError as exc:
                    dead = self._dead_peer(i) if exc.kind != "WorkerDied" else None
                    self.kill()  # the other ranks may wait in a collective for this one: no orderly exit
                    if dead is not None:  # the root cause: a peer that died, whose death broke this rank's collective
                        raise WorkerError("WorkerDied", f"rank {dead}: the process ended without an answer (exit code "
                                                        f"{self.workers[dead].proc.exitcode}); rank {i} then failed: "
                                                        f"{exc.kind}: {exc}") from None
                    raise WorkerError(exc.kind, f"rank {i}: {exc}") from None
        return [answers[i] for i in range(len(self.workers))]

    def _dead_peer(self, failed: int, grace_s: float = 2.0) -> int | None:
        """A rank other than ``failed`` whose process has ended, waited for up to ``grace_s``: when one rank dies,
        a peer's collective fails (connection reset) at about the same moment, and the death is the cause."""
        deadline = time.monotonic() + grace_s
        while True:
            for j, w in enumerate(self.workers):
                if j != failed and w.proc.exitcode is not None:
                    return j
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def steps(self, k: int, timeout_s: float | None = None) -> list[float]:
        for w in self.workers:
            w.busy = True
            w.conn.send(("steps", k))
        answers = self._recv_all(timeout_s)
        times = [max(per_rank) for per_rank in zip(*(a[0] for a in answers))]
        self.faults += max(a[1] for a in answers)
        return times

    def kill(self) -> None:
        for w in self.workers:
            w.kill()

    def close(self) -> None:
        for w in self.workers:  # every rank asked first, then each waited for: they end together
            w.stop()
        for w in self.workers:
            w.close()


def start(cfg: Config, *, global_batch: int, warmup: int, nproc: int = 1, timeout_s: float | None = None):
    """A candidate started in its own process(es): a :class:`Worker`, or a :class:`WorkerGroup`; with
    ``timeout_s``, one not ready by then (built, first step, warm-up) is stopped."""
    if nproc > 1:
        return WorkerGroup(cfg, global_batch=global_batch, warmup=warmup, nproc=nproc, start_timeout_s=timeout_s)
    return Worker(cfg, global_batch=global_batch, warmup=warmup, timeout_s=timeout_s)


def run_group_trial(cfg: Config, *, global_batch: int, warmup: int = 2, steps: int = 5, nproc: int = 2) -> Measured:
    """:func:`run_trial` for ``nproc`` ranks (the unpaired path: one group at a time)."""
    t0 = time.perf_counter()
    g = WorkerGroup(cfg, global_batch=global_batch, warmup=warmup, nproc=nproc)
    try:
        m = g.measured
        m.step_s = statistics.median(g.steps(steps))
        m.tokens_per_s, m.elapsed_s = g.tokens_per_step / m.step_s, time.perf_counter() - t0
        return m
    finally:
        g.close()


def group_side_by_side(a: Config, b: Config, *, global_batch: int, rounds: int = 4, steps: int = 3,
                       warmup: int = 2, deadline: float | None = None, nproc: int = 2) -> dict:
    """:func:`side_by_side` for ``nproc`` ranks: both groups live, interleaved."""
    groups = []
    try:
        for cfg in (a, b):
            groups.append(WorkerGroup(cfg, global_batch=global_batch, warmup=warmup, nproc=nproc))
        return interleave(groups[0], groups[1], rounds=rounds, steps=steps, deadline=deadline, warmup=warmup,
                          min_rounds=stats.MIN_ROUNDS)
    finally:
        for g in groups:
            g.close()


class Paired:
    """Trials interleaved with the best so far, each in its own :class:`Worker` (see the module
    doc). ``run`` leaves the candidate's worker pending until :meth:`adopt` keeps or closes it;
    :meth:`close` closes everything."""

    def __init__(self, *, global_batch: int, warmup: int, rounds: int, steps: int,
                 margin: float | None = None, max_rounds: int | None = None, nproc: int = 1):
        self.global_batch, self.warmup, self.rounds, self.steps = global_batch, warmup, rounds, steps
        self.nproc = nproc
        self.margin, self.max_rounds = margin, max_rounds  # see interleave()
        self.default = self.best = self.pending = None

    def _start(self, cfg: Config, deadline: float | None) -> tuple[Worker, Measured, float]:
        t0 = time.perf_counter()
        w = start(cfg, global_batch=self.global_batch, warmup=self.warmup, nproc=self.nproc,
                  timeout_s=None if deadline is None else deadline - time.monotonic())
        return w, w.measured, t0

    def run_default(self, cfg: Config, *, steps: int, deadline: float | None = None) -> Measured:
        """The default's trial; with a ``deadline`` (``time.monotonic``) it is stopped there."""
        w, m, t0 = self._start(cfg, deadline)
        self.default = self.best = w
        try:
            times = w.steps(steps, None if deadline is None else deadline - time.monotonic())
        except BaseException:
            self.close()
            raise
        m.step_s = statistics.median(times)
        m.tokens_per_s, m.elapsed_s = w.tokens_per_step / m.step_s, time.perf_counter() - t0
        m.notes["minor_faults_per_step"] = w.faults / max(1, len(times))
        return m

    def run(self, cfg: Config, *, deadline: float | None = None) -> Measured:
        w, m, t0 = self._start(cfg, deadline)
        try:
            res = interleave(self.best, w, rounds=self.rounds, steps=self.steps, deadline=deadline,
                             warmup=self.warmup, margin=self.margin, max_rounds=self.max_rounds)
        except BaseException:
            w.close()
            raise
        self.pending = w
        m.step_s, m.tokens_per_s, m.paired = res["b_step_s"], res["b_tokens_per_s"], res
        m.notes["minor_faults_per_step"] = res["b_minor_faults_per_step"]
        m.elapsed_s = time.perf_counter() - t0
        return m

    def adopt(self, keep: bool) -> None:
        if self.pending is None:
            return
        if keep:
            if self.best is not self.default:
                self.best.close()
            self.best = self.pending
        else:
            self.pending.close()
        self.pending = None

    def final(self, *, rounds: int, steps: int, deadline: float | None = None) -> dict:
        """The default against the best, both live: no rebuild. The deadline cuts no round before the test
        can say *faster* at all (:data:`trainperf.tune.stats.MIN_ROUNDS`): under load, 4 rounds all faster at
        x1.67 were once "not faster" (p = 1/16), and a budget overrun of one round is the lesser harm."""
        return interleave(self.default, self.best, rounds=rounds, steps=steps, deadline=deadline, warmup=self.warmup,
                          min_rounds=stats.MIN_ROUNDS)

    def close(self) -> None:
        for w in {id(w): w for w in (self.pending, self.best, self.default) if w is not None}.values():
            w.close()
        self.default = self.best = self.pending = None

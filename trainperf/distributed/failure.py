"""Fail fast, and say who failed: never a silent hang.

Three layers, from the bottom:

1. Collectives time out after ``distributed.timeout_s`` (the process-group timeout; on CUDA,
   ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3`` tears the process down, see :mod:`.init`).
2. :class:`FailFast` records a heartbeat per rank in the launcher's key-value store at every
   step. When a step raises (a peer's socket closed, a collective timed out) or the launcher
   sends SIGTERM because another rank died, it prints one line naming this rank, the step, and
   the rank(s) whose heartbeat stopped (the dead or hung ones, with their last step), then exits
   with :data:`EXIT_CODE` without the clean-up that could hang.
3. A watchdog thread ends the process if no progress is made for ``2 x timeout_s + 60`` s
   (a hang outside any collective, e.g. in a data loader), with the same report; sooner, after
   ``timeout_s``, when a peer gives no sign of life meanwhile (a frozen rank, wherever this rank waits).

A frozen rank (SIGSTOP, a debugger) cannot run its own threads: its sign-of-life key stops advancing
and the ranks that wait for it name it ("frozen"). A stopped process cannot act on SIGTERM either, and
torchrun's agent waits 30 s after its SIGTERM before it sends SIGKILL: so the rank that reports a
stopped peer on its own host (the key holds the peer's pid, host and pid namespace, and ``/proc`` says
it is stopped) ends that process with SIGKILL before it exits, and the job ends within the timeout.
A peer on another host is named "died or froze" (no process to look at there).

Fault injection for tests: ``FailFast(..., fault=(kind, rank, step))`` (``Knobs.fault``; the CLI
takes it from ``TRAINPERF_FAULT=exit|hang|stop|collective|busy``, ``TRAINPERF_FAULT_RANK``,
``TRAINPERF_FAULT_STEP``) makes that rank exit (code 17), sleep forever, stop itself (SIGSTOP: frozen),
wait in a receive no rank sends (stuck in a collective) or, "busy", go on beside a busy process started on its
own CPUs (another job on the host: a straggler that appears mid-run) at that step.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_CODE = 3


def write_line(text: str, out=None) -> None:
    """Write ``text`` and its newline in one ``write(2)`` to ``out``'s file descriptor (stderr by default).

    The ranks of a job share the launcher's stderr: ``print`` writes the text and its newline in two calls,
    and two ranks failing at once interleaved them, one report glued to the end of the other's line. One
    write of under ``PIPE_BUF`` (4096) bytes to a pipe is atomic, so each rank's line stays whole."""
    out = out if out is not None else sys.stderr
    data = (text + "\n").encode("utf-8", "backslashreplace")
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is None:  # a StringIO or the like (tests): no descriptor, one write call
        out.write(text + "\n")
        out.flush()
        return
    out.flush()  # anything still buffered goes first, in order
    while data:
        data = data[os.write(fd, data):]
_PREFIX = "trainperf/heartbeat/"  # "<step> <time the step began>"
_ALIVE = "trainperf/alive/"  # "<time> <pid> <host#pid namespace>", refreshed every _ALIVE_EVERY_S by the watchdog thread
_DEAD_AFTER_S = 2.0
_ALIVE_EVERY_S = 0.5


def _store():
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if dist.is_initialized():
            return c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: reports say so
        pass
    return None


_SETTLED = ("died", "hung", "never reported", "frozen", "froze")


def _host() -> str:
    """This host and its pid namespace: where a peer's pid names the same process as here."""
    try:
        ns = os.readlink("/proc/self/ns/pid").replace(" ", "")
    except OSError:
        ns = "?"
    return f"{socket.gethostname()}#{ns}".replace(" ", "_")


_HOST = _host()


def process_state(pid: int) -> str | None:
    """This host's process ``pid``: its /proc state letter ("R", "S", "D", "T" stopped, "t" traced, "Z"...),
    "gone" when there is no such process, None where /proc cannot tell (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]  # the name, in parentheses, may hold spaces


def _settled(found: list[str]) -> bool:
    """A verdict that waiting cannot change: some rank is dead, hung or never started."""
    return any(word in s for s in found for word in _SETTLED)


class FailFast:
    """Heartbeats, failure reports and a watchdog for one rank."""

    def __init__(self, rank: int, world: int, timeout_s: float, *, store=None, watchdog: bool = True,
                 out=None, fault: tuple[str, int, int] | None = None, record_to=None):
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.record_to = record_to  # the run directory's failures.jsonl: the report, for diagnose afterwards
        self.fault = fault
        self.store = store if store is not None else _store()
        self.step = 0
        self.last_beat = time.monotonic()
        self.out = out or sys.stderr
        self._done = threading.Event()
        self._stopped: dict[int, int] = {}  # rank -> pid of a peer's process found stopped on this host
        self._failing = False
        self._lock = threading.Lock()
        self._thread = None
        if world > 1 and watchdog:
            self._thread = threading.Thread(target=self._watch, name="trainperf-watchdog", daemon=True)
            self._thread.start()
        if world > 1 and threading.current_thread() is threading.main_thread():
            self._prev_term = signal.signal(signal.SIGTERM, self._on_sigterm)

    # ------------------------------------------------------------------ heartbeats
    def beat(self, step: int) -> None:
        """Call at the start of every step."""
        self.step = step
        self.last_beat = time.monotonic()
        if self.store is not None and self.world > 1:
            try:
                self.store.set(f"{_PREFIX}{self.rank}", f"{step} {time.time():.3f}")
            except Exception:  # noqa: BLE001 - the store host may be gone; the report will say so
                pass
        if self.fault is not None:
            inject_fault(self.fault, self.rank, step)

    def _read(self, key: str):
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode().split()
        except Exception:  # noqa: BLE001
            raise ConnectionError from None

    def touch(self) -> None:
        """Progress without a new step (evaluation, checkpoint writing): keeps the watchdog quiet."""
        self.last_beat = time.monotonic()

    def heartbeats(self) -> dict[int, dict]:
        """Per rank: last step begun, seconds since it began it, seconds since its last sign of life."""
        out: dict[int, dict] = {}
        if self.store is None:
            return out
        now = time.time()
        for r in range(self.world):
            beat = self._read(f"{_PREFIX}{r}")
            alive = self._read(f"{_ALIVE}{r}")
            if beat is None:
                continue
            out[r] = {"step": int(beat[0]), "step_age": now - float(beat[1]),
                      "alive_age": now - float(alive[0]) if alive else float("inf"),
                      "pid": int(alive[1]) if alive and len(alive) > 2 else None,
                      "host": alive[2] if alive and len(alive) > 2 else None}
        return out

    def suspects(self) -> list[str]:
        beats = self.heartbeats()
        found: list[str] = []
        stopped: dict[int, int] = {}
        for r in range(self.world):
            if r == self.rank:
                continue
            b = beats.get(r)
            if b is None:
                found.append(f"rank {r} never reported a step")
            elif b["alive_age"] > _DEAD_AFTER_S:
                found.append(self._silent(r, b, stopped))
            elif b["step"] < self.step:
                found.append(f"rank {r} is behind (still in step {b['step']})")
            elif b["step_age"] > max(2.0, 0.5 * self.timeout_s):
                found.append(f"rank {r} hung (alive, stuck in step {b['step']} for {b['step_age']:.1f}s)")
        self._stopped = stopped
        return found

    def _silent(self, r: int, b: dict, stopped: dict[int, int]) -> str:
        """A peer with no sign of life: dead, or frozen (stopped, or stuck where its threads cannot run).
        On this host its process says which; a stopped one goes into ``stopped`` (:meth:`fail` ends it)."""
        age, step, pid = b["alive_age"], b["step"], b.get("pid")
        state = process_state(pid) if (pid and b.get("host") == _HOST and pid != os.getpid()) else None
        if state in ("gone", "Z", "X"):
            return f"rank {r} died (no sign of life for {age:.1f}s; it was in step {step})"
        if state in ("T", "t"):
            if state == "T":  # job control's stop (SIGSTOP), not a debugger's (traced: left alone)
                stopped[r] = pid
            return (f"rank {r} frozen / stopped (its process {pid} is stopped: SIGSTOP, or traced by a debugger; "
                    f"no sign of life for {age:.1f}s; it was in step {step})")
        if state is not None:
            return (f"rank {r} frozen / stuck (its process {pid} runs but its threads give no sign of life for "
                    f"{age:.1f}s, e.g. native code holding the GIL; it was in step {step})")
        return f"rank {r} died or froze (no sign of life for {age:.1f}s; it was in step {step})"

    def report(self, reason: str) -> str:
        try:
            # A peer that just died still looks alive for _DEAD_AFTER_S, and one killed between its last
            # collective and its next step looks merely "behind": wait for a settled verdict (died, hung,
            # never reported) until the deadline, then say what is known.
            found = self.suspects()
            deadline = time.monotonic() + _DEAD_AFTER_S + 2 * _ALIVE_EVERY_S
            while not _settled(found) and time.monotonic() < deadline:
                time.sleep(min(0.5, _ALIVE_EVERY_S))
                found = self.suspects()
            who = ("; ".join(found)) if found else "no other rank looks dead or hung (see the other ranks' reports)"
        except ConnectionError:
            who = "heartbeats unreadable (the store's host, the launcher or rank 0, is gone)"
        ended = ""
        if self._stopped:  # a stopped process cannot act on the launcher's SIGTERM (torchrun waits 30 s for it)
            ended = "; " + ", ".join(f"rank {r}'s stopped process {pid}" for r, pid in sorted(self._stopped.items())) \
                + " killed (SIGKILL), as it cannot end itself"
        return (f"trainperf: rank {self.rank} stopped at step {self.step}: {reason}. Cause: {who}. "
                f"Ending the job (distributed.timeout_s={self.timeout_s:g}{ended}).")

    def _end_stopped_peers(self) -> None:
        """SIGKILL the peers' processes this rank found stopped on its host (checked again just before)."""
        for pid in self._stopped.values():
            if process_state(pid) == "T":
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def fail(self, reason: str, code: int = EXIT_CODE) -> None:
        """Print the report and leave at once (no process-group clean-up: it could hang). A second trigger
        (SIGTERM from the launcher, the watchdog) while a report is being written leaves it to finish."""
        with self._lock:
            if self._failing:
                return
            self._failing = True
        try:
            text = self.report(reason)
            write_line(text, self.out)
            self._record(reason, text)
            self._end_stopped_peers()
        except Exception:  # noqa: BLE001
            pass
        finally:
            os._exit(code)

    def _record(self, reason: str, text: str) -> None:
        """One line in failures.jsonl (each rank its own, appended whole): what `trainperf diagnose` says later."""
        if self.record_to is None:
            return
        import json

        line = json.dumps({"rank": self.rank, "step": self.step, "reason": reason, "report": text,
                           "time": time.time()}) + "\n"
        fd = os.open(self.record_to, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def close(self) -> None:
        self._done.set()
        end_busy()

    # ------------------------------------------------------------------ triggers
    def _on_sigterm(self, signum, frame) -> None:
        from trainperf import interrupt

        if interrupt.received() is not None or self._failing:  # already stopping: the clean-up runs on
            return
        if not self._peer_lost():  # the job was stopped as a whole (the user, the scheduler): a quiet stop
            interrupt.handle(signum, frame)  # Terminated, as in one process: exit 143, no report
        self.fail("terminated by the launcher (another rank exited)", code=128 + signal.SIGTERM)

    def _peer_lost(self) -> bool:
        """Did another rank die or stop reporting? (Heartbeats; unreadable heartbeats count as lost.)"""
        deadline = time.monotonic() + _DEAD_AFTER_S + 2 * _ALIVE_EVERY_S  # a peer that just died still looks alive
        while True:
            try:
                if any(w in s for s in self.suspects() for w in ("died", "never reported", "frozen", "froze")):
                    return True
            except ConnectionError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _watch(self) -> None:
        # Generous: collectives already fail after timeout_s; this catches a whole job stuck elsewhere.
        limit = 2 * self.timeout_s + 60.0
        alive = f"{os.getpid()} {_HOST}"
        while True:
            if self.store is not None:
                try:
                    self.store.set(f"{_ALIVE}{self.rank}", f"{time.time():.3f} {alive}")
                except Exception:  # noqa: BLE001
                    pass
            if self._done.wait(_ALIVE_EVERY_S):
                return
            idle = time.monotonic() - self.last_beat
            if self.step > 0 and idle > limit:
                self.fail(f"no step finished for {limit:.0f}s (watchdog)")
            if self.step > 0 and idle > self.timeout_s and self._peer_silent():
                # wherever this rank waits (a collective's own timeout may be longer, a store call), a peer
                # with no sign of life (dead or frozen) will not come back
                self.fail(f"no step finished for {idle:.0f}s and a peer gives no sign of life (watchdog)")

    def _peer_silent(self) -> bool:
        try:
            return any(w in s for s in self.suspects() for w in ("died", "frozen", "froze"))
        except ConnectionError:
            return False

    def guard(self):
        """Context manager around the training loop: a collective error becomes a report and exit."""
        return _Guard(self)


class _Guard:
    def __init__(self, ff: FailFast):
        self.ff = ff

    def __enter__(self):
        return self.ff

    def __exit__(self, exc_type, exc, tb):
        self.ff.close()
        if exc is None or self.ff.world <= 1:
            return False
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return False
        from trainperf import interrupt

        if interrupt.received() is not None:  # a collective broken by the same Ctrl-C / SIGTERM: part of stopping
            return False
        from trainperf.errors import UserError

        if isinstance(exc, UserError):
            return False
        text = str(exc).strip().splitlines()
        first = next((ln for ln in text if ln.strip()), type(exc).__name__)[:300]
        self.ff.fail(f"{type(exc).__name__}: {first}")
        return False


_STUCK_TAG = 7717  # no send ever uses it


def inject_fault(fault: tuple[str, int, int], rank: int, step: int) -> None:
    """``fault = (kind, rank, step)``: on that rank at that step, exit (kind "exit", code 17), hang (sleep),
    stop (SIGSTOP to itself: frozen, every thread, until a SIGCONT), wait in a collective that never
    completes ("collective": a receive from the next rank, which never sends it) or go on beside a busy
    process on its own CPUs ("busy": :func:`start_busy`)."""
    kind, at_rank, at_step = fault
    if at_rank != rank or at_step != step:
        return
    write_line(f"trainperf: injected fault {kind!r} on rank {rank} at step {step} (t={time.time():.3f}) in process "
               f"{os.getpid()}")
    if kind == "busy":
        start_busy(step)
        return
    if kind == "exit":
        os._exit(17)
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "collective":  # a receive its peer never sends: stuck in a collective until the group's timeout
        import torch
        import torch.distributed as dist

        dist.recv(torch.zeros(1), src=(rank + 1) % dist.get_world_size(), tag=_STUCK_TAG)


# A busy loop that dies with the process that started it (PR_SET_PDEATHSIG where Linux has it; a parent
# already gone before the call is checked after it) and leaves Ctrl-C to the job.
_BUSY_CODE = ("import ctypes, os, sys\n"
              "try:\n    ctypes.CDLL(None).prctl(1, 9)\nexcept Exception:\n    pass\n"
              "if os.getppid() != int(sys.argv[1]):\n    sys.exit(0)\n")
_busy: list[subprocess.Popen] = []
busy_log: list[dict] = []  # {"step", "time", "pid"} of each busy process started in this process


def start_busy(step: int = 0) -> subprocess.Popen:
    """Start a busy process on this process's CPUs (it inherits the affinity: a rank pinned to one CPU gets
    its CPU shared, as with another job on the host); it runs until :func:`end_busy` or this process ends."""
    from trainperf import interrupt

    proc = subprocess.Popen([sys.executable, "-c", _BUSY_CODE + interrupt.HOG_CODE, str(os.getpid())],
                            stdin=subprocess.DEVNULL)
    if not _busy:
        import atexit

        atexit.register(end_busy)
    _busy.append(proc)
    busy_log.append({"step": step, "time": time.time(), "pid": proc.pid})
    return proc


def end_busy() -> None:
    """End the busy processes :func:`start_busy` started (none: nothing to do)."""
    while _busy:
        proc = _busy.pop()
        proc.kill()
        proc.wait()

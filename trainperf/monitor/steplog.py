"""Step records on their way to metrics.jsonl: on disk within ``monitor.flush_s``, no host sync per step.

Records used to reach the file only every ``run.log_every`` steps, when the window's losses were
brought to the host: a run killed between two flushes lost its last window, the seconds a user
most needs after a crash, an OOM kill or a hang. Now:

* ``add(record, loss=..., grad_norm=...)`` every step. The record (step, lr, step time, phases,
  ...) is host data already; the scalars are device tensors, handled by where they live:

  - numbers and CPU tensors: read at once (CPU ops are synchronous) and written in the step's
    own line;
  - CUDA: one ``non_blocking`` copy into pinned host memory and a CUDA event, no host sync. The
    values go into a follow-up line of the same step once the event has completed;
  - other devices (XLA's lazy tensors: reading one runs the graph): read at the next ``wait()``.

* A daemon thread calls ``flush()`` every ``flush_s``: every pending record is written, and the
  follow-ups whose values are ready (``event.query()``: it never blocks).
* ``wait()`` at each log interval is the one host sync per interval, as before: it waits for the
  window's values, writes everything and returns them (``fit`` checks they are finite, prints).

File format (the readers merge: :func:`trainperf.monitor.rundir.merge_parts`)::

    {"step": 12, "lr": ..., "step_time_s": ..., "phases_s": {...}, "loss": 3.21}   numbers / CPU: one line
    {"step": 12, "lr": ..., "step_time_s": ..., "phases_s": {...}}                  CUDA: the timing line,
    {"step": 12, "part": "values", "loss": 3.21, "grad_norm": 0.8}                  its values later

A ``"part"`` line completes the latest step record of the same step before it in the same file.
One writer appends under a lock, a timing line always before its values line, each batch of lines
in one ``write``: a kill leaves at most one torn last line, which the readers skip.

Guarantee: a record, and a value once it is ready on the device, is on disk within ``flush_s``
plus the time the flusher thread waits to be scheduled and to write (milliseconds; more on a
machine whose cores are all busy). Records newer than that may be lost by a kill; nothing older.
An exit of the interpreter without ``close()`` (an uncaught exception in a framework that has no
error hook, a script that never closes) writes everything already on the host (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import warnings
from collections import deque
from typing import Any, Callable

import torch

PART_VALUES = "values"  # the "part" of a follow-up line holding a step's device scalars


def _scalar(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().float()
    return t.reshape(()) if t.numel() == 1 else t.mean()  # a loss per sample: its mean


class _Values:
    """One step's scalars (name -> number, tensor, or a list of them to average) on their way to the host."""

    __slots__ = ("step", "names", "slots", "out", "host", "event", "lazy")

    def __init__(self, step, values: dict[str, Any]):
        self.step = step
        self.names: list[tuple[str, int]] = []  # (name, how many parts)
        self.slots: list = []  # every part in order: a number, or a tensor
        for name, v in values.items():
            parts = [p for p in (v if isinstance(v, (list, tuple)) else [v]) if p is not None]
            if parts:
                self.names.append((name, len(parts)))
                self.slots.extend(parts)
        self.out: dict[str, float] | None = None
        self.host = self.event = self.lazy = None
        tensors = [t for t in self.slots if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors}
        if not tensors or devices == {torch.device("cpu")}:
            self.out = self._compose([float(_scalar(t)) for t in tensors])  # CPU: the values exist now
        elif len(devices) == 1 and next(iter(devices)).type == "cuda" and torch.cuda.is_available():
            dev = next(iter(devices))
            vec = torch.stack([_scalar(t) for t in tensors])  # one small kernel
            self.host = torch.empty(vec.shape, dtype=torch.float32, pin_memory=True)
            self.host.copy_(vec, non_blocking=True)  # no host sync: queued behind the step's kernels
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(dev))
        else:
            self.lazy = tensors  # XLA and the like: read at the interval's wait()

    def _compose(self, tensor_values: list[float]) -> dict[str, float]:
        it = iter(tensor_values)
        flat = [next(it) if isinstance(p, torch.Tensor) else float(p) for p in self.slots]
        out, i = {}, 0
        for name, n in self.names:
            part = flat[i:i + n]
            i += n
            out[name] = sum(part) / n  # a step of several micro-batches: their mean; NaN stays NaN (null on disk)
        return out

    def resolve(self, block: bool) -> dict[str, float] | None:
        """The values, or None when they are not on the host yet and ``block`` is False."""
        if self.out is not None:
            return self.out
        if self.event is not None:
            if not block and not self.event.query():
                return None
            self.event.synchronize()  # host-device sync point (wait() only: the log interval)
            self.out = self._compose(self.host.tolist())
        elif self.lazy is not None:
            if not block:
                return None
            self.out = self._compose(torch.stack([_scalar(t) for t in self.lazy]).cpu().tolist())
        return self.out


class StepLog:
    """Step records and their values, written by ``emit(records)`` within ``flush_s`` (see the module)."""

    def __init__(self, emit: Callable[[list[dict]], None], *, flush_s: float = 2.0):
        self._emit = emit
        self.flush_s = float(flush_s)
        self._lock = threading.Lock()
        self._records: list[dict] = []  # records not written yet
        self._waiting: deque[_Values] = deque()  # values not on the host (or not written) yet, in step order
        self._done: list[tuple[Any, dict]] = []  # (step, values) on the host since the last wait()
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainperf-steplog", daemon=True)
        self._thread.start()
        atexit.register(self._flush_at_exit)  # an exit without close(): what is on the host still reaches the disk

    def add(self, record: dict, **values) -> None:
        """Queue one step's record; ``values`` (loss, grad_norm, ...) follow it when they reach the host."""
        v = _Values(record.get("step"), values)
        with self._lock:
            if v.out is not None:
                record.update(v.out)
                self._done.append((v.step, v.out))
            else:
                self._waiting.append(v)
            self._records.append(record)

    def write_now(self, record: dict) -> None:
        """Write a record at once (an eval record, a library user's record), after everything queued before it."""
        with self._lock:
            self._flush_locked(block=False, extra=[record])

    def flush(self, block: bool = False) -> None:
        with self._lock:
            self._flush_locked(block)

    def wait(self) -> list[tuple[Any, dict]]:
        """Wait for every queued value (one host sync), write everything; the (step, values) since the last wait."""
        with self._lock:
            self._flush_locked(block=True)
            done, self._done = self._done, []
        return done

    def _flush_locked(self, block: bool, extra: list[dict] | None = None) -> None:
        out, self._records = self._records, []
        while self._waiting:
            v = self._waiting[0]
            vals = v.resolve(block)
            if vals is None:
                break  # in stream order: the later steps are not ready either
            self._waiting.popleft()
            self._done.append((v.step, vals))
            if vals:
                out.append({"step": v.step, "part": PART_VALUES, **vals})
        out.extend(extra or [])
        if out:
            try:
                self._emit(out)
            except BaseException:
                self._records[:0] = out  # kept, in order, for the next flush
                raise

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - a failing write (disk full) must not stop training
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"trainperf: writing metrics failed ({type(exc).__name__}: {exc}); "
                                  "records are kept in memory and retried", stacklevel=2)

    def _flush_at_exit(self) -> None:
        """The interpreter exits and nobody called close() (an exception in a framework without an error hook,
        a script that forgot close()): the daemon thread dies with it, so write what is on the host now."""
        with contextlib.suppress(Exception):
            self.flush()

    def close(self, wait: bool = True) -> None:
        """Stop the thread and write what is left: every value (``wait``), or only those already on the host
        (after an error: a broken device must not hang the exit)."""
        atexit.unregister(self._flush_at_exit)
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(2.0, 2 * self.flush_s))
        with self._lock:
            self._flush_locked(block=wait)

"""Measured memory: saved activations of one real micro-batch, model-state tensors, CUDA peak.

Activations are the bytes the autograd graph holds for backward once the forward is done
(the caller's outputs dropped, only the loss kept). Two counters, one set of storages:

* ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves outside a
  checkpointed region (inside one, checkpoint's own hooks take over and the outer ones see nothing);
* a ``TorchDispatchMode`` that records every storage an op allocates during the forward and
  checks, after it, which are still alive: this sees what checkpoint keeps (a region's inputs, the
  selective-checkpoint cache) and autocast's weight copies.

Each storage is counted once (keyed on ``untyped_storage().data_ptr()``); storages that existed
before the forward (parameters, buffers, the batch) are not activations and are ignored.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainperf.memory.ac import SAVE_OPS


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass
class _Alloc:
    ref: StorageWeakRef
    nbytes: int
    op: str
    block: int | None  # index of the block running when it was allocated (tracing), else None
    save_op: bool  # allocated by an op selective checkpointing keeps


class _AllocRecorder(TorchDispatchMode):
    """Records the storages ops allocate (views and in-place results share an input's storage and
    are skipped)."""

    def __init__(self, ignore: set[int]):
        super().__init__()
        self.ignore = ignore
        self.allocs: dict[int, _Alloc] = {}
        self.block: int | None = None
        self.save_op_bytes: dict[int, int] = {}  # per block: bytes allocated by SAVE_OPS (tracing)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in inputs or key in self.ignore or st.nbytes() == 0:
                continue
            if self.block is not None and func in SAVE_OPS:
                self.save_op_bytes[self.block] = self.save_op_bytes.get(self.block, 0) + st.nbytes()
            old = self.allocs.get(key)
            if old is None or old.ref.expired():  # a freed address may be reused
                self.allocs[key] = _Alloc(StorageWeakRef(st), st.nbytes(), str(func), self.block,
                                          func in SAVE_OPS)
        return out


@dataclass
class ActivationMeasurement:
    """Bytes held for backward after one forward (see module doc)."""

    bytes: int
    saved_hook_bytes: int  # part seen by saved_tensors_hooks
    retained_bytes: int  # part found alive by the allocation recorder
    by_op: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "saved_hook_bytes": self.saved_hook_bytes,
                "retained_bytes": self.retained_bytes}


def _existing_storages(model: nn.Module, batch: Iterable) -> set[int]:
    keys = {_storage_key(p) for p in model.parameters()}
    keys |= {_storage_key(b) for b in model.buffers()}
    keys |= {_storage_key(p.grad) for p in model.parameters() if p.grad is not None}
    keys |= {_storage_key(t) for t in tree_leaves(batch) if isinstance(t, torch.Tensor)}
    return keys


def loss_of(out) -> torch.Tensor:
    """The loss from a model output: ``(logits, loss)`` (trainperf's convention) or a scalar."""
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().mean()
    if isinstance(out, (tuple, list)) and len(out) >= 2 and isinstance(out[1], torch.Tensor):
        return out[1]
    raise TypeError("model output must be (logits, loss) or a loss tensor")


def measure_activations(model: nn.Module, batch: tuple, *, autocast=None, backward: bool = True,
                        tracer: Callable[[_AllocRecorder], contextlib.AbstractContextManager] | None = None,
                        ) -> ActivationMeasurement:
    """Run one forward of ``model(*batch)`` and count the activation bytes it leaves for backward.

    ``autocast``: a context manager (e.g. ``torch.autocast("cpu", dtype=torch.bfloat16)``).
    With ``backward`` the graph is consumed afterwards (gradients accumulate in ``.grad``).
    """
    ignore = _existing_storages(model, batch)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.device.type != "meta":
            key = _storage_key(t)
            if key not in ignore:
                saved.setdefault(key, t.untyped_storage().nbytes())
        return t

    recorder = _AllocRecorder(ignore)
    with contextlib.ExitStack() as stack:
        stack.enter_context(recorder)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        if tracer is not None:
            stack.enter_context(tracer(recorder))
        if autocast is not None:
            stack.enter_context(autocast)
        out = model(*batch)
    loss = loss_of(out)
    del out  # reference counting frees the logits now (gc.collect() costs ~0.5 s with torch loaded)
    alive = {k: a for k, a in recorder.allocs.items() if not a.ref.expired() and k != _storage_key(loss)}
    union = dict(saved)
    for k, a in alive.items():
        union.setdefault(k, a.nbytes)
    by_op: dict[str, int] = {}
    for k, a in alive.items():
        by_op[a.op] = by_op.get(a.op, 0) + a.nbytes
    result = ActivationMeasurement(bytes=sum(union.values()), saved_hook_bytes=sum(saved.values()),
                                   retained_bytes=sum(a.nbytes for a in alive.values()), by_op=by_op)
    result._alive = alive  # for tracing (trainperf.memory.trace)
    result._save_op_bytes = dict(recorder.save_op_bytes)
    if backward:
        loss.backward()
    del loss
    return result


# --------------------------------------------------------------------------- model states
@dataclass
class StateMeasurement:
    params: int
    grads: int
    optimizer: int


def _unique_bytes(tensors: Iterable[torch.Tensor], seen: set[int]) -> int:
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def measure_states(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> StateMeasurement:
    """Bytes of parameters, gradients and optimizer states, from the tensors (each storage once).
    Call after at least one optimizer step (Adam creates its states lazily)."""
    seen: set[int] = set()
    params = _unique_bytes(model.parameters(), seen)
    grads = _unique_bytes((p.grad for p in model.parameters() if p.grad is not None), seen)
    opt = 0
    if optimizer is not None:
        opt = _unique_bytes((v for st in optimizer.state.values() for v in st.values()), seen)
    return StateMeasurement(params, grads, opt)


def cuda_peak_step(model: nn.Module, batch: tuple, optimizer, *, autocast=None) -> int | None:
    """``torch.cuda.max_memory_allocated`` over one full step (None off CUDA)."""
    if not torch.cuda.is_available() or next(model.parameters()).device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with autocast if autocast is not None else contextlib.nullcontext():
        loss = loss_of(model(*batch))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


# --------------------------------------------------------------------------- step time
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fwd_bwd(models: dict[str, nn.Module], batch: tuple, *, reps: int = 7, warmup: int = 1,
                 autocast_factory: Callable[[], contextlib.AbstractContextManager] | None = None,
                 progress=None, cpu_times: dict[str, float] | None = None) -> dict[str, float]:
    """Median wall seconds of forward+backward per model, interleaved (model A, B, C, A, B, C, ...)
    so that machine noise hits every model alike. ``cpu_times``, if given, receives the median
    process CPU seconds per step (robust to other jobs on a shared CPU when torch uses 1 thread)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    cpus: dict[str, list[float]] = {name: [] for name in models}
    for rep in range(warmup + reps):
        for name, model in models.items():
            device = next(model.parameters()).device
            model.zero_grad(set_to_none=True)
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            with autocast_factory() if autocast_factory else contextlib.nullcontext():
                loss = loss_of(model(*batch))
            loss.backward()
            _sync(device)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if rep >= warmup:
                times[name].append(dt)
                cpus[name].append(dc)
            del loss
            if progress is not None:
                progress.update(1)
    for model in models.values():
        model.zero_grad(set_to_none=True)
    if cpu_times is not None:
        cpu_times.update({name: statistics.median(ts) for name, ts in cpus.items()})
    return {name: statistics.median(ts) for name, ts in times.items()}

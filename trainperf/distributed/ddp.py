"""DDP with gradient-compression communication hooks and bytes on the wire counted.

Hooks (``parallelism.compression.type``):

- ``none``: plain averaging all-reduce of each gradient bucket (fp32), counted.
- ``fp16`` / ``bf16``: the bucket is cast to 16 bits, divided by the group size, all-reduced
  and cast back (half the bytes). Where a backend cannot all-reduce bf16 (older gloo builds;
  PyTorch's own ``bf16_compress_hook`` is documented for NCCL only), the bf16 hook all-gathers
  the 16-bit payloads (as raw bytes) and sums them in fp32 locally.
- ``powersgd``: PyTorch's PowerSGD (Vogels et al. 2019) with error feedback: each gradient
  matrix n x m is sent as two rank-r factors (n + m) x r; vectors (biases, norms) go uncompressed.
  ``warmup_steps`` plain all-reduces first (at least 2: PyTorch's PowerSGD needs one uncompressed
  step to set up error feedback).

Counting: every tensor handed to an all-reduce / all-gather by these hooks is added to the
:class:`CommCounter` given to :func:`apply_ddp` (``payload_bytes``; the trainer owns one per run);
``wire_bytes`` is the ring estimate per rank, 2 (n - 1) / n x payload for all-reduce and
(n - 1) / n x gathered bytes for all-gather. PowerSGD's payload is read from PyTorch's own
accounting (``PowerSGDState.total_numel_after_compression``: P and Q factors plus the tensors it
leaves uncompressed), so nothing inside PyTorch is patched.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from trainperf.distributed.parallel_dims import check_compression  # noqa: F401  (re-export)
from trainperf.errors import ConfigError


@dataclass
class CommCounter:
    """Gradient bytes handed to collectives since the last :meth:`take` (thread-safe)."""

    payload_bytes: int = 0
    wire_bytes: float = 0.0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_allreduce(self, t: torch.Tensor, n: int) -> None:
        self.add_allreduce_bytes(t.numel() * t.element_size(), n)

    def add_allreduce_bytes(self, b: int, n: int) -> None:
        with self._lock:
            self.payload_bytes += b
            self.wire_bytes += 2 * (n - 1) / n * b
            self.calls += 1

    def add_allgather(self, t: torch.Tensor, n: int) -> None:
        b = t.numel() * t.element_size()  # this rank's contribution
        with self._lock:
            self.payload_bytes += b
            self.wire_bytes += (n - 1) * b
            self.calls += 1

    def take(self) -> dict:
        with self._lock:
            out = {"comm_payload_bytes": self.payload_bytes, "comm_wire_bytes": int(self.wire_bytes),
                   "comm_calls": self.calls}
            self.payload_bytes, self.wire_bytes, self.calls = 0, 0.0, 0
        return out



# ---------------------------------------------------------------------- hooks
@dataclass
class HookState:
    group: object
    counter: CommCounter
    dtype: torch.dtype | None = None  # None: no cast
    gather_fallback: bool = False  # bf16 on a backend without bf16 all-reduce


def allreduce_hook(state: HookState, bucket):  # no return annotation: DDP checks it literally
    """Average one bucket, optionally through a 16-bit payload; counted in ``state.counter``."""
    group = state.group
    n = dist.get_world_size(group)
    buf = bucket.buffer()
    if state.dtype is None:
        payload = buf.div_(n)
    else:
        payload = buf.to(state.dtype).div_(n)
    if state.gather_fallback:
        return _gather_sum(payload, buf, group, n, state.counter)
    state.counter.add_allreduce(payload, n)
    fut = dist.all_reduce(payload, group=group, async_op=True).get_future()

    def done(f):
        val = f.value()[0]
        if val is not buf:
            buf.copy_(val)
        return buf

    return fut.then(done)


def _gather_sum(payload: torch.Tensor, buf: torch.Tensor, group, n: int, counter: CommCounter) -> torch.futures.Future:
    bits = payload.view(torch.uint8)  # all-gather moves bytes; no arithmetic on bf16 needed
    outs = [torch.empty_like(bits) for _ in range(n)]
    counter.add_allgather(bits, n)
    fut = dist.all_gather(outs, bits, group=group, async_op=True).get_future()

    def done(_):
        total = torch.zeros_like(buf, dtype=torch.float32)
        for o in outs:
            total += o.view(payload.dtype).float()
        buf.copy_(total)
        return buf

    return fut.then(done)


def _powersgd_counted(state, bucket):
    """PyTorch's PowerSGD hook, with the elements it hands to all-reduce counted: the plain bucket
    during warm-up, else the growth of PyTorch's own ``total_numel_after_compression``."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    buf = bucket.buffer()
    n = dist.get_world_size(state.process_group)
    if state.iter < state.start_powerSGD_iter:
        state.trainperf_counter.add_allreduce(buf, n)
        return ps.powerSGD_hook(state, bucket)
    before = state.total_numel_after_compression
    fut = ps.powerSGD_hook(state, bucket)
    state.trainperf_counter.add_allreduce_bytes((state.total_numel_after_compression - before) * buf.element_size(), n)
    return fut


# ---------------------------------------------------------------------- capability checks
def backend_supports_allreduce(group, dtype: torch.dtype, device: torch.device) -> bool:
    """Try a one-element all-reduce of ``dtype`` on ``group`` (every rank of the group must call)."""
    try:
        t = torch.ones(1, dtype=dtype, device=device)
        dist.all_reduce(t, group=group)
        return True
    except (RuntimeError, ValueError, TypeError):
        return False


# ---------------------------------------------------------------------- apply
def apply_ddp(model: nn.Module, dp_mesh, *, counter: CommCounter, compression: str = "none",
              powersgd_rank: int = 4, powersgd_warmup: int = 10, device: torch.device | None = None,
              bucket_cap_mb: float = 25.0, bf16_gather: bool = False) -> nn.Module:
    """Wrap ``model`` (materialized) in DDP over ``dp_mesh`` with the hook for ``compression``,
    counting gradient bytes in ``counter``. ``bf16_gather`` takes the bf16 all-gather path even where
    the backend can all-reduce bf16 (tests)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dp_mesh.get_group() if hasattr(dp_mesh, "get_group") else dp_mesh
    device = device or next(model.parameters()).device
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb,
              device_ids=[device.index] if device.type == "cuda" else None)
    if compression in ("none", "fp16", "bf16"):
        dtype = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[compression]
        fallback = False
        if dtype == torch.bfloat16 and bf16_gather:
            fallback = True
        elif dtype is not None and not backend_supports_allreduce(group, dtype, device):
            if dtype == torch.bfloat16:
                fallback = True  # all-gather 16-bit payloads, sum in fp32
            else:
                raise ConfigError(
                    f"parallelism.compression.type={compression!r}: the {dist.get_backend(group)} backend cannot "
                    "all-reduce float16 on this device; use compression.type=bf16 or none"
                )
        ddp.register_comm_hook(HookState(group, counter, dtype, fallback), allreduce_hook)
    elif compression == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        class CountedPowerSGDState(PowerSGDState):
            __slots__ = ("trainperf_counter",)

        state = CountedPowerSGDState(process_group=group, matrix_approximation_rank=powersgd_rank,
                                     start_powerSGD_iter=max(2, powersgd_warmup), min_compression_rate=2,
                                     use_error_feedback=True, warm_start=True, random_seed=0)
        state.trainperf_counter = counter
        ddp.register_comm_hook(state, _powersgd_counted)
    else:
        raise ConfigError(f"unknown parallelism.compression.type={compression!r}; use none, fp16, bf16 or powersgd")
    return ddp


def ddp_comm_bytes(param_numel: int, n: int, *, grad_bytes: int = 4) -> dict:
    """Ring all-reduce of the gradients once per optimizer step (REFERENCE.md): 2 (n - 1) / n x bytes."""
    payload = param_numel * grad_bytes
    return {"payload": payload, "total": int(2 * (n - 1) / n * payload) if n > 1 else 0}

"""Batches onto the XLA device through torch_xla's ParallelLoader, keeping an exact data position.

The wrapped loader (``simple`` or ``hybrid``, built for the CPU) runs in ParallelLoader's
background thread; a transfer thread uploads each batch to the device ahead of use (the same
mechanism as ``MpDeviceLoader``). Prefetching reads ahead of training, so each batch travels
with the wrapped loader's state *after* it was drawn: ``state_dict()`` is the position after the
last batch the trainer consumed, and a resume continues with exactly the next batch.
"""

from __future__ import annotations

from typing import Any

import torch


class XlaDeviceLoader:
    def __init__(self, cpu_loader: Any, device: torch.device, *, prefetch: int = 4):
        self.cpu, self.device, self.prefetch = cpu_loader, device, max(1, prefetch)
        self._state = cpu_loader.state_dict()  # the position of the next batch to consume
        self._pl = None
        self._it = None
        self.last_shape: tuple | None = None  # (B, T) of the last batch handed out

    def _batches(self):
        # runs in ParallelLoader's loader thread; the main thread only touches self.cpu after close()
        while True:
            x, y = self.cpu.next_batch()
            yield x, y, _Opaque(self.cpu.state_dict())

    def _start(self) -> None:
        import torch_xla.distributed.parallel_loader as pl

        self._pl = pl.ParallelLoader(self._batches(), [self.device], loader_prefetch_size=self.prefetch,
                                     device_prefetch_size=max(1, self.prefetch // 2))
        self._it = self._pl.per_device_loader(self.device)

    def next_batch(self, shares=None) -> tuple[torch.Tensor, torch.Tensor]:
        if shares is not None:
            raise NotImplementedError("per-rank batch shares (load balancing) are not supported on XLA")
        if self._it is None:
            self._start()
        x, y, state = next(self._it)  # (B, T) each, already on the device
        self._state = state.value
        self.last_shape = tuple(x.shape)
        return x, y

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self._stop()  # batches read ahead from the old position are dropped
        self.cpu.load_state_dict(state)
        self._state = self.cpu.state_dict()

    def _stop(self) -> None:
        if self._pl is not None:
            self._pl.close()
            self._pl = self._it = None

    def close(self) -> None:
        self._stop()
        close = getattr(self.cpu, "close", None)
        if close is not None:
            close()

    def __del__(self):  # the background threads are daemons; this only stops them early
        try:
            self._stop()
        except Exception:  # noqa: BLE001
            pass


class _Opaque:
    """Carries a Python object through ParallelLoader untouched (only CPU tensors are uploaded)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

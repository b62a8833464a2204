"""Deterministic, resumable, distributed batch sampling.

Each step takes one *global batch* of sample indices from a permutation that
depends only on (seed, epoch); data-parallel rank ``r`` reads its contiguous
share of it. So the samples of a step are the same whatever the layout (one
process or many), no two ranks see the same sample in an epoch, and every rank
takes the same number of steps (no hang). ``state_dict()`` is (epoch, position)
and a resumed sampler yields exactly the remaining order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from trainperf.errors import DataError


class GlobalBatchSampler:
    def __init__(self, num_samples: int, global_batch: int, *, rank: int = 0, world: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True):
        if global_batch % world:
            raise DataError(f"global batch {global_batch} is not divisible by {world} data-parallel ranks")
        if num_samples < global_batch:
            raise DataError(
                f"the data has {num_samples} samples, fewer than one global batch of {global_batch}; "
                "use more data (data.prepare_max_bytes) or a smaller train.global_batch"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.rank, self.world = rank, world
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0
        self.position = 0  # global batches already taken in this epoch
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def _permutation(self) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            if self.shuffle:
                self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
            else:
                self._perm = np.arange(self.num_samples)
            self._perm_epoch = self.epoch
        return self._perm

    def next_global(self) -> np.ndarray:
        """Indices of the next global batch (all ranks), advancing the position."""
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        perm = self._permutation()
        start = self.position * self.global_batch
        idx = perm[start:start + self.global_batch]
        if len(idx) < self.global_batch:  # pad by wrapping to the epoch's start (drop_last=False)
            idx = np.concatenate([idx, perm[: self.global_batch - len(idx)]])
        self.position += 1
        return idx

    def split(self, global_idx: np.ndarray, shares: Sequence[int] | None = None) -> np.ndarray:
        """This rank's part of a global batch: equal shares, or ``shares`` samples per rank (summing to it)."""
        if shares is None:
            per = self.global_batch // self.world
            return global_idx[self.rank * per:(self.rank + 1) * per]
        if sum(shares) != len(global_idx):
            raise ValueError(f"shares {list(shares)} do not sum to the global batch {len(global_idx)}")
        start = int(sum(shares[: self.rank]))
        return global_idx[start:start + int(shares[self.rank])]

    def next_local(self, shares: Sequence[int] | None = None) -> np.ndarray:
        return self.split(self.next_global(), shares)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_samples": self.num_samples,
                "global_batch": self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_samples") != self.num_samples or state.get("global_batch") != self.global_batch:
            raise DataError(
                f"the checkpoint's data position is for {state.get('num_samples')} samples in global batches of "
                f"{state.get('global_batch')}, but this run has {self.num_samples} and {self.global_batch}; "
                "resume with the same data and train.global_batch"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])

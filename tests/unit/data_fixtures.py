"""A synthetic token source the data tests share (no files): sample i is ``[i, i, ..., i]`` of ``t + 1``
tokens, so every batch tells which samples it holds."""

from __future__ import annotations

import numpy as np


class Ids:
    def __init__(self, n: int, t: int = 8):
        self.n, self.t = n, t

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.full(self.t + 1, i, dtype=np.uint16)

    def gather(self, idx):
        return np.stack([self[int(i)] for i in idx])

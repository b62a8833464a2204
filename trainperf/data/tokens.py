"""Token sources: a prepared uint16 memmap, or synthetic tokens for throughput work.

A *sample* is a window of ``seq_len + 1`` tokens (inputs and shifted targets).
Windows do not overlap (stride ``seq_len``), so an epoch sees each token once.
The memmap is opened lazily, so worker processes do not copy it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainperf.errors import DataError


class TokenWindows:
    """Map-style source over ``<path>/<split>.bin``: item i -> uint16 array of seq_len + 1 tokens."""

    def __init__(self, path: str, split: str, seq_len: int):
        self.file = Path(path) / f"{split}.bin"
        if not self.file.exists():
            raise DataError(f"{self.file} does not exist; run `trainperf data prepare --out {path}`")
        self.seq_len = seq_len
        self.n_tokens = self.file.stat().st_size // 2
        self._mm: np.memmap | None = None
        if len(self) < 1:
            raise DataError(
                f"{self.file} has {self.n_tokens} tokens, fewer than one sample of {seq_len + 1} "
                f"(model.block_size + 1); prepare more text into a new directory (`trainperf data prepare --src DIR "
                f"--out NEW_DIR`, a larger --max-bytes or --src) and point data.path at it, or lower model.block_size"
            )

    @property
    def tokens(self) -> np.memmap:
        if self._mm is None:
            self._mm = np.memmap(self.file, dtype=np.uint16, mode="r")
        return self._mm

    def __len__(self) -> int:
        return max(0, (self.n_tokens - 1) // self.seq_len)  # an empty file: 0 samples, not -1

    def check_vocab(self, vocab_size: int, chunk: int = 1 << 24) -> None:
        """Every token id below ``vocab_size`` (one pass over the file, in chunks): a corrupt or foreign
        token file is refused here, not by an IndexError in the embedding mid-run."""
        mm = self.tokens
        for start in range(0, mm.size, chunk):
            top = int(mm[start:start + chunk].max())
            if top >= vocab_size:
                at = start + int(np.argmax(mm[start:start + chunk] >= vocab_size))
                raise DataError(f"{self.file}: token id {int(mm[at])} at position {at} is outside the vocabulary of "
                                f"{vocab_size} (meta.json); the file is corrupt or from other data: delete "
                                f"{self.file.parent} and run `trainperf data prepare` again")

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range [0, {len(self)})")
        start = int(i) * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1])

    def gather(self, idx: np.ndarray) -> np.ndarray:
        """(len(idx), seq_len + 1) array of windows."""
        return np.stack([self[int(i)] for i in idx])

    def __getstate__(self):  # never pickle the memmap into workers
        state = self.__dict__.copy()
        state["_mm"] = None
        return state


class SyntheticTokens:
    """Random tokens, a deterministic function of (seed, index); for throughput benchmarks."""

    def __init__(self, vocab_size: int, seq_len: int, num_samples: int = 1 << 20, seed: int = 0):
        self.vocab_size, self.seq_len, self.num_samples, self.seed = vocab_size, seq_len, num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(i)])
        return rng.integers(0, self.vocab_size, size=self.seq_len + 1, dtype=np.int64).astype(np.uint16)

    def gather(self, idx: np.ndarray) -> np.ndarray:
        return np.stack([self[int(i)] for i in idx])

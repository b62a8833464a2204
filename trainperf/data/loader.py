"""Batch loading for the trainer.

``build_data(cfg, ...)`` returns the train loader (this rank's share of each
global batch, resumable), the validation source and the data's metadata. The
``simple`` loader gathers windows in-process; the HybridLoader (cache and
prefetch tiers) plugs in behind the same interface: ``next_batch()`` ->
``(x, y)`` int64 tensors of shape (local_batch, seq_len) on the device,
``state_dict()`` / ``load_state_dict()``, and ``last_wait_s`` (seconds the last
``next_batch()`` waited for data; ``wait_s`` is the running total).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainperf.config.schema import Config
from trainperf.data.sampler import GlobalBatchSampler
from trainperf.data.prepare import VOCAB_SIZE, ensure_prepared
from trainperf.data.tokens import SyntheticTokens, TokenWindows


def windows_to_batch(w: np.ndarray, device: torch.device, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    w = np.asarray(w)
    xs = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in (w[:, :-1], w[:, 1:])]  # (B, T) each
    if pin:
        xs = [x.pin_memory() for x in xs]
    x, y = (t.to(device, non_blocking=pin) for t in xs)
    return x, y  # (B, T), (B, T), contiguous


class SimpleLoader:
    """In-process loader: sampler -> gather windows -> tensors on the device.

    ``skip_bad`` (``data.on_bad_sample=skip``): a sample that raises BadSample is replaced by a good sample
    of the same batch (the batch keeps its size, as in the hybrid loaders) and counted in ``skipped``."""

    def __init__(self, source, sampler: GlobalBatchSampler, device: torch.device, pin: bool = False,
                 skip_bad: bool = False):
        self.source, self.sampler, self.device, self.pin = source, sampler, device, pin
        self.skip_bad = skip_bad
        self.skipped: list[tuple[int, str, str]] = []  # (index, file, reason) of each skipped sample
        self.wait_s = self.last_wait_s = 0.0  # time in next_batch (all of it is data wait here)

    def _gather(self, idx) -> np.ndarray:
        if not self.skip_bad:
            return self.source.gather(idx)
        from trainperf.data.sources import BadSample
        from trainperf.errors import DataError

        items = []
        for i in idx:
            try:
                items.append(np.asarray(self.source[int(i)]))
            except BadSample as exc:
                if not self.skipped:
                    warnings.warn(f"skipped unreadable sample {exc.index} ({exc.file}): {exc.reason} "
                                  "(data.on_bad_sample=skip; the batch keeps its size by repeating a good sample)",
                                  RuntimeWarning, stacklevel=3)
                self.skipped.append((exc.index, exc.file, exc.reason))
                items.append(exc)
        good = [a for a in items if not isinstance(a, BadSample)]
        if not good:
            raise DataError(f"every sample of a batch is unreadable (first: {items[0]})")
        return np.stack([good[0] if isinstance(a, BadSample) else a for a in items])

    def next_batch(self, shares=None) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        idx = self.sampler.next_local(shares)
        batch = windows_to_batch(self._gather(idx), self.device, self.pin)
        self.last_wait_s = time.perf_counter() - t0
        self.wait_s += self.last_wait_s
        return batch

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        pass


@dataclass
class Data:
    train: Any
    val: Any
    vocab_size: int
    seq_len: int
    meta: dict


def build_data(cfg: Config, *, seq_len: int, device: torch.device, dp_rank: int = 0, dp_world: int = 1,
               verbose: bool = True) -> Data:
    d = cfg.data
    if not isinstance(cfg.train.global_batch, int):
        from trainperf.errors import ConfigError

        raise ConfigError(f"train.global_batch={cfg.train.global_batch!r} is not resolved yet; pass the config "
                          "through trainperf.train.resolve.resolve(cfg) first (it turns auto into a number)")
    if d.source == "synthetic":
        vocab = cfg.model.vocab_size if cfg.model.vocab_size != "auto" else VOCAB_SIZE
        train_src = SyntheticTokens(vocab, seq_len, seed=cfg.run.seed)
        val_src = SyntheticTokens(vocab, seq_len, num_samples=4096, seed=cfg.run.seed + 1)
        meta = {"tokenizer": "synthetic", "vocab_size": vocab}
    elif d.source == "tokens":
        meta = ensure_prepared(d.path, d.prepare_from, max_bytes=d.prepare_max_bytes,
                               val_fraction=d.val_fraction, verbose=verbose)
        vocab = int(meta["vocab_size"])
        train_src = TokenWindows(d.path, "train", seq_len)
        val_src = TokenWindows(d.path, "val", seq_len)
        for src in (train_src, val_src):
            src.check_vocab(vocab)
    else:
        from trainperf.data import sources  # files / dataset sources (HybridLoader work)

        train_src, val_src, meta = sources.build_sources(cfg, seq_len)
        vocab = int(meta["vocab_size"])
    if d.simulate.read_latency_ms or d.simulate.bandwidth_mb_s:
        from trainperf.data import sources

        train_src = sources.SlowStorage(train_src, d.simulate.read_latency_ms, d.simulate.bandwidth_mb_s)
    sampler = GlobalBatchSampler(len(train_src), cfg.train.global_batch, rank=dp_rank, world=dp_world,
                                 seed=cfg.run.seed, shuffle=d.shuffle, drop_last=d.drop_last)
    pin = bool(d.pin_memory) and device.type == "cuda"
    if d.loader == "simple":
        train = SimpleLoader(train_src, sampler, device, pin, skip_bad=d.on_bad_sample == "skip")
    else:
        from trainperf.data.hybrid import build_train_loader

        train = build_train_loader(cfg, train_src, sampler, device)
    return Data(train=train, val=val_src, vocab_size=vocab, seq_len=seq_len, meta=meta)

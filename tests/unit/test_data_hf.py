"""Data users already have: a tokenized Hugging Face ``datasets`` dataset (dict rows of ``input_ids``
of any length) or an iterable Dataset feeds HybridLoader, packed into windows, with exact resume;
a dataset without ``vocab_size`` is accepted, with a note saying where the vocabulary came from."""

from __future__ import annotations

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets", reason="datasets not installed")

from trainperf.config.schema import Config  # noqa: E402
from trainperf.data.loader import build_data  # noqa: E402
from trainperf.data.sources import PackedRows  # noqa: E402

T = 8


def _rows(n: int = 40):
    g = np.random.default_rng(0)
    return [g.integers(0, 50, size=int(g.integers(3, 20))).tolist() for _ in range(n)]  # documents of 3..19 tokens


def hf_dataset(split: str = "train"):
    """The entry point a user writes: a tokenized Hugging Face Dataset (no vocab_size attribute)."""
    return datasets.Dataset.from_dict({"input_ids": _rows(), "text": ["x"] * 40})


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter({"input_ids": torch.tensor(r)} for r in _rows())


def stream_dataset():
    return Stream()


def _cfg(tmp_path, entry: str, **data) -> Config:
    return Config.model_validate({
        "data": {"source": "dataset", "dataset_entrypoint": f"tests.unit.test_data_hf:{entry}", "loader": "hybrid",
                 "num_workers": 0, "cache": {"dir": str(tmp_path / "cache")}, **data},
        "train": {"global_batch": 4, "micro_batch": 4}, "run": {"seed": 7}})


def test_packed_windows_span_rows():
    stream = np.concatenate([np.asarray(r) for r in _rows()])
    src = PackedRows(hf_dataset(), "hf", T)
    assert len(src) == (len(stream) - 1) // T
    for i in (0, 1, len(src) // 2, len(src) - 1):
        assert np.array_equal(src[i], stream[i * T:i * T + T + 1])
    it = PackedRows(Stream(), "stream", T)  # iterable: same stream
    assert len(it) == len(src) and np.array_equal(it[3], src[3])


def test_hf_dataset_feeds_hybrid_loader_with_exact_resume(tmp_path):
    cfg = _cfg(tmp_path, "hf_dataset")
    data = build_data(cfg, seq_len=T, device=torch.device("cpu"), verbose=False)
    try:
        assert data.meta["layout"] == "packed rows"
        assert data.vocab_size == 50 and "largest token id 49" in data.meta["vocab_note"]
        batches = [data.train.next_batch() for _ in range(5)]
        state = data.train.state_dict()
        expected = [data.train.next_batch() for _ in range(6)]  # crosses the epoch boundary (~6 batches each)
    finally:
        data.train.close()
    for x, y in batches:
        assert x.shape == (4, T) and torch.equal(x[:, 1:], y[:, :-1]) and y.is_contiguous()
    again = build_data(cfg, seq_len=T, device=torch.device("cpu"), verbose=False)
    try:
        again.train.load_state_dict(state)
        got = [again.train.next_batch() for _ in range(6)]
    finally:
        again.train.close()
    for (x, y), (ex, ey) in zip(got, expected):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_iterable_dataset_and_vocab_from_the_model(tmp_path):
    cfg = _cfg(tmp_path, "stream_dataset")
    cfg.model.vocab_size = 64
    data = build_data(cfg, seq_len=T, device=torch.device("cpu"), verbose=False)
    try:
        assert data.vocab_size == 64 and "model.vocab_size" in data.meta["vocab_note"]
        x, y = data.train.next_batch()
        assert x.shape == (4, T)
    finally:
        data.train.close()

"""HybridLoader's CUDA device tier: correct batches from the device ring, and copies that overlap compute.

Skipped without CUDA (this project's CI machines have none); run with `pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import time

import pytest
import torch

from trainperf.data.hybrid import HybridLoader
from trainperf.data.loader import SimpleLoader
from trainperf.data.sampler import GlobalBatchSampler
from tests.unit.data_fixtures import Ids

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
T = 1024


def test_cuda_ring_same_batches_and_resume():
    src = Ids(256, T)
    ref = SimpleLoader(src, GlobalBatchSampler(256, 16, seed=1), torch.device("cpu"))
    expected = [ref.next_batch()[0] for _ in range(20)]
    dev = torch.device("cuda")
    with HybridLoader(src, GlobalBatchSampler(256, 16, seed=1), dev, num_workers=2, device_bytes=2**26) as ld:
        got = []
        for _ in range(10):
            x, y = ld.next_batch()
            assert x.is_cuda and x.dtype == torch.int64
            got.append(x.cpu())
        state = ld.state_dict()
    with HybridLoader(src, GlobalBatchSampler(256, 16, seed=1), dev, num_workers=2) as ld:
        ld.load_state_dict(state)
        got += [ld.next_batch()[0].cpu() for _ in range(10)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_copies_overlap_compute():
    """A step of compute longer than one batch's copy: with the ring, data wait stays small."""
    dev = torch.device("cuda")
    src = Ids(4096, T)
    a = torch.randn(4096, 4096, device=dev)
    with HybridLoader(src, GlobalBatchSampler(4096, 256, seed=0), dev, num_workers=2, depth=4) as ld:
        for _ in range(5):
            ld.next_batch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        wait = 0.0
        for _ in range(20):
            t = time.perf_counter()
            x, _ = ld.next_batch()
            wait += time.perf_counter() - t
            for _ in range(4):
                a = (a @ a).clamp_(-1, 1)  # compute on the default stream
            x.sum()
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
    assert wait / total < 0.2, f"data wait {wait / total:.0%} of the loop"

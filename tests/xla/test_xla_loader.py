"""XlaDeviceLoader: torch_xla's ParallelLoader reads ahead, yet the data position stays exact."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.conftest import ROOT, TINY
from trainperf.config import load_config
from trainperf.data.loader import build_data

pytestmark = pytest.mark.xla


def _cpu_loader(corpus, tmp_path):
    cfg = load_config(str(ROOT / "configs" / "gpt-tiny.yaml"),
                      [*TINY, f"data.path={corpus}", "data.prepare_from=null", f"run.dir={tmp_path}"])
    return build_data(cfg, seq_len=32, device=torch.device("cpu"), verbose=False).train


def test_batches_state_and_restart(corpus, tmp_path):
    import torch_xla

    from trainperf.xla.loader import XlaDeviceLoader

    ref = _cpu_loader(corpus, tmp_path)
    expected = [ref.next_batch()[0] for _ in range(6)]

    loader = XlaDeviceLoader(_cpu_loader(corpus, tmp_path), torch_xla.device(), prefetch=4)
    got = []
    for _ in range(3):
        x, y = loader.next_batch()
        assert x.device.type == "xla" and tuple(x.shape) == (8, 32) and loader.last_shape == (8, 32)
        got.append(x.cpu())
    time.sleep(0.5)  # let the background thread read ahead
    after3 = loader.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(got, expected[:3]))

    # a new loader restored at that position continues with batch 4, whatever was read ahead
    other = XlaDeviceLoader(_cpu_loader(corpus, tmp_path), torch_xla.device())
    other.load_state_dict(after3)
    assert torch.equal(other.next_batch()[0].cpu(), expected[3])

    # restoring a running loader drops its read-ahead and restarts from the given position
    loader.load_state_dict(after3)
    assert torch.equal(loader.next_batch()[0].cpu(), expected[3])

    # close() stops the background threads promptly
    t = threading.Thread(target=loader.close)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "XlaDeviceLoader.close() hung"
    other.close()

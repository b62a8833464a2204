"""XLA tests run only where torch_xla imports (``make test-xla``: its own venv, PJRT_DEVICE=CPU)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")


def pytest_collection_modifyitems(config, items):
    from trainperf.xla.env import xla_available

    if xla_available():
        # The autograd engine sizes its per-device queues at the first backward of the process: the
        # XLA device must exist by then, or a later XLA backward fails an internal assert.
        import torch_xla

        torch_xla.device()
        return
    skip = pytest.mark.skip(reason="torch_xla is not installed for this torch (run `make test-xla`)")
    for item in items:
        if item.get_closest_marker("xla") is not None:
            item.add_marker(skip)

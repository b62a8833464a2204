"""trainperf: measure where a PyTorch training job loses time and memory, apply the right
optimization, and prove the gain by measuring again.

Library use, for your own loop::

    import trainperf as tp
    cfg = tp.load_config("my.yaml", ["optimizer.lr=3e-4"])
    model = tp.optimize(model, cfg)       # activation checkpointing -> compile, in that order
    loader = tp.HybridLoader(...)         # see trainperf.data.hybrid

    run = tp.track("runs/mine", model=model)   # measure a loop of your own (trainperf.integrations)
    with run.step(batch):
        with run.phase("forward"): ...

Importing this package does not import torch; the names below load on first use.
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "load_config": ("trainperf.config.load", "load_config"),
    "Config": ("trainperf.config.schema", "Config"),
    "resolve": ("trainperf.train.resolve", "resolve"),
    "optimize": ("trainperf.distributed.parallelize", "optimize"),
    "build_model": ("trainperf.models.build", "build_model"),
    "HybridLoader": ("trainperf.data.hybrid", "HybridLoader"),
    "Monitor": ("trainperf.monitor", "Monitor"),
    "UserError": ("trainperf.errors", "UserError"),
    "track": ("trainperf.integrations.loop", "track"),
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_names("trainperf", globals(), _LAZY)

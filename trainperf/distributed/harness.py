"""Deprecated import path (it goes in the next release): the Trainer's tiny runs for tests and benchmarks moved to
:mod:`trainperf.bench.harness` (they run the real Trainer, which sits above distributed/), the gloo processes
that run them to :mod:`trainperf.distributed.spawn`. Each name still imports from here, with a
DeprecationWarning naming its new place."""

from trainperf.lazy import moved_names

__getattr__ = moved_names(__name__, {
    "TINY": "trainperf.bench.harness", "make_config": "trainperf.bench.harness", "batches": "trainperf.bench.harness",
    "FixedBatches": "trainperf.bench.harness", "fixed_data": "trainperf.bench.harness",
    "one_process": "trainperf.bench.harness", "full_params": "trainperf.bench.harness",
    "run_trainer": "trainperf.bench.harness", "run_reference": "trainperf.bench.harness",
    "compare": "trainperf.bench.harness",
    "free_port": "trainperf.distributed.spawn", "spawn": "trainperf.distributed.spawn",
    "run_processes": "trainperf.distributed.spawn", "stop_processes": "trainperf.distributed.spawn",
})

"""Distributed training: ParallelDims (degrees, checks, DeviceMesh), apply_tp / apply_fsdp / apply_ddp,
pipeline stages and schedules, gradient compression, sharded checkpoints, fail-fast.

Entry points: :func:`trainperf.distributed.parallelize.parallelize` (library),
:func:`trainperf.train.build.train` (``trainperf train``, one process or under torchrun).
Submodules import torch lazily where the CLI must stay light (parallel_dims has no torch import).
"""

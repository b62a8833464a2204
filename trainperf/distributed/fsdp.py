"""FSDP2 (``fully_shard``) per block and at the root, with a mixed-precision policy.

Each block is its own FSDP unit (its parameters are all-gathered just before the
block runs and freed after), the root unit holds embeddings, final norm and
head. ``reduce_dtype`` is the dtype of the gradient reduce-scatter
(``parallelism.fsdp_reduce_dtype``): bf16/fp16 halve the gradient traffic.
On a 2-D mesh (dp_replicate, dp_shard) this is HSDP: sharded within a group,
all-reduced across groups.

Bytes: FSDP2's collectives are not hooked; :func:`fsdp_comm_bytes` gives the
per-step wire volume from the ring formulas (stated as an estimate).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from trainperf.models.blocks import repeated_blocks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fsdp(model: nn.Module, dp_mesh, *, param_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype = torch.float32, reshard_after_forward: bool = True,
               blocks: list[nn.Module] | None = None) -> nn.Module:
    """Shard ``model`` in place: ``fully_shard`` on every repeated block (``blocks``, default: the
    block finder's), then on the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = repeated_blocks(model) if blocks is None else blocks
    for i, block in enumerate(blocks):
        # The last block is gathered again at once by the root's backward: keep it unsharded after forward.
        last = i == len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def apply_replicate(model: nn.Module, dp_mesh, *, blocks: list[nn.Module] | None = None) -> nn.Module:
    """Pure data replication (DDP semantics) of a model whose parameters may be DTensors (tensor
    parallel): FSDP2's replicate, which all-reduces gradients across ``dp_mesh``."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:  # older torch: shard across the data ranks instead (same numerics, ZeRO-3 memory)
        return apply_fsdp(model, dp_mesh, blocks=blocks)
    import inspect

    if "mesh" not in inspect.signature(replicate).parameters:
        # torch 2.9: replicate(module, device_mesh=) wants a 2-D (replicate, shard) mesh: shard, as above
        return apply_fsdp(model, dp_mesh, blocks=blocks)
    for block in repeated_blocks(model) if blocks is None else blocks:
        replicate(block, mesh=dp_mesh)
    replicate(model, mesh=dp_mesh)
    return model


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Turn FSDP2's gradient reduce-scatter on (last micro-step) or off (earlier micro-steps)."""
    fn = getattr(model, "set_requires_gradient_sync", None)
    if fn is not None:
        fn(enabled)


def fsdp_comm_bytes(param_numel: int, n: int, *, param_bytes: int = 4, reduce_bytes: int = 4,
                    micro_steps: int = 1, reshard_after_forward: bool = True) -> dict:
    """Per-rank wire bytes of one optimizer step under FSDP2 (ring collectives):
    all-gather of the parameters in forward (and again in backward when resharded after forward)
    on every micro-step, and one reduce-scatter of the gradients (sync only on the last micro-step)."""
    if n <= 1:
        return {"all_gather": 0, "reduce_scatter": 0, "total": 0}
    frac = (n - 1) / n
    gathers = (2 if reshard_after_forward else 1) * micro_steps
    ag = int(frac * param_numel * param_bytes * gathers)
    rs = int(frac * param_numel * reduce_bytes)
    return {"all_gather": ag, "reduce_scatter": rs, "total": ag + rs}

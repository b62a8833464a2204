"""Tensor parallelism for the reference GPT with DTensor plans (Megatron-style).

Per block: q/k/v projections and the MLP's ``fc`` are column-parallel (each rank
holds ``n_head / tp`` heads and ``4C / tp`` MLP columns); ``o_proj`` and the
MLP's ``proj`` are row-parallel (their partial outputs are all-reduced). That is
two all-reduces forward and two backward per block (REFERENCE.md).

With ``sequence_parallel`` the residual stream between the parallel regions is
sharded along the sequence (dim 1): layer norms run on a sequence shard, the
row-parallel outputs are reduce-scattered instead of all-reduced and the
column-parallel inputs all-gathered (same volume, activations / tp). The final
norm is sequence-parallel and ``lm_head`` column-parallel with its logits
gathered. Without it, embeddings, norms and ``lm_head`` stay replicated plain
tensors (every tensor-parallel rank computes them identically).

Works on pipeline stages too: blocks a stage does not own are simply absent.
"""

from __future__ import annotations

import torch.nn as nn


def apply_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool = False) -> nn.Module:
    """Shard ``model`` (a GPT or a pipeline stage of one) over ``tp_mesh`` in place."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    layers = getattr(model, "layers", None)
    if layers is None:
        raise TypeError("apply_tp expects the reference GPT (model.layers of blocks with attn.q_proj/... and mlp.fc/proj)")
    first_block = min(layers.keys(), key=int) if len(layers) else None
    for name, block in layers.items():
        plan = {
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate()),
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate()),
        }
        if sequence_parallel:
            # The first block of the model receives the full (replicated) embedding output; later blocks
            # (and a later pipeline stage's first block) receive a sequence shard.
            entering_full = name == first_block and getattr(model, "tok_emb", None) is not None
            parallelize_module(block, tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate() if entering_full else Shard(1),),
                desired_input_layouts=(Shard(1),), use_local_output=True))
            plan.update({
                "ln_1": SequenceParallel(),
                "ln_2": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)

    if sequence_parallel:
        root_plan = {}
        if getattr(model, "norm", None) is not None:
            root_plan["norm"] = SequenceParallel()
        if getattr(model, "lm_head", None) is not None:
            root_plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        if root_plan:
            parallelize_module(model, tp_mesh, root_plan)
    return model

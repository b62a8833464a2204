"""Tensor parallelism for Hugging Face Llama-style decoders (Llama, Mistral, Qwen2, ... : the
``q/k/v/o_proj`` + ``gate/up/down_proj`` layout), through DTensor plans in the style of torchtitan's.

Per decoder layer: ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` column-parallel
(each rank holds ``heads / tp`` query heads, ``kv_heads / tp`` KV heads and ``intermediate / tp``
MLP columns; HF's attention reshapes with ``-1`` heads, so the local head counts need no patching and
GQA's ``heads / kv_heads`` ratio is unchanged); ``o_proj`` and ``down_proj`` row-parallel (partial
outputs all-reduced: two all-reduces forward and two backward per layer).

With ``sequence_parallel``: the residual stream between the parallel regions is sharded along the
sequence (dim 1). Each layer's input enters as a sequence shard (the first layer takes the full,
replicated embedding output and keeps its shard), ``input_layernorm`` and ``post_attention_layernorm``
run on the shard (``SequenceParallel``), attention and MLP inputs are all-gathered and their outputs
reduce-scattered; the final ``norm`` is sequence-parallel and ``lm_head`` column-parallel with the
logits gathered (for tied embeddings: ``lm_head`` stays replicated, its input gathered).
Embedding lookups and rotary position embeddings stay replicated (HF derives positions and the causal
mask from the embedding output's length, which must be the full sequence).

Without it, embeddings, norms and ``lm_head`` stay replicated plain tensors.

GPT-2 (``transformer.h`` with a fused ``c_attn`` Conv1D: transposed weight, q|k|v concatenated, so a
plain column split would give each rank a mix of q, k and v columns) is refused with a ConfigError:
train GPT-2 with data parallelism (DDP / FSDP2).
"""

from __future__ import annotations

import torch.nn as nn

from trainperf.errors import ConfigError


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_tp_degree(n_head: int | None, n_kv_head: int | None, tp: int) -> None:
    """Heads and KV heads must split evenly over the tensor-parallel ranks."""
    if tp <= 1:
        return
    n_kv_head = n_kv_head or n_head
    if n_head and n_head % tp:
        raise ConfigError(f"parallelism.tensor={tp} does not divide the model's num_attention_heads={n_head}; "
                          f"choose parallelism.tensor among {_divisors(n_head)}")
    if n_kv_head and n_kv_head % tp:
        raise ConfigError(f"parallelism.tensor={tp} does not divide the model's num_key_value_heads={n_kv_head} "
                          f"(grouped-query attention: each rank needs whole KV heads); choose parallelism.tensor "
                          f"among {_divisors(n_kv_head)}")


def _layers(model: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    """(the decoder body, its layers) of a Llama-style causal LM; ConfigError for other layouts."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers):
        attn = getattr(layers[0], "self_attn", None)
        mlp = getattr(layers[0], "mlp", None)
        if all(hasattr(attn, k) for k in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
                all(hasattr(mlp, k) for k in ("gate_proj", "up_proj", "down_proj")):
            return body, layers
    if hasattr(getattr(model, "transformer", None), "h"):
        raise ConfigError(
            f"parallelism.tensor > 1 is not supported for {type(model).__name__} (GPT-2 layout): its fused c_attn "
            "(a Conv1D with q|k|v concatenated) cannot be split column-wise without mixing q, k and v across ranks; "
            "train it with data parallelism (parallelism.data / parallelism.data_shard) and parallelism.tensor=1")
    raise ConfigError(
        f"parallelism.tensor > 1 needs a Llama-style decoder (model.layers[i].self_attn.q/k/v/o_proj and "
        f"mlp.gate/up/down_proj); {type(model).__name__} is not one; use parallelism.tensor=1")


def apply_hf_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool = False) -> nn.Module:
    """Shard a Hugging Face Llama-style causal LM over ``tp_mesh`` in place (FQNs unchanged)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    body, layers = _layers(model)
    config = model.config
    check_tp_degree(config.num_attention_heads, getattr(config, "num_key_value_heads", None), tp)
    if getattr(config, "intermediate_size", 0) % tp:
        raise ConfigError(f"parallelism.tensor={tp} does not divide the model's intermediate_size="
                          f"{config.intermediate_size}; choose among {_divisors(config.intermediate_size)}")
    out = Shard(1) if sequence_parallel else Replicate()
    for i, layer in enumerate(layers):
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=out),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=out),
        }
        if sequence_parallel:
            # The residual stream enters each layer as a local sequence shard; the first layer gets the full,
            # replicated embedding output and keeps its shard.
            parallelize_module(layer, tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate() if i == 0 else Shard(1),), desired_input_layouts=(Shard(1),),
                use_local_output=True))
            plan.update({
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel:
        parallelize_module(body, tp_mesh, {"norm": SequenceParallel(use_local_output=True)})
        head = model.get_output_embeddings()
        tied = head is not None and head.weight is model.get_input_embeddings().weight
        if tied:
            style = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True)
        else:
            style = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        parallelize_module(model, tp_mesh, {"lm_head": style})
    return model

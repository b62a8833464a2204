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

GPT-2 (``transformer.h``): its ``c_attn`` is a Conv1D (weight ``(in, out)``, transposed against
nn.Linear) with q|k|v concatenated along the columns, so a plain column split would give rank 0 all of
q and part of k. Its weight is distributed with ``_StridedShard(1, split_factor=3)``: each rank holds
``[q_r | k_r | v_r]`` (its heads of each of the three), and ``full_tensor()`` / a DCP checkpoint
reassemble HF's layout. ``c_fc`` is column-parallel (``Shard(1)``), the two ``c_proj`` row-parallel
(``Shard(0)``, bias replicated), in Megatron's form: the block's input gradient is all-reduced in
backward, the row-parallel output all-reduced in forward. Attention's ``split_size`` becomes the
local width. Sequence parallelism is not implemented for GPT-2 (a ConfigError says so).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
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
    raise ConfigError(
        f"parallelism.tensor > 1 needs a Llama-style decoder (model.layers[i].self_attn.q/k/v/o_proj and "
        f"mlp.gate/up/down_proj) or GPT-2 (transformer.h[i].attn.c_attn); {type(model).__name__} is neither; "
        "use parallelism.tensor=1")


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
    if _is_gpt2(model):
        return _apply_gpt2_tp(model, tp_mesh, sequence_parallel=sequence_parallel)
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


# ---------------------------------------------------------------------- GPT-2 (Conv1D, fused q|k|v)
def _is_gpt2(model: nn.Module) -> bool:
    h = getattr(getattr(model, "transformer", None), "h", None)
    return isinstance(h, nn.ModuleList) and len(h) > 0 and hasattr(h[0], "attn") and hasattr(h[0].attn, "c_attn")


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient in backward (each rank saw some columns)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce of the partial sums forward; identity backward (every rank needs the full gradient)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


_CONV_CLASSES: dict = {}


def _parallel_conv1d(base: type, kind: str) -> type:
    key = (base, kind)
    if key in _CONV_CLASSES:
        return _CONV_CLASSES[key]
    def forward(self, x):
        w, b = self.weight.to_local(), self.bias.to_local()
        if kind == "col":
            x = _CopyToTP.apply(x, self._tp_group)
            out = torch.addmm(b, x.reshape(-1, x.size(-1)), w)
        else:
            out = _ReduceFromTP.apply(x.reshape(-1, x.size(-1)) @ w, self._tp_group) + b
        return out.view(*x.shape[:-1], w.shape[1])

    cls = type(base.__name__, (base,), {"forward": forward, "_trainperf_tp_base": base,
                                        "__module__": base.__module__})
    _CONV_CLASSES[key] = cls
    return cls


def _shard_conv1d(mod: nn.Module, tp_mesh, kind: str, fused: int = 1) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    if kind == "col":
        wp = [_StridedShard(1, split_factor=fused)] if fused > 1 else [Shard(1)]
        bp = [_StridedShard(0, split_factor=fused)] if fused > 1 else [Shard(0)]
    else:
        wp, bp = [Shard(0)], [Replicate()]
    mod.weight = torch.nn.Parameter(distribute_tensor(mod.weight.data, tp_mesh, wp))
    mod.bias = torch.nn.Parameter(distribute_tensor(mod.bias.data, tp_mesh, bp))
    mod._tp_group = tp_mesh.get_group()
    mod.__class__ = _parallel_conv1d(type(mod), kind)


def _apply_gpt2_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool) -> nn.Module:
    tp = tp_mesh.size()
    config = model.config
    if sequence_parallel:
        raise ConfigError(f"parallelism.sequence_parallel is implemented for Llama-style models, not "
                          f"{type(model).__name__} (GPT-2); set parallelism.sequence_parallel=false")
    check_tp_degree(config.n_head, config.n_head, tp)
    inner = getattr(config, "n_inner", None) or 4 * config.n_embd
    if inner % tp:
        raise ConfigError(f"parallelism.tensor={tp} does not divide the MLP width {inner}; choose among {_divisors(inner)}")
    for block in model.transformer.h:
        attn, mlp = block.attn, block.mlp
        if getattr(attn, "is_cross_attention", False) or hasattr(attn, "q_attn"):
            raise ConfigError("tensor parallelism for GPT-2 covers self-attention only (no cross-attention)")
        _shard_conv1d(attn.c_attn, tp_mesh, "col", fused=3)
        _shard_conv1d(attn.c_proj, tp_mesh, "row")
        attn.split_size = config.n_embd // tp
        _shard_conv1d(mlp.c_fc, tp_mesh, "col")
        _shard_conv1d(mlp.c_proj, tp_mesh, "row")
    return model

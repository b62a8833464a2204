"""One torch-free analytic model of transformer training, shared by the memory estimate
(:mod:`trainperf.memory.estimate`), MFU (:mod:`trainperf.monitor.flops`) and the planner
(:mod:`trainperf.planner`): the transformer spec and its FLOPs (:mod:`.spec`), activation bytes
per kernel, precision and recompute kind (:mod:`.activations`), model-state bytes per sharding
(:mod:`.states`), which blocks a checkpointing mode recomputes (:mod:`.recompute`), and Hugging
Face ``config.json`` reading (:mod:`.hf`)."""

from trainperf.analytic.activations import BF16, Precision, layer_terms, outside_terms, per_layer_bytes
from trainperf.analytic.spec import TransformerSpec
from trainperf.analytic.states import FP32_ADAM, MEGATRON, StateBytes

__all__ = ["BF16", "FP32_ADAM", "MEGATRON", "Precision", "StateBytes", "TransformerSpec", "layer_terms",
           "outside_terms", "per_layer_bytes"]

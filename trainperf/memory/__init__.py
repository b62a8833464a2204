"""Memory: activation checkpointing (:func:`apply_ac`), the memory estimate and its measurement.

Importing this package imports torch; the CLI imports it lazily.
"""

from trainperf.memory.ac import ACPlan, apply_ac, find_blocks, remove_ac
from trainperf.memory.estimate import GPTShape, MemoryEstimate, Plan, Sharding, estimate_gpt
from trainperf.memory.measure import measure_activations, measure_states

__all__ = [
    "ACPlan", "GPTShape", "MemoryEstimate", "Plan", "Sharding", "apply_ac", "estimate_gpt", "find_blocks",
    "measure_activations", "measure_states", "remove_ac",
]

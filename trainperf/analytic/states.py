"""Model-state bytes per parameter for each sharding (no torch).

ZeRO stages (Rajbhandari et al. 2020): 0 / DDP replicates everything; 1 shards the optimizer
states; 2 also the gradients; 3 (FSDP FULL_SHARD) also the parameters. HSDP shards within a
group of ``shard`` ranks and replicates across groups: only ``shard`` divides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state."""

    param: float = 2.0
    grad: float = 4.0
    optimizer: float = 12.0

    def per_param(self, zero: int = 0, shard: int = 1) -> float:
        """Bytes per parameter on one rank when states shard over ``shard`` ranks at ``zero``."""
        p, g, o = self.param, self.grad, self.optimizer
        n = max(1, shard)
        if zero <= 0 or n == 1:
            return p + g + o
        if zero == 1:
            return p + g + o / n
        if zero == 2:
            return p + (g + o) / n
        return (p + g + o) / n

    def split(self, numel: float, zero: int = 0, shard: int = 1) -> dict[str, float]:
        """{param, grad, optimizer} bytes for ``numel`` parameters on one rank."""
        n = max(1, shard)
        return {
            "param": numel * self.param / (n if zero >= 3 else 1),
            "grad": numel * self.grad / (n if zero >= 2 else 1),
            "optimizer": numel * self.optimizer / (n if zero >= 1 else 1),
        }


MEGATRON = StateBytes(2.0, 4.0, 12.0)
"""bf16 weights, fp32 gradients, fp32 master + Adam m, v (18 B/param; Korthikanti Figure 1)."""
FP32_ADAM = StateBytes(4.0, 4.0, 8.0)
"""fp32 parameters and gradients, Adam m and v (trainperf's default trainer: 16 B/param)."""

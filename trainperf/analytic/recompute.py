"""Which blocks a checkpointing mode recomputes (no torch): the one count shared by the AC
mechanism (:mod:`trainperf.memory.ac`), the memory estimate, MFU/HFU (:mod:`trainperf.monitor.flops`)
and the planner.

Kinds per block: ``"none"`` (everything kept), ``"selective"`` (op level: matmul and attention
outputs kept, norms / activations / adds recomputed), ``"full"`` (only the block input kept, the
whole forward re-run in backward).
"""

from __future__ import annotations

from trainperf.errors import ConfigError

MODES = ("none", "full", "ratio", "every_k", "selective", "budget")
KINDS = ("none", "selective", "full")


def check_ratio(ratio: float) -> None:
    if not (0 < ratio <= 1):
        raise ConfigError(
            f"memory.checkpointing.ratio={ratio} is outside (0, 1]; it is the fraction of blocks checkpointed: "
            "use e.g. 0.25 (one block in four) or 1.0 (every block, like mode=full)"
        )


def ratio_count(n_blocks: int, ratio: float) -> int:
    """Blocks checkpointed for ``ratio``: round half up (0.5 -> 1, unlike Python's banker's
    ``round``), at least one, at most all."""
    check_ratio(ratio)
    return max(1, min(n_blocks, int(ratio * n_blocks + 0.5)))


def spread(n_blocks: int, k: int) -> list[int]:
    """``k`` block indices spread evenly over ``n_blocks``, starting at 0 (k = n/4 -> 0, 4, 8, ...)."""
    return sorted({(j * n_blocks) // k for j in range(k)}) if k > 0 else []


def plan_kinds(mode: str, n_blocks: int, *, ratio: float = 0.25, every_k: int = 4,
               n_full: int | None = None, n_selective: int = 0) -> list[str]:
    """Per-block kinds for a mode (``budget`` takes explicit ``n_full``/``n_selective``)."""
    if mode == "none":
        return ["none"] * n_blocks
    if mode == "full":
        return ["full"] * n_blocks
    if mode == "selective":
        return ["selective"] * n_blocks
    if mode == "ratio":
        full = set(spread(n_blocks, ratio_count(n_blocks, ratio)))
    elif mode == "every_k":
        if every_k < 1:
            raise ConfigError(f"memory.checkpointing.every_k={every_k} must be at least 1")
        full = set(range(0, n_blocks, every_k))
    elif mode == "budget":
        full = set(spread(n_blocks, n_full or 0))
        kinds = ["full" if i in full else "none" for i in range(n_blocks)]
        rest = [i for i in range(n_blocks) if i not in full]
        for i in rest[:n_selective]:
            kinds[i] = "selective"
        return kinds
    else:
        raise ConfigError(f"memory.checkpointing.mode={mode!r} is unknown; choose one of {', '.join(MODES)}")
    return ["full" if i in full else "none" for i in range(n_blocks)]


def counts(mode: str, n_blocks: int, *, ratio: float = 0.25, every_k: int = 4) -> tuple[int, int]:
    """(blocks fully checkpointed, blocks selective) for a mode other than ``budget``."""
    kinds = plan_kinds(mode, n_blocks, ratio=ratio, every_k=every_k)
    return kinds.count("full"), kinds.count("selective")

"""Where a model's repeated blocks are: the one finder that TP, activation checkpointing, compile,
FSDP and FLOP counting all use.

A "block container" is a ModuleList / ModuleDict (or a Sequential of two or more) whose children
all have one type: ``layers`` in the reference GPT, ``model.layers`` in a Hugging Face Llama,
``transformer.h`` in GPT-2. Without a path the largest such container wins (by count, then
parameters); with a dotted path that container is used, and a wrong path is an error that lists
the candidates.
"""

from __future__ import annotations

import difflib

import torch.nn as nn

from trainperf.errors import ConfigError


def _is_block_container(mod: nn.Module) -> bool:
    if not isinstance(mod, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
        return False
    children = list(mod.children())
    # A one-block ModuleList/ModuleDict counts (a 1-layer model); a one-child Sequential does not.
    least = 2 if isinstance(mod, nn.Sequential) else 1
    return len(children) >= least and len({type(c) for c in children}) == 1


def block_candidates(model: nn.Module) -> list[tuple[str, int]]:
    """(dotted path, number of blocks) of every container of identical-type children, largest first."""
    found = []
    for name, mod in model.named_modules():
        if name and _is_block_container(mod):
            n_params = sum(p.numel() for p in mod.parameters())
            found.append((name, len(list(mod.children())), n_params))
    found.sort(key=lambda t: (t[1], t[2]), reverse=True)
    return [(name, n) for name, n, _ in found]


_PATH_ATTR = "_trainperf_block_path"


def set_block_path(model: nn.Module, path: str | None) -> None:
    """Record ``model``'s block path (``model.blocks``) on it, so every caller of :func:`find_blocks`
    without an explicit path (checkpointing, FSDP, tensor parallelism, compile) uses the same blocks."""
    setattr(model, _PATH_ATTR, path)


def block_path(model: nn.Module) -> str | None:
    """The path recorded by :func:`set_block_path`, or None."""
    return getattr(model, _PATH_ATTR, None)


def find_blocks(model: nn.Module, path: str | None = None, *,
                field: str = "memory.checkpointing.blocks") -> tuple[str | None, list[nn.Module]]:
    """The repeated blocks: those at ``path`` (dotted, e.g. "transformer.h"), else at the path
    recorded on the model (:func:`set_block_path`, from ``model.blocks``), else the largest
    container of identical-type children. ``(None, [])`` when there is none.
    ``field`` names the config key the path came from, for the error message."""
    if not path and block_path(model):
        path, field = block_path(model), "model.blocks"
    if path:
        try:
            container = model.get_submodule(path)
        except AttributeError:
            container = None
        if container is None or not isinstance(container, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            cands = [p for p, _ in block_candidates(model)]
            names = [n for n, _ in model.named_modules() if n]
            close = difflib.get_close_matches(path, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            what = "does not exist" if container is None else f"is a {type(container).__name__}, not a list of blocks"
            listing = ", ".join(f"{p!r}" for p in cands) if cands else "none found (no list of identical blocks)"
            raise ConfigError(f"{field}={path!r} {what} in {type(model).__name__}; {hint}candidates: {listing}")
        blocks = list(container.children())
        if not blocks:
            raise ConfigError(f"{field}={path!r} is empty; name a container with blocks in it")
        return path, blocks
    cands = block_candidates(model)
    if not cands:
        return None, []
    best = cands[0][0]
    return best, list(model.get_submodule(best).children())


def repeated_blocks(model: nn.Module, path: str | None = None) -> list[nn.Module]:
    """The blocks alone (``[]`` for a model without repeated blocks)."""
    return find_blocks(model, path)[1]

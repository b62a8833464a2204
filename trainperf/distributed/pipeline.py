"""Pipeline parallelism with torch.distributed.pipelining (the successor of the seed's ``Pipe``).

The GPT's blocks are split into ``pipeline x interleave`` contiguous stages balanced by
estimated cost (a block ~ 24 h^2 + 4 s h FLOPs per token, the head 2 h V on the last stage),
each stage at least one block. A stage is the GPT itself with the blocks it does not own
deleted (``layers`` is a ModuleDict keyed by block index, so parameter names stay those of the
full model and checkpoints move between layouts); the first stage keeps the embeddings, the
last the final norm and ``lm_head``.

Schedules: ``gpipe`` (all forwards, then all backwards), ``1f1b`` (one forward, one backward:
at most ``pipeline`` micro-batches in flight) and ``interleaved_1f1b`` (``interleave`` virtual
stages per rank, round-robin: rank r holds stages r, r + p, r + 2p, ...; bubble / interleave).
The schedule splits the rank's share of the batch into ``parallelism.microbatches`` and scales
gradients by 1 / microbatches, so the step equals one process's gradient accumulation.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def block_costs(n_layer: int, n_embd: int, seq_len: int, vocab: int) -> tuple[list[float], float, float]:
    """FLOPs per token: per block, extra on the first stage (embeddings), extra on the last (head)."""
    block = 24.0 * n_embd * n_embd + 4.0 * seq_len * n_embd
    return [block] * n_layer, 0.0, 2.0 * n_embd * vocab


def split_layers(costs: list[float], n_stages: int, *, first_extra: float = 0.0,
                 last_extra: float = 0.0) -> list[list[int]]:
    """Contiguous split of blocks into ``n_stages`` (each >= 1 block) minimizing the largest stage cost."""
    n = len(costs)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot split {n} blocks into {n_stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(i, j, s):  # blocks [i, j) as stage s
        return prefix[j] - prefix[i] + (first_extra if s == 0 else 0.0) + (last_extra if s == n_stages - 1 else 0.0)

    inf = float("inf")
    # best[s][j]: minimal max-cost splitting the first j blocks into s + 1 stages
    best = [[inf] * (n + 1) for _ in range(n_stages)]
    cut = [[0] * (n + 1) for _ in range(n_stages)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, j, 0)
    for s in range(1, n_stages):
        for j in range(s + 1, n + 1):
            for i in range(s, j):
                v = max(best[s - 1][i], cost(i, j, s))
                if v < best[s][j] - 1e-9:
                    best[s][j], cut[s][j] = v, i
    bounds, j = [], n
    for s in range(n_stages - 1, 0, -1):
        i = cut[s][j]
        bounds.append((i, j))
        j = i
    bounds.append((0, j))
    return [list(range(a, b)) for a, b in reversed(bounds)]


def stage_ids(pp_rank: int, pp: int, interleave: int) -> list[int]:
    """Stages held by ``pp_rank``: round-robin (looped) assignment."""
    return [pp_rank + v * pp for v in range(interleave)]


def _logits_only(module, inputs, output):
    return output[0] if isinstance(output, tuple) else output


def make_stage_module(full_meta_model: nn.Module, layer_ids: list[int], *, first: bool, last: bool) -> nn.Module:
    """A copy of the (meta) GPT holding only ``layer_ids``; FQNs unchanged."""
    m = copy.deepcopy(full_meta_model)
    keep = {str(i) for i in layer_ids}
    for key in list(m.layers.keys()):
        if key not in keep:
            del m.layers[key]
    if not first:
        m.tok_emb = None
        m.pos_emb = None
    if not last:
        m.norm = None
        m.lm_head = None
    else:
        m.register_forward_hook(_logits_only)  # the schedule's loss_fn takes the logits
    return m


def pipeline_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the micro-batch's tokens (the GPT's own loss convention)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def build_schedule(stages: list, *, schedule: str, microbatches: int, loss_fn=pipeline_loss):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    if len(stages) != 1:
        raise ValueError(f"pipeline_schedule={schedule!r} runs one stage per rank; got {len(stages)}")
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)

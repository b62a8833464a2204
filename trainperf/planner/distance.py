"""How far a plan is from every development source (no torch).

The 80% interval is the model's error on published runs of sources it was not fitted on
(:mod:`trainperf.planner.interval`). That says how wrong it is on a stack *like* those. A query can be
unlike all of them in three respects the issue names, each judged against every development row:

* **generation**: no development run was on a GPU of this architecture (the development set holds
  Ampere and Hopper runs; a V100, an L40S, a B200 or an MI300X are of other generations);
* **parallelism**: every development run's tensor, pipeline and context degrees are more than a
  factor of 4 away from the query's in at least one of them (``max |log2 ratio| > 2``: TP 2 is near TP 8,
  PP 64 near PP 24, CP 8 far from CP 1);
* **sequence length**: every development run's sequence is more than a factor of 4 shorter or longer.

:func:`far_from` lists the respects in which a query is far, with the nearest development value, and
the interval widens by one more between-source variance for each (:meth:`Spread.bounds` with ``far``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

FACTOR = 4.0
"""Farther than this factor from every development run (in a degree or the sequence length) is far."""

GENERATIONS = (("GH200", "Hopper"), ("GB200", "Blackwell"), ("H100", "Hopper"), ("H200", "Hopper"), ("H800", "Hopper"),
               ("A100", "Ampere"), ("A800", "Ampere"), ("A10", "Ampere"), ("V100", "Volta"), ("L40", "Ada"),
               ("L4", "Ada"), ("B200", "Blackwell"), ("B100", "Blackwell"), ("MI250", "CDNA2"), ("MI300", "CDNA3"))
"""Name fragments of the catalog's parts and their architecture, longer fragments first where one holds another."""


def generation(gpu) -> str:
    """The architecture of a part, from its name (``"NVIDIA H100 80GB HBM3"`` -> Hopper); its key when the name
    holds none of :data:`GENERATIONS` (a CPU, a custom part)."""
    name = (getattr(gpu, "name", "") or "").upper()
    for tag, arch in GENERATIONS:
        if tag in name:
            return arch
    return getattr(gpu, "key", "") or name or "unknown"


@dataclass(frozen=True)
class Point:
    """What a run is, in the respects that are judged: its GPU's generation, parallel degrees, sequence."""

    generation: str
    tp: int
    pp: int
    cp: int
    seq: int
    source: str = ""


def point_of(est, model, gpu, source: str = "") -> Point:
    L = est.layout
    return Point(generation(gpu), L.tp, L.pp, L.cp, model.seq, source)


def _log2(a: float, b: float) -> float:
    return abs(math.log2(max(a, 1) / max(b, 1)))


def far_from(q: Point, dev: tuple[Point, ...]) -> dict:
    """The respects in which ``q`` is far from every point of ``dev`` (module doc): ``{respect: text}``, empty when
    it is near in all three. Only development points of another source count (a held-out source is not its own
    neighbour)."""
    others = [p for p in dev if not q.source or p.source != q.source]
    out = {}
    if not others:
        return out
    gens = sorted({p.generation for p in others})
    if q.generation not in gens:
        out["generation"] = f"{q.generation} (development runs: {', '.join(gens)})"
    same = [p for p in others if p.generation == q.generation] or others
    par = min(others, key=lambda p: max(_log2(q.tp, p.tp), _log2(q.pp, p.pp), _log2(q.cp, p.cp)))
    if max(_log2(q.tp, par.tp), _log2(q.pp, par.pp), _log2(q.cp, par.cp)) > math.log2(FACTOR):
        out["parallelism"] = (f"TP{q.tp} PP{q.pp} CP{q.cp} (nearest development run: TP{par.tp} PP{par.pp} CP{par.cp}, "
                              f"{par.source})")
    near_seq = min(others, key=lambda p: _log2(q.seq, p.seq))
    if _log2(q.seq, near_seq.seq) > math.log2(FACTOR):
        lo, hi = min(p.seq for p in same), max(p.seq for p in same)
        out["sequence"] = f"{q.seq} tokens (development runs: {lo}-{hi})"
    return out


def point_of_row(row) -> Point:
    """A development row as a :class:`Point`: its published layout; a degree the source does not publish (LLaMA's
    tensor-parallel degree) is 1, the least it can be."""
    tp, pp, _, cp, *_ = row.fixed
    return Point(generation(row.spec()), tp or 1, pp or 1, cp or 1, row.model.seq, row.source)


@lru_cache(maxsize=1)
def development_points() -> tuple[Point, ...]:
    """Every row of the development set shipped with trainperf as a :class:`Point`."""
    from trainperf.planner import devset

    return tuple(point_of_row(r) for r in devset.load())

"""The search's order: the surest gains first.

An expert looks at the estimate before measuring anything. After the default's trial, every
dimension gets an expected gain around the default and a class saying how sure that gain is, from
the analytic model (:mod:`trainperf.analytic`: the FLOPs a checkpointing mode recomputes), the
memory estimate (:mod:`trainperf.tune.fit`) and the dense-peak catalog:

    0 less work          under torchrun, the layouts the planner's cost model ranks first; then the
                         recompute the estimate shows is not needed: the least recompute that fits at
                         this micro-batch, checked by one trial (expected: hardware FLOPs ratio)
    1 fewer micro-steps  the largest micro-batch that fits (the estimate): the same FLOPs in fewer,
                         larger micro-steps (no closed form for the gain: measured)
    2 faster arithmetic  a precision with a higher dense peak on this device (catalog ratio)
    3 measured only      compile, the allocator, the loader, threads: no model predicts them
    4 more work          more recompute than the estimate needs: expected slower, tried last

Dimensions are searched by class, then by expected factor, then in the fixed order of
:data:`trainperf.tune.space.ORDER`. The order and each reason go to ``plan.json``, the table and
every trial record (``expected``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainperf.config.schema import Config
from trainperf.tune import space

CLASSES = ("less work", "fewer micro-steps", "faster arithmetic", "measured only", "more work")


@dataclass
class Step:
    name: str  # the dimension
    build: Callable  # (current config, data degree, sharded) -> space.Dimension
    rank: int  # index into CLASSES
    factor: float | None  # expected speed-up (step time now / with the change); None: no model predicts it
    why: str

    def as_dict(self) -> dict:
        return {"dimension": self.name, "class": CLASSES[self.rank], "expected_speedup": self.factor, "why": self.why}

    def label(self) -> str:
        gain = f", expected x{self.factor:.2f}" if self.factor is not None else ""
        return f"{self.name} [{CLASSES[self.rank]}{gain}]: {self.why}"


# ---------------------------------------------------------------------- the analytic side
def _spec(cfg: Config):
    """The reference GPT's (or a Hugging Face model's) analytic spec; None for a user's own model."""
    if cfg.model.entrypoint:
        return None
    from trainperf.analytic.spec import TransformerSpec
    from trainperf.models.shape import model_shape

    try:
        s = model_shape(cfg)
        vocab = s["vocab_size"] if isinstance(s.get("vocab_size"), int) else 256
        return TransformerSpec(hidden=int(s["n_embd"]), layers=int(s["n_layer"]), heads=int(s["n_head"]),
                               seq=int(s["block_size"]), vocab=vocab, kv_heads=s.get("n_kv_head"))
    except Exception:  # noqa: BLE001 - a shape the spec cannot hold: the block-fraction fallback below
        return None


def _layers(cfg: Config, spec) -> int:
    if spec is not None:
        return spec.layers
    n = getattr(cfg.model, "n_layer", None)
    return int(n) if n else 4


def recompute(cfg: Config, settings: space.Settings) -> tuple[int, int] | None:
    """(blocks fully recomputed, blocks selective) for the checkpointing in ``settings`` (None: ``budget``
    or ``every_k`` modes the space does not search, whose plan the search does not know)."""
    from trainperf.analytic.recompute import counts

    mode = settings.get("memory.checkpointing.mode", "none")
    if mode not in ("none", "selective", "ratio", "full"):
        return None
    l = _layers(cfg, _spec(cfg))
    return counts(mode, l, ratio=float(settings.get("memory.checkpointing.ratio", 0.25)))


def flops_ratio(cfg: Config, now: space.Settings, then: space.Settings) -> tuple[float | None, str]:
    """Expected step-time ratio now / then from the hardware FLOPs each checkpointing runs (analytic:
    a fully recomputed block runs its forward again; trainperf's selective mode re-runs no matmul).
    Without a spec (a user's model): a block's forward taken as a third of its forward + backward."""
    a, b = recompute(cfg, now), recompute(cfg, then)
    if a is None or b is None:
        return None, "recompute of this mode unknown"
    spec = _spec(cfg)
    l = _layers(cfg, spec)
    if spec is not None:
        fa, fb = spec.hardware_flops_per_token(a[0]), spec.hardware_flops_per_token(b[0])
        how = "hardware FLOPs per token (analytic model)"
    else:
        fa, fb = 1 + a[0] / (3 * l), 1 + b[0] / (3 * l)
        how = "a block's forward = 1/3 of its forward + backward (no analytic spec for this model)"
    return fa / fb, f"{a[0]}/{l} -> {b[0]}/{l} blocks re-run in backward, {how}"


def _pct(fit) -> str:
    if fit is None or fit.bytes is None or not fit.budget:
        return "no estimate"
    return f"estimate {fit.bytes / 2**20:,.0f} MiB = {100 * fit.bytes / fit.budget:.2g}% of {fit.budget / 2**30:,.1f} GiB"


# ---------------------------------------------------------------------- the plan
def plan(default: Config, facts: space.Facts, fit: Callable[[space.Settings], object | None]) -> list[Step]:
    """The dimensions in the search's order around ``default`` (resolved). ``fit(changes)`` is the memory
    estimate (:class:`trainperf.tune.fit.Fit`) of the default with ``changes``, or None when that
    candidate does not resolve."""
    builders = space.builders(facts)
    cur = space.settings_of(default)
    cur_ac = {k: v for k, v in cur.items() if k.startswith("memory.checkpointing.")}
    steps: list[Step] = []

    if "layout" in builders:
        steps.append(Step("layout", builders["layout"], 0, None,
                          f"the planner's cost model ranks these layouts fastest for {facts.world_size} ranks "
                          "(degrees, micro-batch and recompute together)"))

    # recompute the estimate shows is not needed: the least recompute that fits, one trial
    least, least_fit = None, None
    now = recompute(default, cur_ac)
    for ac in space.CHECKPOINTING:
        r = recompute(default, ac)
        if now is None or r is None or r >= now:
            break  # from here on as much recompute as now, or more
        f = fit(ac)
        if f is not None and f.fits:
            least, least_fit = ac, f
            break
    ac_after = least or cur_ac
    if least is not None:
        factor, how = flops_ratio(default, cur_ac, least)
        steps.append(Step("checkpointing", _only(least), 0, factor,
                          f"{space.label(cur_ac)} -> {space.label(least)}: {how}; {_pct(least_fit)}: the recompute "
                          "is not needed"))

    # the largest micro-batch that fits (with the checkpointing above)
    dp = max(1, default.parallelism.data) * default.parallelism.data_shard
    local = default.train.global_batch // dp
    mb = default.train.micro_batch
    largest, largest_fit = None, None
    for d in (d for d in range(local, 0, -1) if local % d == 0):
        f = fit({"train.micro_batch": d, **ac_after})
        if f is not None and f.fits:
            largest, largest_fit = d, f
            break
    if largest is not None and largest > mb:
        steps.append(Step("micro_batch", builders["micro_batch"], 1, None,
                          f"micro-batch {mb} x {local // mb} micro-steps -> the largest that fits, {largest} x "
                          f"{local // largest} ({_pct(largest_fit)}): the same FLOPs in fewer, larger micro-steps"))
    else:
        steps.append(Step("micro_batch", builders["micro_batch"], 3, None,
                          f"micro-batch {mb} is already the largest that fits ({_pct(fit(ac_after))}); smaller ones "
                          "are measured (cache effects on a CPU)"))

    steps.append(_precision(builders["precision"], default, facts))
    for name in ("host_memory", "compile", "data.loader", "data.num_workers", "data.prefetch.depth", "threads"):
        steps.append(Step(name, builders[name], 3, None, _MEASURED[name]))

    # the rest of checkpointing: more recompute than the estimate needs (or less, where it does not fit)
    more = [ac for ac in space.CHECKPOINTING if ac != ac_after]
    factor = None
    if more:
        factor, _ = flops_ratio(default, ac_after, more[0])
    steps.append(Step("checkpointing", builders["checkpointing"], 4, factor,
                      f"the other modes around {space.label(ac_after)}: more recompute is expected slower (the first "
                      "that runs ends the dimension); less is pruned where the estimate says it does not fit"))

    first = [s for s in steps if s.rank == 0]
    rest = sorted((s for s in steps if s.rank > 0),
                  key=lambda s: (s.rank, -(s.factor or 0.0), space.ORDER.index(s.name)))
    return first + rest


_MEASURED = {
    "host_memory": "the C allocator's page faults per step: measured (no model predicts them)",
    "compile": "depends on the model and device (published x1.8 on a Swin Transformer, GPU); compiles first: measured",
    "data.loader": "bounded by the data wait of the default's steps: measured",
    "data.num_workers": "bounded by the data wait: measured",
    "data.prefetch.depth": "bounded by the data wait: measured",
    "threads": "fewer intra-op threads than cores: measured",
}


def _precision(build, default: Config, facts: space.Facts) -> Step:
    cur = default.precision.dtype
    if facts.device == "cuda":
        from trainperf.hardware.catalog import lookup_gpu

        gpu = lookup_gpu(facts.gpu_name)
        if gpu is not None:
            best = "bf16" if facts.bf16 and gpu.bf16_tflops else "fp16"  # a V100 emulates bf16: fp16
            try:
                factor = gpu.peak_tflops(best) / gpu.peak_tflops(cur)
            except Exception:  # noqa: BLE001 - a precision the catalog does not list
                factor = None
            if factor is not None and factor > 1:
                return Step("precision", build, 2, factor,
                            f"{cur} -> {best}: dense peak {gpu.peak_tflops(cur):g} -> {gpu.peak_tflops(best):g} "
                            f"TFLOP/s on {gpu.name} (catalog; matmul-bound steps gain up to this)")
    return Step("precision", build, 3, None, f"{cur} now; on this device no dense-peak figure predicts another: "
                                             "measured where the device runs it")


def _only(settings: space.Settings):
    def build(cfg, dp, sharded) -> space.Dimension:
        ac = cfg.memory.checkpointing
        cur = {"memory.checkpointing.mode": ac.mode,
               **({"memory.checkpointing.ratio": ac.ratio} if ac.mode == "ratio" else {})}
        return space.Dimension("checkpointing", [space.Option(settings)] if cur != settings else [])
    return build

"""Layout search: every valid (tp, pp, dp, micro-batch, interleave, recompute, SP, ZeRO) that
fits in memory, ranked by step time; the rest rejected with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainperf.errors import UserError
from trainperf.hardware.catalog import GPUSpec
from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import GIB, RECOMPUTE, Estimate, Layout, estimate
from trainperf.planner.model import ModelSpec
from trainperf.planner.stack import DEFAULT as DEFAULT_STACK
from trainperf.planner.stack import Stack

MAX_TP = 64
MAX_INTERLEAVE = 8
# The founding document's 175B case: tensor 8 x pipeline 4 x data 16 on 512 GPUs.
SEED_BASELINES = {("gpt3-175b", 512): (8, 4, 16)}
# Published global batches (sequences) for presets; other models get ~4M tokens (see below).
PUBLISHED_BATCH = {"gpt3-175b": (1536, "GPT-3 paper, Brown et al. 2020, Table 2.1: 3.2M tokens")}


@dataclass
class Fixed:
    """Parts of the layout the user fixed (None: searched)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    interleave: int | None = None
    recompute: str | None = None
    """none, selective, full (every layer of every stage) or partial (recompute_layers per stage)."""
    sequence_parallel: bool | None = None
    zero: int | None = None
    max_micro_batch: int = 16
    cp: int | None = None
    """Context-parallel degree (not searched: 1 unless given)."""
    shard: int | None = None
    """HSDP: shard the ZeRO states within groups of this many data-parallel ranks (not searched)."""
    recompute_layers: int | None = None
    """With recompute partial: whole layers recomputed per stage (None: searched)."""
    stack_sequence_parallel: bool | None = None
    """From the stack, not a pin: False, it has no sequence parallelism; True, every TP layout uses it."""
    stack_recompute: tuple[str, ...] | None = None
    """From the stack, not a pin: the recompute kinds it implements (None: all)."""

    def pins(self) -> dict:
        """The parts the user fixed, by name (what --json echoes)."""
        names = ("tp", "pp", "dp", "micro_batch", "interleave", "recompute", "recompute_layers",
                 "sequence_parallel", "zero", "cp", "shard")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass
class Plan:
    model: ModelSpec
    gpu: GPUSpec
    gpus: int
    global_batch: int
    candidates: list[Estimate]
    rejected: list[dict]
    evaluated: int = 0
    out_of_memory: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Estimate:
        return self.candidates[0]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def default_global_batch(model: ModelSpec, gpus: int) -> tuple[int, str]:
    if model.name in PUBLISHED_BATCH:
        return PUBLISHED_BATCH[model.name]
    target = max(1, round(2**22 / model.seq))
    batch = math.ceil(target / gpus) * gpus
    return batch, f"about 4M tokens ({target} sequences of {model.seq}) rounded up to a multiple of {gpus} GPUs"


def check_fixed(model: ModelSpec, gpus: int, fx: Fixed) -> None:
    """Reject impossible fixed parts up front with the valid choices."""
    if gpus < 1:
        raise UserError(f"--gpus {gpus}: must be at least 1")
    if fx.tp is not None and (fx.tp < 1 or model.heads % fx.tp):
        valid = ", ".join(str(d) for d in _divisors(model.heads) if d <= gpus)
        raise UserError(f"--tp {fx.tp} does not divide the {model.heads} attention heads of {model.name}; choose among {valid}")
    if fx.pp is not None and (fx.pp < 1 or model.layers % fx.pp):
        valid = ", ".join(str(d) for d in _divisors(model.layers) if d <= gpus)
        raise UserError(f"--pp {fx.pp} does not divide the {model.layers} layers of {model.name}; choose among {valid}")
    for name in ("tp", "pp", "dp"):
        val = getattr(fx, name)
        if val is not None and gpus % val:
            raise UserError(f"--{name} {val} does not divide --gpus {gpus}; choose among {', '.join(map(str, _divisors(gpus)))}")
    cp = fx.cp or 1
    prod = (fx.tp or 1) * (fx.pp or 1) * (fx.dp or 1) * cp
    if gpus % prod:
        raise UserError(
            f"--gpus {gpus} is not divisible by the fixed degrees "
            f"(tp {fx.tp or 1} x pp {fx.pp or 1} x dp {fx.dp or 1}" + (f" x cp {cp}" if cp > 1 else "")
            + f" = {prod}); change a degree or the GPU count"
        )
    if fx.tp and fx.pp and fx.dp and prod != gpus:
        raise UserError(f"tp x pp x dp{' x cp' if cp > 1 else ''} = {fx.tp} x {fx.pp} x {fx.dp}"
                        + (f" x {cp}" if cp > 1 else "") + f" = {prod} but --gpus is {gpus}; they must be equal")
    if fx.interleave is not None and fx.interleave > 1:
        if fx.pp is not None and (fx.pp == 1 or (model.layers // fx.pp) % fx.interleave):
            raise UserError(
                f"--interleave {fx.interleave} needs a pipeline (pp > 1) whose layers per stage "
                f"({model.layers // fx.pp}) it divides"
            )
    if fx.recompute is not None and fx.recompute not in RECOMPUTE:
        raise UserError(f"--recompute {fx.recompute!r}: choose one of {', '.join(RECOMPUTE)}")
    if fx.recompute_layers is not None:
        if fx.recompute not in (None, "partial"):
            raise UserError(f"--recompute-layers {fx.recompute_layers} goes with --recompute partial, not "
                            f"--recompute {fx.recompute} ({'every layer of every stage' if fx.recompute == 'full' else 'no whole layer'} "
                            "is recomputed); drop one of them")
        stage = model.layers // (fx.pp or 1)
        if fx.recompute_layers < 1 or fx.recompute_layers >= stage:
            raise UserError(f"--recompute-layers {fx.recompute_layers}: must be between 1 and the layers per stage - 1 "
                            f"({stage - 1} with --pp {fx.pp or 1}); use --recompute full for every layer")
    if fx.sequence_parallel and fx.tp == 1:
        raise UserError("--sequence-parallel needs tensor parallelism (--tp > 1); drop --sequence-parallel or raise --tp")
    if fx.zero is not None and fx.zero not in (0, 1, 2, 3):
        raise UserError(f"--zero {fx.zero}: choose 0, 1, 2 or 3")
    if fx.micro_batch is not None and fx.micro_batch < 1:
        raise UserError(f"--microbatch {fx.micro_batch}: must be at least 1")
    if fx.shard is not None and fx.shard < 1:
        raise UserError(f"--hsdp-shard {fx.shard}: must be at least 1 (the ranks one copy of the states is sharded over)")
    if fx.shard is not None and (gpus % fx.shard or (fx.dp is not None and fx.dp % fx.shard)):
        of = f"--dp {fx.dp}" if fx.dp is not None else f"the data-parallel degree, so --gpus {gpus}"
        valid = _divisors(fx.dp if fx.dp is not None else gpus)
        raise UserError(f"--hsdp-shard {fx.shard} must divide {of}; choose among {', '.join(map(str, valid))}")
    if fx.cp is not None and (fx.cp < 1 or gpus % fx.cp or model.seq % fx.cp):
        raise UserError(f"--cp {fx.cp} must divide --gpus {gpus} and the sequence length {model.seq}")


def search(
    model: ModelSpec,
    gpu: GPUSpec,
    gpus: int,
    global_batch: int,
    fixed: Fixed | None = None,
    c: Constants = DEFAULTS,
    explain_failure: bool = True,
    stack: Stack = DEFAULT_STACK,
    keep_oom: bool = False,
) -> Plan:
    """All layouts that fit, fastest first, on training stack `stack`; every part fixed in
    `fixed` holds in every candidate. Raises UserError when none does (with the fix); ``keep_oom`` (a
    split the user fixed): the estimate of the closest variant instead, marked as predicted not
    to fit, with the fix in ``notes``."""
    fx = fixed or Fixed()
    fx = _with_stack(fx, stack)
    check_fixed(model, gpus, fx)
    if global_batch < 1:
        raise UserError(f"--global-batch {global_batch}: must be at least 1")
    candidates: list[Estimate] = []
    rejected: list[dict] = []
    evaluated = oom = 0
    closest: Estimate | None = None  # the out-of-memory layout with the smallest shortfall

    cp = fx.cp or 1
    tps = [fx.tp] if fx.tp else [d for d in _divisors(gpus // cp) if d <= MAX_TP and not (fx.sequence_parallel and d == 1)]
    for tp in tps:
        if model.heads % tp:
            rejected.append({"tp": tp, "reason": f"tp {tp} does not divide {model.heads} heads"})
            continue
        pps = [fx.pp] if fx.pp else [d for d in _divisors(gpus // (tp * cp)) if d <= model.layers]
        for pp in pps:
            if gpus % (tp * pp * cp):
                continue
            if model.layers % pp:
                rejected.append({"tp": tp, "pp": pp, "reason": f"pp {pp} does not divide {model.layers} layers"})
                continue
            dp = gpus // (tp * pp * cp)
            if fx.dp and dp != fx.dp:
                continue
            if global_batch % dp:
                rejected.append({"tp": tp, "pp": pp, "dp": dp,
                                 "reason": f"global batch {global_batch} not divisible by dp {dp}"})
                continue
            fits_here: list[Estimate] = []
            best_oom: Estimate | None = None
            for layout in _variants(model, tp, pp, dp, global_batch, fx, cp):
                evaluated += 1
                est = estimate(model, gpu, layout, global_batch, c, stack=stack)
                if est.fits:
                    fits_here.append(est)
                else:
                    oom += 1
                    if best_oom is None or est.memory_bytes < best_oom.memory_bytes:
                        best_oom = est
            if not fits_here and best_oom is None:
                rejected.append({"tp": tp, "pp": pp, "dp": dp,
                                 "reason": _why_no_variant(model, pp, dp, global_batch, fx)})
            elif not fits_here:
                short = (best_oom.memory_bytes - best_oom.gpu_memory_bytes) / GIB
                rejected.append({
                    "tp": tp, "pp": pp, "dp": dp,
                    "reason": f"out of memory by {short:.1f} GiB even as {best_oom.layout.short()} "
                              f"({best_oom.memory_bytes / GIB:.1f} of {gpu.hbm_gib:.0f} GiB)",
                    "short_by_gib": round(short, 2),
                    "closest": best_oom.as_dict(),
                })
                if closest is None or best_oom.memory_bytes < closest.memory_bytes:
                    closest = best_oom
            candidates.extend(fits_here)

    if not candidates:
        if not explain_failure:
            raise UserError("no layout fits")
        why = _nothing_fits(model, gpu, gpus, global_batch, closest, rejected, fx, c, stack)
        if keep_oom and closest is not None:
            # The memory model is an estimate and a published run is evidence: a layout the user fixed is
            # timed anyway, and said to be over the memory budget.
            note = (f"predicted NOT to fit: {why} The step time shown is what the layout would take if it ran; "
                    "if it does run for you, the memory estimate is too high for your stack (`trainperf memory "
                    "CONFIG --measure` checks it on a real micro-batch).")
            return Plan(model, gpu, gpus, global_batch, [closest], rejected, evaluated, oom, notes=[note])
        raise UserError(why)
    candidates.sort(key=lambda e: (e.step_time_s, e.memory_bytes))
    return Plan(model, gpu, gpus, global_batch, candidates, rejected, evaluated, oom, notes=_node_notes(gpu, gpus))


def _node_notes(gpu, gpus: int) -> list[str]:
    """A GPU count that is not a whole number of nodes (past one node) is planned as it is, with a note: the
    model places the layout's groups on nodes of ``gpus_per_node``, and a cluster is rarely allotted half
    a node."""
    per = max(1, int(gpu.gpus_per_node))
    if gpus <= per or gpus % per == 0:
        return []
    return [f"--gpus {gpus} is not a whole number of {gpu.key} nodes ({per} GPUs per node in the catalog: "
            f"{gpus / per:.2f} nodes); the estimate places the groups on nodes of {per}, the last one partly "
            f"filled. Check --gpus, or gpus_per_node in a --catalog file"]


def _with_stack(fx: Fixed, stack: Stack) -> Fixed:
    """What the stack implies for the parts the user left open: its ZeRO stage, whether it has sequence
    parallelism, which recompute kinds it offers. A pin always wins (it is never replaced)."""
    from dataclasses import replace as _replace

    if fx.zero is None and stack.zero_pin() is not None:
        fx = _replace(fx, zero=stack.zero_pin())
    if fx.sequence_parallel is None and stack.sequence_parallel is not None:
        fx = _replace(fx, stack_sequence_parallel=stack.sequence_parallel)
    if fx.recompute is None and stack.recompute is not None:
        fx = _replace(fx, stack_recompute=tuple(stack.recompute))
    return fx


def _why_no_variant(model: ModelSpec, pp: int, dp: int, global_batch: int, fx: Fixed) -> str:
    """Which pin leaves these degrees without a single layout (the search's own rules, in words)."""
    local = global_batch // dp
    if fx.micro_batch and local % fx.micro_batch:
        return (f"--microbatch {fx.micro_batch} does not divide the sequences per data-parallel rank (global batch "
                f"{global_batch} / dp); choose a divisor of them, or another --global-batch")
    if fx.shard and fx.zero == 0:
        return f"--hsdp-shard {fx.shard} shards the model states, which needs ZeRO 1-3, but --zero 0 is pinned"
    if fx.shard and dp % fx.shard:
        return f"--hsdp-shard {fx.shard} does not divide dp {dp} (the data-parallel ranks it groups)"
    layers_per_stage = model.layers // pp
    if fx.interleave and fx.interleave > 1:
        if pp == 1:
            return f"--interleave {fx.interleave} needs a pipeline (pp > 1), and pp is 1 here"
        if layers_per_stage % fx.interleave:
            return f"--interleave {fx.interleave} does not divide the {layers_per_stage} layers per stage (pp {pp})"
        return (f"--interleave {fx.interleave} needs micro-batches per step divisible by pp {pp} (the interleaved "
                "schedule's rule); change --microbatch or --global-batch")
    if fx.sequence_parallel and fx.sequence_parallel is True:
        return "sequence parallelism is pinned, which needs tensor parallelism (tp > 1)"
    if fx.recompute == "partial" and fx.recompute_layers is not None and fx.recompute_layers >= layers_per_stage:
        return (f"--recompute-layers {fx.recompute_layers} is not fewer than the {layers_per_stage} layers per stage "
                f"(pp {pp}); use --recompute full for all of them")
    return "no micro-batch / interleave choice is valid for this batch"


def _variants(model: ModelSpec, tp: int, pp: int, dp: int, global_batch: int, fx: Fixed, cp: int = 1):
    """Every layout with these degrees that honours every fixed part (a pin is never replaced)."""
    local = global_batch // dp
    mbs = [fx.micro_batch] if fx.micro_batch else [b for b in _divisors(local) if b <= fx.max_micro_batch]
    if fx.micro_batch and local % fx.micro_batch:
        return
    if fx.sequence_parallel is not None:
        if fx.sequence_parallel and tp == 1:
            return  # sequence parallelism pinned: only layouts with tensor parallelism
        sps = [fx.sequence_parallel]
    elif fx.stack_sequence_parallel is not None:
        sps = [fx.stack_sequence_parallel and tp > 1]
    else:
        sps = [False, True] if tp > 1 else [False]
    layers_per_stage = model.layers // pp
    if fx.recompute:
        recomputes = [fx.recompute]
    else:
        recomputes = [k for k in ("none", "selective", "full", "partial")
                      if fx.stack_recompute is None or k in fx.stack_recompute]
        if model.attention == "flash" and "selective" in recomputes:
            recomputes.remove("selective")  # Megatron's selective re-runs the attention core: nothing kept to save
    rcs: list[tuple[str, int]] = []
    for rc in recomputes:
        if rc != "partial":
            rcs.append((rc, 0))
        elif fx.recompute_layers is not None:
            if fx.recompute_layers < layers_per_stage:
                rcs.append(("partial", fx.recompute_layers))
        else:  # block recompute of a quarter, half, three quarters of the stage's layers
            ks = sorted({max(1, layers_per_stage * q // 4) for q in (1, 2, 3)} - {0, layers_per_stage})
            rcs += [("partial", k) for k in ks if k < layers_per_stage]
    if not rcs:
        return
    if fx.zero is not None:
        zeros = [fx.zero]
    else:
        zeros = [0] if dp * cp == 1 else ([0, 1] if pp > 1 else [0, 1, 2, 3])
    for b in mbs:
        m = local // b
        if fx.interleave:
            vs = [fx.interleave]
        elif pp > 1:
            vs = [v for v in _divisors(layers_per_stage) if v <= MAX_INTERLEAVE]
        else:
            vs = [1]
        for v in vs:
            if v > 1 and (pp == 1 or layers_per_stage % v or m % pp):
                continue  # Megatron's interleaved schedule needs micro-batches divisible by pp
            for rc, k in rcs:
                for sp in sps:
                    for z in zeros:
                        if z >= 2 and pp > 1 and fx.zero is None:
                            continue  # not searched with a pipeline (pinned: FSDP2 + PP as torchtitan runs it)
                        if fx.shard:
                            if z < 1 or dp % fx.shard:
                                continue  # the HSDP group is pinned: only layouts that can shard over it
                            shard = fx.shard
                        else:
                            shard = 0
                        yield Layout(tp, pp, dp, b, v, rc, sp, z, cp, shard, k)


def _nothing_fits(model, gpu, gpus, global_batch, closest, rejected, fx: Fixed, c: Constants,
                  stack: Stack = DEFAULT_STACK) -> str:
    head = f"{model.name} ({model.params() / 1e9:.1f}B parameters) fits in no layout on {gpus} x {gpu.key} ({gpu.hbm_gib:.0f} GiB)"
    if closest is None:
        reasons = "; ".join(sorted({r["reason"] for r in rejected})[:5]) or "no valid degrees"
        return f"{head}: {reasons}. Change --gpus, --global-batch or the fixed degrees."
    short = (closest.memory_bytes - closest.gpu_memory_bytes) / GIB
    fixes = []
    # Concrete fixes, each checked by searching again: more GPUs (same batch), a bigger GPU.
    for mult in (2, 4, 8, 16, 32, 64, 128):
        more = gpus * mult
        try:
            search(model, gpu, more, global_batch, _loosen(fx, stack), c, explain_failure=False, stack=stack)
        except UserError:
            continue
        fixes.append(f"--gpus {more} (the smallest power-of-two multiple of {gpus} that fits)")
        break
    from trainperf.hardware.catalog import CATALOG

    for other in sorted(CATALOG.values(), key=lambda g: g.hbm_gib):
        if other.hbm_gib <= gpu.hbm_gib or other.key == "cpu":
            continue
        try:
            search(model, other, gpus, global_batch, _loosen(fx, stack), c, explain_failure=False, stack=stack)
        except UserError:
            continue
        fixes.append(f"--gpu {other.key} ({other.hbm_gib:g} GiB)")
        break
    if any(v is not None for v in (fx.tp, fx.pp, fx.dp, fx.micro_batch, fx.recompute, fx.zero, fx.sequence_parallel)):
        try:
            search(model, gpu, gpus, global_batch, _loosen(Fixed(), stack), c, explain_failure=False, stack=stack)
            fixes.append("dropping the fixed layout choices (--tp/--pp/--dp/--microbatch/--recompute/--zero)")
        except UserError:
            pass
    fix = "; or ".join(fixes) if fixes else "many more GPUs or a GPU with more memory"
    return (
        f"{head}. The closest is {closest.layout.short()} at {closest.memory_bytes / GIB:.1f} GiB per GPU, "
        f"{short:.1f} GiB over. Fix: {fix}."
    )


def _loosen(fx: Fixed, stack: Stack = DEFAULT_STACK) -> Fixed:
    """The user's GPU-count-independent choices, else the most memory-frugal ones (micro-batch 1,
    full recompute, sequence parallel, no interleaving): enough to learn whether anything fits."""
    return Fixed(
        micro_batch=fx.micro_batch or 1,
        interleave=fx.interleave or 1,
        recompute=fx.recompute or "full",
        recompute_layers=fx.recompute_layers,
        # sequence parallel saves memory, unless the stack has none
        sequence_parallel=(fx.sequence_parallel if fx.sequence_parallel is not None
                           else stack.sequence_parallel is not False),
        zero=fx.zero,
        max_micro_batch=1,
        cp=fx.cp,
        shard=fx.shard,
    )


def rank_of(plan: Plan, tp: int, pp: int, dp: int) -> tuple[int, Estimate] | None:
    """1-based rank and estimate of the fastest variant with these degrees, or None."""
    for i, est in enumerate(plan.candidates):
        L = est.layout
        if (L.tp, L.pp, L.dp) == (tp, pp, dp):
            return i + 1, est
    return None


def explain(better: Estimate, worse: Estimate) -> list[str]:
    """Why `better` is faster: the time components that differ most, largest first."""
    lines = []
    for key in better.time:
        delta = worse.time.get(key, 0.0) - better.time.get(key, 0.0)
        if abs(delta) >= 0.005 * worse.step_time_s:
            verb = "less" if delta > 0 else "more"
            lines.append((abs(delta), f"{verb} {key.replace('_', ' ')}: {better.time[key]:.2f} s vs {worse.time[key]:.2f} s"))
    lines.sort(reverse=True)
    return [text for _, text in lines]

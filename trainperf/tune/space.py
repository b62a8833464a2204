"""The search space: one :class:`Dimension` per knob, built against the current best settings
(the order they are searched in: :mod:`trainperf.tune.order`).

A candidate's *settings* map dotted config paths to values (``{"train.micro_batch": 8}``);
:func:`apply` writes them into a config. Each dimension lists its options fastest-first (the
search tries them in that order) and the options it rejects up front with the reason (the
device cannot run them, or they have no effect with the current settings). Memory pruning is
the search's (:mod:`trainperf.tune.fit`), not the dimension's.

    precision       bf16 / tf32 / fp16 / fp32, as the device supports them
    compile         whole model / per block (regional) / off
    host_memory     CPU: the C allocator keeps freed blocks mapped (retain) or returns them (release)
    micro_batch     divisors of the per-rank batch, largest first (global batch fixed)
    checkpointing   none, selective, ratio 0.25, ratio 0.5, full (least recompute first)
    data.loader     simple (in-process) / hybrid (workers + prefetch tiers)
    num_workers     loader workers (hybrid or dataloader only)
    prefetch depth  data.prefetch.depth (hybrid or dataloader only)
    threads         CPU: half the intra-op threads (from 4 CPUs per rank: hyperthreads, loader workers)
    layout          under torchrun: the planner's best layouts for the world size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from trainperf.config.load import build_config
from trainperf.config.schema import Config

Settings = dict[str, Any]

# The knobs the tuner reports for every candidate (its full settings), in this order.
KEYS = ("precision.dtype", "run.host_memory", "train.micro_batch", "memory.checkpointing.mode",
        "memory.checkpointing.ratio",
        "compile.enabled", "compile.regional", "data.loader", "data.num_workers", "data.prefetch.depth",
        "parallelism.data", "parallelism.data_shard", "parallelism.tensor", "parallelism.pipeline", "run.threads")

# Activation checkpointing, least recompute first.
CHECKPOINTING: list[Settings] = [
    {"memory.checkpointing.mode": "none"},
    {"memory.checkpointing.mode": "selective"},
    {"memory.checkpointing.mode": "ratio", "memory.checkpointing.ratio": 0.25},
    {"memory.checkpointing.mode": "ratio", "memory.checkpointing.ratio": 0.5},
    {"memory.checkpointing.mode": "full"},
]


def get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def apply(cfg: Config, settings: Settings) -> Config:
    """A copy of ``cfg`` with ``settings`` written in (validated like a YAML file)."""
    data = cfg.model_dump(mode="json")
    for key, value in settings.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return build_config(data, source="tune candidate")


def settings_of(cfg: Config) -> Settings:
    """The tuned knobs' values in a (resolved) config."""
    out = {k: get(cfg, k) for k in KEYS}
    if out["memory.checkpointing.mode"] != "ratio":
        out.pop("memory.checkpointing.ratio")
    return out


def label(settings: Settings) -> str:
    return " ".join(f"{k.split('.')[-1] if k != 'memory.checkpointing.mode' else 'ac'}={v}"
                    for k, v in settings.items())


@dataclass
class Option:
    settings: Settings  # what this option changes
    note: str = ""  # e.g. "with checkpointing selective to fit"


@dataclass
class Dimension:
    name: str
    options: list[Option]  # fastest-first, the current value left out
    rejected: list[tuple[Settings, str]] = field(default_factory=list)  # (settings, reason), never run
    # checkpointing: once one option runs, the later ones only recompute more at the same micro-batch
    stop_after_first_ok: bool = False
    # micro-batch: once one option is clearly slower than the dimension's best, smaller ones are skipped
    stop_when_slower: bool = False


@dataclass
class Facts:
    """What the space depends on: the device and the job (injectable for tests)."""

    device: str  # cpu | cuda | xla
    bf16: bool = False  # CUDA bf16, or a CPU with native bf16 (AVX512-BF16 / AMX)
    tf32: bool = False
    cpus: int = 1
    world_size: int = 1
    gpu_name: str = ""

    @classmethod
    def probe(cls, device: str, world_size: int) -> "Facts":
        from trainperf.config.resolve import DeviceFacts

        dev = DeviceFacts.probe()
        if device == "cuda":
            return cls("cuda", bf16=dev.bf16, tf32=dev.tf32, cpus=dev.cpus, world_size=world_size,
                       gpu_name=dev.cuda_name)
        from trainperf.hardware.probe import cpu_facts

        return cls(device, bf16=bool(cpu_facts().get("bf16_native")), cpus=dev.cpus, world_size=world_size)


def _others(current: Any, key: str, values: list) -> list[Option]:
    return [Option({key: v}) for v in dict.fromkeys(values) if v != current]


def precision(cfg: Config, facts: Facts) -> Dimension:
    key, cur = "precision.dtype", cfg.precision.dtype
    if facts.device == "cuda":
        order = (["bf16"] if facts.bf16 else ["fp16"]) + (["tf32"] if facts.tf32 else []) + ["fp32"]
        rejected = [({key: "bf16"}, f"{facts.gpu_name} does not support bf16")] if not facts.bf16 else []
        rejected += [] if facts.tf32 else [({key: "tf32"}, "TF32 needs compute capability 8.0 or newer")]
    elif facts.device == "cpu":
        order = (["bf16"] if facts.bf16 else []) + ["fp32"]
        rejected = [({key: "fp16"}, "fp16 with loss scaling needs CUDA"),
                    ({key: "tf32"}, "TF32 is an NVIDIA tensor-core mode")]
        if not facts.bf16:
            rejected.append(({key: "bf16"}, "this CPU has no native bf16 (no AVX512-BF16 or AMX): autocast to "
                                            "bf16 emulates it, slower than fp32"))
    else:  # xla: precision is the XLA backend's (trainperf/xla/env.py)
        order, rejected = [], [({key: "*"}, f"run.device={facts.device}: precision is set by the XLA backend")]
    return Dimension("precision", _others(cur, key, order), [r for r in rejected if r[0][key] != cur])


def micro_batch(cfg: Config, facts: Facts, dp: int) -> Dimension:
    key, cur = "train.micro_batch", cfg.train.micro_batch
    local = cfg.train.global_batch // dp
    divisors = [d for d in range(local, 0, -1) if local % d == 0]
    return Dimension("micro_batch", _others(min(cur, local), key, divisors), stop_when_slower=True)


def checkpointing(cfg: Config, facts: Facts) -> Dimension:
    ac = cfg.memory.checkpointing
    cur = {"memory.checkpointing.mode": ac.mode, **({"memory.checkpointing.ratio": ac.ratio} if ac.mode == "ratio" else {})}
    return Dimension("checkpointing", [Option(s) for s in CHECKPOINTING if s != cur], stop_after_first_ok=True)


def compile_(cfg: Config, facts: Facts, sharded: bool) -> Dimension:
    whole = {"compile.enabled": True, "compile.regional": False}
    regional = {"compile.enabled": True, "compile.regional": True}
    off = {"compile.enabled": False}
    c = cfg.compile
    cur = off if not c.enabled else (regional if c.regional else whole)
    options, rejected = [], []
    for s in (whole, regional, off):
        if s == cur:
            continue
        if s is whole and sharded:
            rejected.append((s, "one graph for the whole model cannot span FSDP2 / tensor / pipeline boundaries"))
        else:
            options.append(Option(s))
    return Dimension("compile", options, rejected)


def host_memory(cfg: Config, facts: Facts) -> Dimension:
    """CPU training: page faults on fresh activation memory every step (trainperf/hardware/hostmem.py)."""
    from trainperf.hardware.hostmem import supported

    key, cur = "run.host_memory", cfg.run.host_memory
    other = "retain" if cur == "release" else "release"
    if facts.device != "cpu":
        return Dimension("host_memory", [], [({key: other}, f"run.device={facts.device}: the step's tensors live in "
                                                           "device memory (PyTorch's caching allocator), not malloc's")])
    ok, lib = supported()
    if not ok and other == "retain":
        return Dimension("host_memory", [], [({key: other}, f"needs glibc's mallopt; this C library is {lib}")])
    return Dimension("host_memory", [Option({key: other})])


def loader(cfg: Config, facts: Facts) -> Dimension:
    return Dimension("data.loader", _others(cfg.data.loader, "data.loader", ["hybrid", "simple"]))


def _loader_only(name: str, key: str, cfg: Config, values: list) -> Dimension:
    if cfg.data.loader == "simple":
        return Dimension(name, [], [({key: v}, "with data.loader=simple (the best so far) batches are read "
                                                "in-process: no workers or prefetch ring to size")
                                    for v in dict.fromkeys(values) if v != get(cfg, key)])
    return Dimension(name, _others(get(cfg, key), key, values))


def num_workers(cfg: Config, facts: Facts) -> Dimension:
    per_rank = max(1, facts.cpus // max(1, facts.world_size))
    return _loader_only("data.num_workers", "data.num_workers", cfg, [0, max(1, per_rank // 2), per_rank])


def prefetch_depth(cfg: Config, facts: Facts) -> Dimension:
    return _loader_only("data.prefetch.depth", "data.prefetch.depth", cfg, [2, 4, 8])


def threads(cfg: Config, facts: Facts) -> Dimension:
    """CPU training: the intra-op thread count, a setting of the whole process (each trial has its
    own). Fewer threads than cores can win where cores are hyperthread siblings or loader workers
    need CPUs; with fewer than 4 CPUs per rank halving them halves the matmul throughput (x0.67
    measured on 2 cores), so it is not worth a trial there."""
    key, cur = "run.threads", cfg.run.threads
    if facts.device != "cpu":
        return Dimension("threads", [], [({key: "*"}, f"run.device={facts.device}: the step runs on the device")])
    per_rank = max(1, facts.cpus // max(1, facts.world_size))
    half = max(1, int(cur) // 2)
    if per_rank < 4 or half == cur:
        return Dimension("threads", [], [({key: half}, f"{per_rank} usable CPU(s) per rank: fewer threads than cores "
                                                       "only loses matmul throughput here (searched from 4 per rank)")])
    return Dimension("threads", [Option({key: half})])


def layouts(cfg: Config, facts: Facts, top: int = 3) -> Dimension:
    """Under torchrun: the ``top`` layouts the planner ranks fastest for this world size (its
    analytic cost model), as parallelism degrees + micro-batch + checkpointing."""
    from trainperf.models.shape import model_shape
    from trainperf.errors import UserError
    from trainperf.hardware.catalog import get_gpu, lookup_gpu
    from trainperf.planner.model import ModelSpec
    from trainperf.planner.search import search

    if cfg.model.entrypoint:
        return Dimension("layout", [], [({"parallelism": "*"}, "a user's model trains with data parallelism only")])
    s = model_shape(cfg)
    vocab = s["vocab_size"] if isinstance(s.get("vocab_size"), int) else 256
    spec = ModelSpec(hidden=s["n_embd"], layers=s["n_layer"], heads=s["n_head"], seq=s["block_size"], vocab=vocab,
                     name=cfg.model.preset)
    gpu = lookup_gpu(facts.gpu_name) if facts.device == "cuda" else None
    try:
        plan = search(spec, gpu or get_gpu("cpu"), facts.world_size, cfg.train.global_batch, explain_failure=False)
    except UserError as exc:
        return Dimension("layout", [], [({"parallelism": "*"}, f"the planner finds no layout: {exc}")])
    options, seen = [], set()
    for est in plan.candidates:
        lay = est.layout
        key = (lay.tp, lay.pp, lay.dp, lay.zero >= 3)
        if key in seen:
            continue
        seen.add(key)
        dp, shard = (1, lay.dp) if lay.zero >= 3 else (lay.dp, 1)
        mode = {"none": "none", "selective": "selective", "full": "full"}[lay.recompute]
        options.append(Option({"parallelism.data": dp, "parallelism.data_shard": shard, "parallelism.tensor": lay.tp,
                               "parallelism.pipeline": lay.pp, "train.micro_batch": lay.micro_batch,
                               "memory.checkpointing.mode": mode},
                              note=f"planner rank {len(options) + 1}: {lay.short()}"))
        if len(options) == top:
            break
    return Dimension("layout", options)


ORDER = ("layout", "precision", "host_memory", "compile", "micro_batch", "checkpointing", "data.loader",
         "data.num_workers", "data.prefetch.depth", "threads")  # the builders' fixed order (ties in tune/order.py)


def builders(facts: Facts) -> dict[str, Callable[[Config, int, bool], Dimension]]:
    """Each dimension's builder, by name: it takes (the current best config, resolved; its data degree;
    whether its layout is sharded) and returns the dimension around it. The search's order is
    :func:`trainperf.tune.order.plan`'s: the surest gains first."""
    dims: dict = {}
    if facts.world_size > 1:
        dims["layout"] = lambda c, dp, sh: layouts(c, facts)
    dims.update({
        "precision": lambda c, dp, sh: precision(c, facts),
        "host_memory": lambda c, dp, sh: host_memory(c, facts),
        "compile": lambda c, dp, sh: compile_(c, facts, sh),
        "micro_batch": lambda c, dp, sh: micro_batch(c, facts, dp),
        "checkpointing": lambda c, dp, sh: checkpointing(c, facts),
        "data.loader": lambda c, dp, sh: loader(c, facts),
        "data.num_workers": lambda c, dp, sh: num_workers(c, facts),
        "data.prefetch.depth": lambda c, dp, sh: prefetch_depth(c, facts),
        "threads": lambda c, dp, sh: threads(c, facts),
    })
    return dims

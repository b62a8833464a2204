"""Recommendations from a hardware probe, each with the reason that follows from the facts.

:func:`advise` takes the dict of :func:`trainperf.hardware.probe.probe` (or a hand-made one in
tests) and returns a list of :class:`Recommendation`. A setting is a config field
(``precision.dtype``), an environment variable (``NCCL_DEBUG``) or an action. Every environment
variable recommended here is in :data:`ENV_VARIABLES` with its documented meaning and where it
is documented: nothing outside that table is ever suggested. Two corrections to the founding
document (../shared/SEED.md) live here: ``NCCL_ALLTOALL_THRESHOLD`` is not an NCCL variable,
and ``NCCL_ASYNC_ERROR_HANDLING=0`` hides failures instead of fixing them.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from trainperf.hardware import cpu

GiB = 2**30
NCCL_DOCS = "NCCL User Guide, Environment Variables (docs.nvidia.com/deeplearning/nccl)"
TORCH_DOCS = "PyTorch docs, ProcessGroupNCCL Environment Variables (torch_nccl_environment_variables)"
TF32_DOCS = "NVIDIA, TensorFloat-32 / CUDA libraries documentation (NVIDIA_TF32_OVERRIDE)"

# Every environment variable this module may recommend, with its documented meaning.
ENV_VARIABLES: dict[str, dict[str, str]] = {
    "NCCL_DEBUG": {
        "meaning": "Debug output NCCL prints: VERSION (version at start), WARN (errors, with their "
        "cause), INFO (also the topology, transports and rings it chose), TRACE (every call).",
        "source": NCCL_DOCS,
    },
    "NCCL_DEBUG_SUBSYS": {
        "meaning": "Filters INFO output by subsystem, e.g. INIT,GRAPH,NET,ENV.",
        "source": NCCL_DOCS,
    },
    "NCCL_SOCKET_IFNAME": {
        "meaning": "Which IP interfaces NCCL uses for bootstrap and socket traffic: a list of name "
        "prefixes; '^' excludes, '=' matches exactly.",
        "source": NCCL_DOCS,
    },
    "NCCL_IB_HCA": {
        "meaning": "Which InfiniBand/RoCE HCAs (and ports) NCCL uses, e.g. mlx5_0:1,mlx5_1:1; "
        "by default it uses every one it finds.",
        "source": NCCL_DOCS,
    },
    "NCCL_P2P_DISABLE": {
        "meaning": "1 disables the peer-to-peer transport between GPUs (direct NVLink or PCIe "
        "access); traffic then goes through host shared memory.",
        "source": NCCL_DOCS,
    },
    "NCCL_P2P_LEVEL": {
        "meaning": "Largest topology distance (LOC, NVL, PIX, PXB, PHB, SYS) over which NCCL "
        "still uses P2P between GPUs.",
        "source": NCCL_DOCS,
    },
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": {
        "meaning": "What the watchdog does when a collective fails or times out: 0 nothing (the job "
        "can hang), 1 abort the communicator and tear down the process, 2 only abort the "
        "communicator, 3 tear down without aborting (the default in recent PyTorch).",
        "source": TORCH_DOCS,
    },
    "TORCH_NCCL_BLOCKING_WAIT": {
        "meaning": "1 makes work.wait() block the calling thread until the collective ends and "
        "raise when the process-group timeout passes; 0 (default) leaves waiting to the stream "
        "and timeouts to the watchdog.",
        "source": TORCH_DOCS,
    },
    "TORCH_NCCL_TRACE_BUFFER_SIZE": {
        "meaning": "Number of events kept in the flight recorder's ring buffer (0 disables it); "
        "each collective is recorded with its rank, sequence number and sizes.",
        "source": TORCH_DOCS,
    },
    "TORCH_NCCL_DUMP_ON_TIMEOUT": {
        "meaning": "1 dumps the flight recorder when the watchdog sees a timeout or an error; needs "
        "TORCH_NCCL_TRACE_BUFFER_SIZE > 0.",
        "source": TORCH_DOCS,
    },
    "OMP_NUM_THREADS": {
        "meaning": "Threads of each process's OpenMP pool (PyTorch's intra-op CPU threads): a whole number "
        ">= 1; torchrun sets 1 when it is unset.",
        "source": "OpenMP API specification, OMP_NUM_THREADS; PyTorch docs, torchrun",
    },
    "NCCL_IB_DISABLE": {
        "meaning": "1 stops NCCL from using InfiniBand/RoCE (it falls back to IP sockets); 0 (default) "
        "uses them.",
        "source": NCCL_DOCS,
    },
    "NVIDIA_TF32_OVERRIDE": {
        "meaning": "0 disables TF32 in cuBLAS/cuDNN whatever the framework asks; it does not "
        "select FP16 or any other precision.",
        "source": TF32_DOCS,
    },
}

_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# distributed.timeout_s: seconds before the watchdog declares a collective hung.
DEFAULT_TIMEOUT_S = 300
FLIGHT_RECORDER_EVENTS = 2000
PREFETCH_FACTOR = 3  # data.prefetch_factor default
ASSUMED_BATCH_BYTES = 64 * 2**20  # a guess for the /dev/shm estimate; stated in the reason


@dataclass
class Recommendation:
    id: str
    setting: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_env(self) -> bool:
        return bool(_ENV_NAME.match(self.setting))


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def _cc(gpu: dict) -> float | None:
    try:
        return float(gpu["compute_capability"])
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- precision


def precision_advice(facts: dict) -> list[Recommendation]:
    gpus = facts.get("gpus") or []
    env = facts.get("env") or {}
    out: list[Recommendation] = []
    if not gpus:
        native = (facts.get("cpu") or {}).get("bf16_native")
        out.append(Recommendation(
            "precision", "precision.dtype", "fp32",
            "no CUDA GPU: train in fp32 on the CPU; "
            + ("this CPU has native bf16 (AVX512-BF16/AMX), so bf16 autocast may be worth a measured try"
               if native else "this CPU has no native bf16 arithmetic, so bf16 autocast converts through fp32 and is usually no faster"),
        ))
        return out
    ccs = [c for c in (_cc(g) for g in gpus) if c is not None]
    lowest = min(ccs) if ccs else None
    names = sorted({g.get("name") or "?" for g in gpus})
    if lowest is not None and lowest >= 8.0:
        out.append(Recommendation(
            "precision", "precision.dtype", "bf16",
            f"every GPU ({', '.join(names)}) has compute capability >= 8.0: bf16 autocast runs on tensor "
            "cores with fp32's exponent range, so no loss scaling is needed",
        ))
        out.append(Recommendation(
            "tf32", "precision.dtype", "tf32 (only where fp32 is required)",
            "where a model must stay in fp32, choose TF32 explicitly (torch.set_float32_matmul_precision"
            "('high')): matmuls on tensor cores with a 10-bit mantissa. Make it a config choice, never "
            "a side effect of NVIDIA_TF32_OVERRIDE, which only switches TF32 off",
        ))
    elif lowest is not None and lowest >= 7.0:
        out.append(Recommendation(
            "precision", "precision.dtype", "fp16",
            f"lowest compute capability is {lowest:g} (< 8.0): no bf16 tensor cores; fp16 autocast with a "
            "GradScaler (dynamic loss scaling) keeps small gradients from flushing to zero",
        ))
    else:
        out.append(Recommendation(
            "precision", "precision.dtype", "fp32",
            f"lowest compute capability is {lowest if lowest is not None else 'unknown'}: no tensor cores "
            "for fp16/bf16, so mixed precision gains little",
        ))
    if "NVIDIA_TF32_OVERRIDE" in env:
        out.append(Recommendation(
            "tf32-override", "NVIDIA_TF32_OVERRIDE", "unset",
            f"it is set to {env['NVIDIA_TF32_OVERRIDE']!r}: it overrides the framework in cuBLAS/cuDNN "
            "behind trainperf's back (0 only disables TF32; it never forces FP16). Choose precision.dtype instead",
        ))
    return out


# ---------------------------------------------------------------- data loading


def loader_advice(facts: dict, batch_bytes: int = ASSUMED_BATCH_BYTES) -> list[Recommendation]:
    c = facts.get("cpu") or {}
    usable = int(c.get("usable") or 1)
    ranks = int(facts.get("local_ranks") or 1)
    workers = cpu.loader_workers(local_ranks=ranks, cpus=usable)
    doc_per_rank = min(32, 2 * usable)
    out = [Recommendation(
        "loader-workers", "data.num_workers", workers,
        f"{usable} usable CPUs ({c.get('usable_reason', 'affinity/cgroup')}) / {ranks} local rank(s), capped at 32. "
        f"The founding document's min(32, 2 x cores) would start {doc_per_rank} per rank, "
        f"{doc_per_rank * ranks} worker processes on {usable} CPUs"
        + (": oversubscribed" if doc_per_rank * ranks > usable else "")
        + (". Fewer CPUs than ranks: load in each rank's main process (0 workers)" if workers == 0 else ""),
    )]
    gpus = facts.get("gpus") or []
    out.append(Recommendation(
        "pin-memory", "data.pin_memory", bool(gpus),
        "page-locked batches let .to('cuda', non_blocking=True) copy while the GPU computes"
        if gpus else "no GPU to copy to: pinning only locks host memory",
    ))
    shm = facts.get("shm") or {}
    total = shm.get("total_bytes")
    if total is not None and workers > 0:
        need = ranks * workers * PREFETCH_FACTOR * batch_bytes
        need_gib = max(1, math.ceil(need / GiB))
        if shm.get("small") or total < need:
            docker = " (Docker's default is 64 MB)" if total <= 64 * 2**20 + 2**20 else ""
            out.append(Recommendation(
                "shm", "/dev/shm size", f">= {need_gib} GiB (docker run --shm-size={need_gib}g)",
                f"/dev/shm is {_gib(total)}{docker}; DataLoader workers hand every batch over through it: "
                f"{ranks} rank(s) x {workers} workers x prefetch {PREFETCH_FACTOR} x ~{batch_bytes // 2**20} MiB "
                f"per batch (an assumption: scale by your batch size) = {_gib(need)}. Too small gives "
                "'bus error' or 'No space left on device' in workers",
            ))
    return out


# ---------------------------------------------------------------- topology


def _max_clique(adj: list[list[bool]]) -> list[int]:
    n = len(adj)
    for size in range(n, 1, -1):
        if math.comb(n, size) > 200_000:  # far beyond one node's GPUs; give up quietly
            continue
        for group in itertools.combinations(range(n), size):
            if all(adj[a][b] for a, b in itertools.combinations(group, 2)):
                return list(group)
    return [0] if n else []


def _components(adj: list[list[bool]]) -> list[list[int]]:
    seen: set[int] = set()
    comps = []
    for start in range(len(adj)):
        if start in seen:
            continue
        stack, comp = [start], []
        seen.add(start)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j, linked in enumerate(adj[i]):
                if linked and j not in seen:
                    seen.add(j)
                    stack.append(j)
        comps.append(sorted(comp))
    return comps


def topology_advice(facts: dict) -> list[Recommendation]:
    gpus = facts.get("gpus") or []
    topo = facts.get("topology") or {}
    matrix = topo.get("matrix")
    out: list[Recommendation] = []
    n = len(gpus)
    if n < 2 or not matrix:
        return out
    if topo.get("source") != "nvml":
        out.append(Recommendation(
            "topology", "nvidia-ml-py", "install",
            "without NVML the link type between GPUs (NVLink or PCIe) is unknown; pip install "
            "'trainperf[gpu]' and run trainperf doctor again before choosing parallelism.tensor",
        ))
        return out
    adj = [[i != j and matrix[i][j].startswith("NV") for j in range(n)] for i in range(n)]
    pcie = sorted({matrix[i][j] for i in range(n) for j in range(n) if i != j and not adj[i][j]})
    clique = _max_clique(adj)
    if not any(any(row) for row in adj):
        out.append(Recommendation(
            "topology", "parallelism.tensor", 1,
            f"no NVLink between the {n} GPUs (paths: {', '.join(pcie)}): tensor parallelism all-reduces "
            "activations 4 times per layer and would cross PCIe" + (" and the CPU interconnect (SYS)" if "SYS" in pcie else "")
            + "; use data parallelism or FSDP (parallelism.data_shard) across these GPUs and keep tensor "
            "parallelism inside NVLink islands",
        ))
    elif len(clique) == n:
        links = min(int(matrix[i][j][2:]) for i in range(n) for j in range(n) if i != j)
        out.append(Recommendation(
            "topology", "parallelism.tensor", f"<= {n}",
            f"all {n} GPUs are linked pairwise over NVLink (at least NV{links}"
            + (", through NVSwitch" if topo.get("nvswitch") else "")
            + f"): fully connected, so tensor parallel groups of up to {n} GPUs stay on NVLink",
        ))
    else:
        islands = [c for c in _components(adj) if len(c) > 1]
        alone = [i for i in range(n) if not any(adj[i])]
        chained = [c for c in islands if not all(adj[a][b] for a, b in itertools.combinations(c, 2))]
        where = f"other pairs go over {', '.join(pcie) or 'PCIe'}"
        if chained:
            reason = (
                f"NVLink joins some GPU pairs but not all (islands {islands}, not fully connected: a daisy "
                f"chain or partial mesh); the largest fully connected group is GPUs {clique}; {where}. Place "
                "each tensor parallel group on a fully connected group and run data parallelism between "
                "groups: the founding document measured a fully connected 4-GPU group beating an 8-GPU "
                "daisy chain by 27% on ResNet-50"
            )
        else:
            reason = (
                f"NVLink islands {islands}, each fully connected"
                + (f"; GPUs {alone} have no NVLink" if alone else "")
                + f"; {where}. Keep each tensor parallel group inside one island and run data "
                "parallelism (or FSDP) between islands"
            )
        out.append(Recommendation("topology", "parallelism.tensor", f"<= {len(clique)}", reason))
    numa = sorted({g["numa_node"] for g in gpus if g.get("numa_node") is not None})
    if len(numa) > 1:
        per_node = {node: [g["index"] for g in gpus if g.get("numa_node") == node] for node in numa}
        out.append(Recommendation(
            "numa", "CPU/memory binding per rank", "the GPU's NUMA node (numactl --cpunodebind=N --membind=N)",
            f"GPUs sit on {len(numa)} NUMA nodes ({'; '.join(f'node {k}: GPUs {v}' for k, v in per_node.items())}); "
            "a rank whose loader runs on the other socket copies every batch across the CPU interconnect",
        ))
    return out


# ---------------------------------------------------------------- NCCL and failures


def nccl_advice(facts: dict) -> list[Recommendation]:
    gpus = facts.get("gpus") or []
    env = facts.get("env") or {}
    nics = facts.get("nics") or {}
    if not gpus:
        return []  # no NCCL on a CPU-only machine: gloo carries the collectives
    out = [Recommendation(
        "nccl-debug", "NCCL_DEBUG", "WARN",
        "prints the cause of an NCCL failure instead of a bare error; switch to INFO (with "
        "NCCL_DEBUG_SUBSYS=INIT,GRAPH) for one run to see the topology and transports NCCL chose",
    )]
    up = [i["name"] for i in nics.get("net", []) if i.get("physical") and i.get("state") == "up"]
    if len(up) > 1:
        pick = nics.get("default_route") if nics.get("default_route") in up else up[0]
        out.append(Recommendation(
            "nccl-socket-ifname", "NCCL_SOCKET_IFNAME", pick,
            f"{len(up)} network interfaces are up ({', '.join(up)}); across nodes NCCL must use one that "
            f"reaches the other nodes ({pick} carries the default route; use your cluster's fabric interface if different)",
        ))
    hcas = [h["name"] for h in nics.get("infiniband", [])]
    if len(hcas) > 1:
        out.append(Recommendation(
            "nccl-ib-hca", "NCCL_IB_HCA", ",".join(hcas),
            f"{len(hcas)} InfiniBand/RoCE HCAs; NCCL uses all it finds by default: list only the ones on "
            "the training fabric (ideally one per GPU, on the GPU's NUMA node)",
        ))
    if len(gpus) > 1:
        out.append(Recommendation(
            "nccl-p2p-disable", "NCCL_P2P_DISABLE", "1 (diagnosis only)",
            "if a multi-GPU job hangs or returns wrong results, one run with NCCL_P2P_DISABLE=1 tells "
            "whether GPU peer-to-peer (often blocked by PCIe ACS or IOMMU settings) is the cause; do not "
            "leave it set: collectives then go through host memory and slow down",
        ))
    current = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", env.get("NCCL_ASYNC_ERROR_HANDLING"))
    out.append(Recommendation(
        "nccl-async-error-handling", "TORCH_NCCL_ASYNC_ERROR_HANDLING", 1,
        ("it is set to 0 now: a failed or stuck collective then leaves every rank hanging. " if current == "0" else "")
        + "1 aborts the communicator and ends the process when a collective fails or passes its timeout, "
        "so the launcher sees the failure and the job restarts from its last checkpoint. Never 0: "
        "hiding the error (the founding document's NCCL_ASYNC_ERROR_HANDLING=0) trades a crash for a hang",
    ))
    out.append(Recommendation(
        "nccl-blocking-wait", "TORCH_NCCL_BLOCKING_WAIT", 0,
        "leave at 0: with async error handling the watchdog enforces the timeout without stalling the "
        "CPU; 1 makes every wait() block and raise in the calling thread, useful only to locate a hang while debugging",
    ))
    out.append(Recommendation(
        "nccl-timeout", "distributed.timeout_s", DEFAULT_TIMEOUT_S,
        "the process-group timeout after which the watchdog declares a collective hung; PyTorch's NCCL "
        "default is 10 minutes. Keep it longer than your slowest legitimate step (checkpoint save, first "
        "compile) and short enough to fail fast",
    ))
    out.append(Recommendation(
        "nccl-flight-recorder", "TORCH_NCCL_TRACE_BUFFER_SIZE", FLIGHT_RECORDER_EVENTS,
        "keeps the last collectives of each rank (sequence number, op, sizes) so a timeout report says "
        "which rank stopped in which collective",
    ))
    out.append(Recommendation(
        "nccl-dump-on-timeout", "TORCH_NCCL_DUMP_ON_TIMEOUT", 1,
        "writes that flight-recorder trace when the watchdog fires (needs TORCH_NCCL_TRACE_BUFFER_SIZE > 0)",
    ))
    return out


def compile_advice(facts: dict) -> list[Recommendation]:
    comp = (facts.get("software") or {}).get("compile") or {}
    if comp and not comp.get("available"):
        return [Recommendation("compile", "compile.enabled", False, f"torch.compile cannot work here: {comp.get('reason')}")]
    return []


def env_advice(facts: dict) -> list[Recommendation]:
    """Environment variables already set to a value their program cannot use (a typo'd interface name, a
    negative thread count): each is named with what it holds and what it takes."""
    env = facts.get("env") or {}
    out = []
    omp = env.get("OMP_NUM_THREADS")
    if omp is not None and not (str(omp).strip().isdigit() and int(str(omp).strip()) >= 1):
        out.append(Recommendation(
            "omp-num-threads", "OMP_NUM_THREADS", "a whole number >= 1 (usable CPUs / local ranks), or unset",
            f"it is set to {omp!r}, which is not a thread count: OpenMP ignores it or stops; unset it or give "
            "a whole number"))
    ib = env.get("NCCL_IB_DISABLE")
    if ib is not None and str(ib).strip() not in ("0", "1"):
        out.append(Recommendation(
            "nccl-ib-disable", "NCCL_IB_DISABLE", "0 or 1 (or unset)",
            f"it is set to {ib!r}: NCCL reads it as a number, so whether InfiniBand is used is not what it "
            "says; use 1 to disable InfiniBand/RoCE, 0 or unset to use them"))
    ifname = env.get("NCCL_SOCKET_IFNAME")
    names = [i.get("name") for i in ((facts.get("nics") or {}).get("net") or []) if i.get("name")]
    if ifname and names:
        text = str(ifname)
        exclude, exact = text.startswith("^"), text.lstrip("^").startswith("=")
        wanted = [w for w in text.lstrip("^").lstrip("=").split(",") if w]
        hits = [n for n in names if any((n == w) if exact else n.startswith(w) for w in wanted)]
        if not exclude and not hits:
            out.append(Recommendation(
                "nccl-socket-ifname-missing", "NCCL_SOCKET_IFNAME", f"one of {', '.join(names)}",
                f"it is set to {text!r}, which matches none of this machine's interfaces ({', '.join(names)}): "
                "NCCL would find no interface to bootstrap on and fail at init"))
    return out


def advise(facts: dict) -> list[Recommendation]:
    """All recommendations for a probed machine, in the order a user should read them."""
    # tests/unit/test_doctor.py checks every environment variable here against ENV_VARIABLES.
    return (env_advice(facts) + precision_advice(facts) + loader_advice(facts) + topology_advice(facts)
            + nccl_advice(facts) + compile_advice(facts))

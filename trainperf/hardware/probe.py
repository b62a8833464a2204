"""What this machine is: host, CPUs, memory, /dev/shm, software stack, GPUs and their topology.

:func:`probe` returns a plain, JSON-serialisable dict; ``trainperf doctor`` prints it and
:mod:`trainperf.hardware.advice` turns it into recommendations. Every part degrades on its own:
no NVML means GPUs come from torch.cuda, no GPU means an empty list, an unreadable file
means ``None`` for that field, never an exception.

GPU facts come from NVML (``nvidia-ml-py``) when it is installed and a driver answers, so the
probe does not create a CUDA context; otherwise from ``torch.cuda``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
import socket
import sys
from typing import Any

from trainperf.hardware import cpu

GiB = 2**30
# Docker gives containers a 64 MB /dev/shm unless started with --shm-size; DataLoader workers
# pass every batch through it, so anything under this is reported as small.
SHM_SMALL_BYTES = 1 * GiB

OPTIONAL_PACKAGES = ["nvidia-ml-py", "tensorboard", "matplotlib", "torch_xla", "triton"]

# Environment variables worth showing in a bug report (their values change behaviour).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS",
                "LOCAL_WORLD_SIZE", "WORLD_SIZE", "PYTORCH_CUDA_ALLOC_CONF")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _parse_cpulist(text: str | None) -> list[int]:
    """'0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11]."""
    cpus: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return cpus


# ---------------------------------------------------------------- host, CPU, memory


def host_facts() -> dict[str, Any]:
    os_name = None
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip('"')
    return {
        "hostname": socket.gethostname(),
        "os": os_name or platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
    }


def cpu_facts() -> dict[str, Any]:
    model = None
    flags: set[str] = set()
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key = line.lower()
        if model is None and key.startswith(("model name", "hardware")):  # x86, some ARM
            model = line.split(":", 1)[1].strip()
        elif not flags and key.startswith(("flags", "features")):
            flags = set(line.split(":", 1)[1].split())
        if model is not None and flags:
            break
    logical = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = logical
    quota = cpu._cgroup_cpu_limit()
    usable = cpu.usable_cpus()
    reasons = []
    if affinity < logical:
        reasons.append(f"affinity mask allows {affinity} of {logical}")
    if quota is not None:
        reasons.append(f"cgroup CPU quota {quota:g} CPUs")
    nodes = []
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*"), key=lambda p: int(p.rsplit("node", 1)[1])):
        cpus = _parse_cpulist(_read(os.path.join(path, "cpulist")))
        nodes.append({"id": int(path.rsplit("node", 1)[1]), "cpus": len(cpus)})
    return {
        "model": model or platform.processor() or None,
        "logical": logical,
        "affinity": affinity,
        "cgroup_quota": quota,
        "usable": usable,
        "usable_reason": "; ".join(reasons) or "no affinity mask or cgroup quota: all logical CPUs",
        "numa_nodes": nodes,
        # Native bf16 arithmetic on the CPU (AVX512-BF16 or AMX): bf16 autocast pays off there.
        "bf16_native": bool(flags & {"avx512_bf16", "amx_bf16"}),
    }


def memory_facts() -> dict[str, Any]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_bytes": vm.total, "available_bytes": vm.available}
    except Exception:  # psutil missing or unsupported platform
        return {"total_bytes": None, "available_bytes": None}


def shm_facts(path: str = "/dev/shm") -> dict[str, Any]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return {"path": path, "total_bytes": None, "free_bytes": None, "small": None}
    return {
        "path": path,
        "total_bytes": usage.total,
        "free_bytes": usage.free,
        "small": usage.total < SHM_SMALL_BYTES,
    }


# ---------------------------------------------------------------- software


def package_versions(names: list[str] = OPTIONAL_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def software_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "python_executable": sys.executable}
    try:
        import torch
    except ImportError:
        facts.update(torch=None, cuda=None, cudnn=None, nccl=None, backends={}, compile={"available": False,
                     "reason": "torch is not installed"})
        return facts
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda  # None on a CPU build
    facts["cuda_available"] = torch.cuda.is_available()
    cudnn = None
    try:
        if torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
    except Exception:
        pass
    facts["cudnn"] = cudnn
    backends = {"gloo": False, "nccl": False, "mpi": False}
    nccl = None
    try:
        import torch.distributed as dist

        if dist.is_available():
            backends = {
                "gloo": dist.is_gloo_available(),
                "nccl": dist.is_nccl_available(),
                "mpi": dist.is_mpi_available(),
            }
    except Exception:
        pass
    if backends["nccl"]:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            nccl = None
    facts["nccl"] = nccl
    facts["backends"] = backends
    facts["compile"] = compile_facts(torch)
    return facts


def compile_facts(torch) -> dict[str, Any]:
    """Whether torch.compile (inductor) can work here: it needs a C++ compiler for CPU code and
    Triton for CUDA kernels."""
    cxx = os.environ.get("CXX") or next(
        (c for c in ("g++", "c++", "clang++") if shutil.which(c)), None
    )
    cxx_path = shutil.which(cxx) if cxx else None
    triton = package_versions(["triton"])["triton"]
    if not hasattr(torch, "compile"):
        return {"available": False, "cxx": cxx_path, "triton": triton, "reason": "this torch has no torch.compile"}
    if cxx_path is None:
        return {"available": False, "cxx": None, "triton": triton,
                "reason": "no C++ compiler found (g++/c++/clang++ or $CXX); inductor needs one"}
    if torch.cuda.is_available() and triton is None:
        return {"available": False, "cxx": cxx_path, "triton": None,
                "reason": "Triton is not installed; inductor needs it for CUDA kernels"}
    return {"available": True, "cxx": cxx_path, "triton": triton, "reason": "C++ compiler present"
            + (" and Triton installed" if triton else "")}


def env_facts(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


# ---------------------------------------------------------------- network


def _default_route_interface() -> str | None:
    for line in (_read("/proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def nic_facts(sys_root: str = "/sys/class") -> dict[str, Any]:
    """InfiniBand HCAs and network interfaces (physical ones have a ``device`` link)."""
    ib = []
    for path in sorted(glob.glob(os.path.join(sys_root, "infiniband", "*"))):
        numa = _read(os.path.join(path, "device", "numa_node"))
        ib.append({"name": os.path.basename(path), "numa_node": int(numa) if numa and numa.lstrip("-").isdigit()
                   and int(numa) >= 0 else None})
    net = []
    for path in sorted(glob.glob(os.path.join(sys_root, "net", "*"))):
        name = os.path.basename(path)
        if name == "lo":
            continue
        speed = _read(os.path.join(path, "speed"))
        numa = _read(os.path.join(path, "device", "numa_node"))
        net.append({
            "name": name,
            "state": _read(os.path.join(path, "operstate")),
            "physical": os.path.exists(os.path.join(path, "device")),
            "speed_mbps": int(speed) if speed and speed.isdigit() else None,
            "numa_node": int(numa) if numa and numa.isdigit() else None,
        })
    return {"infiniband": ib, "net": net, "default_route": _default_route_interface()}


# ---------------------------------------------------------------- GPUs


def _catalog_peak(name: str | None) -> tuple[str, float] | None:
    """(16-bit dtype, dense peak in TFLOP/s) from trainperf.hardware.catalog when that module exists:
    BF16, or FP16 on a part without BF16 tensor cores (V100)."""
    if not name:
        return None
    try:
        from trainperf.hardware.catalog import lookup_gpu
    except ImportError:
        return None
    try:
        entry = lookup_gpu(name)
    except Exception:
        return None
    if entry is None:
        return None
    try:
        return entry.half_dtype, float(entry.half_tflops)
    except Exception:  # noqa: BLE001 - a catalog entry without a 16-bit peak
        return None


def _nvml_gpus() -> tuple[list[dict], dict, dict]:
    from trainperf.hardware import nvml

    with nvml.session():
        hs = nvml.handles()
        gpus = []
        for i, h in enumerate(hs):
            info = {"index": i, **nvml.device_info(h)}
            gpus.append(info)
        topo = nvml.topology(hs, [g["pci_bus_id"] for g in gpus]) if len(hs) > 1 else {}
        drv = nvml.driver()
    return gpus, topo, drv


def _torch_gpus() -> tuple[list[dict], dict]:
    try:
        import torch
    except ImportError:
        return [], {}
    if not torch.cuda.is_available():
        return [], {}
    gpus = []
    n = torch.cuda.device_count()
    for i in range(n):
        props = torch.cuda.get_device_properties(i)
        major, minor = props.major, props.minor
        used = None
        try:
            free, total = torch.cuda.mem_get_info(i)
            used = total - free
        except Exception:
            pass
        gpus.append({
            "index": i, "name": props.name, "memory_total_bytes": props.total_memory,
            "memory_used_bytes": used, "compute_capability": f"{major}.{minor}",
            "bf16": major >= 8, "tf32": major >= 8,
        })
    topo = {}
    if n > 1:
        # Without NVML the link type is unknown; peer access only says P2P works.
        matrix = [["X" if i == j else ("P2P" if torch.cuda.can_device_access_peer(i, j) else "-")
                   for j in range(n)] for i in range(n)]
        topo = {"labels": [f"GPU{i}" for i in range(n)], "matrix": matrix, "source": "torch"}
    return gpus, topo


def gpu_facts() -> dict[str, Any]:
    """GPUs, topology and driver: NVML first, torch.cuda when NVML is absent or fails."""
    from trainperf.hardware.nvml import NvmlUnavailable

    note = None
    try:
        gpus, topo, drv = _nvml_gpus()
        source = "nvml"
    except NvmlUnavailable as exc:
        note = str(exc)
        gpus, topo = _torch_gpus()
        drv = {}
        source = "torch.cuda" if gpus else "none"
    for g in gpus:
        peak = _catalog_peak(g.get("name"))
        if peak is not None:
            g[f"{peak[0]}_dense_tflops"] = peak[1]
    return {"gpus": gpus, "topology": topo, "driver": drv, "source": source, "nvml_note": note}


# ---------------------------------------------------------------- all of it


def probe() -> dict[str, Any]:
    """Everything trainperf knows about this machine, as a JSON-serialisable dict."""
    gpu = gpu_facts()
    return {
        "host": host_facts(),
        "cpu": cpu_facts(),
        "memory": memory_facts(),
        "shm": shm_facts(),
        "software": software_facts(),
        "packages": package_versions(),
        "env": env_facts(),
        "nics": nic_facts(),
        "local_ranks": cpu.local_world_size() if "LOCAL_WORLD_SIZE" in os.environ else max(1, len(gpu["gpus"])),
        **gpu,
    }

"""A thin adapter over NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package).

Optional: ``pip install 'trainperf[gpu]'``. ``pynvml`` is imported inside the
functions, so the rest of trainperf works without it; :func:`init` raises
:class:`NvmlUnavailable` with a message saying why (package missing, driver missing).

Used by the hardware probe (device facts, topology) and by the monitor's sampler
(:func:`sample`). Every reading that a device or driver may not support comes back
as ``None`` instead of raising.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

# NVML's nvmlGpuTopologyLevel_t, named as `nvidia-smi topo -m` prints them.
TOPOLOGY_LEVELS = {
    0: "X",  # NVML_TOPOLOGY_INTERNAL: same board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: at most one PCIe bridge
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several PCIe bridges, no host bridge
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE: through a PCIe host bridge
    40: "NODE",  # NVML_TOPOLOGY_NODE: host bridges within one NUMA node
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across NUMA nodes (SMP interconnect, e.g. QPI/UPI)
}
NVLINK_DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
_CLOCK_SM = 1  # NVML_CLOCK_SM
_CLOCK_MEM = 2  # NVML_CLOCK_MEM
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU

INSTALL_HINT = "install the optional NVML binding: pip install 'trainperf[gpu]' (package nvidia-ml-py)"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why and what to do."""


def _nv():
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"pynvml is not installed; {INSTALL_HINT}") from exc
    return pynvml


def _errors(nv) -> tuple[type[BaseException], ...]:
    err = getattr(nv, "NVMLError", None)
    # AttributeError: a function this pynvml version does not have.
    return (err, AttributeError) if isinstance(err, type) else (AttributeError,)


def _try(fn_name: str, *args: Any) -> Any:
    """Call ``pynvml.<fn_name>(*args)``; None when the function, device or driver lacks it."""
    nv = _nv()
    try:
        return getattr(nv, fn_name)(*args)
    except _errors(nv):
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: Any) -> str:
    """'00000000:07:00.0' and '0000:07:00.0' are the same device; give both as '0000:07:00.0'."""
    text = (_text(bus_id) or "").strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            pass
    return text


def init():
    """Initialise NVML and return the pynvml module; raises NvmlUnavailable with the reason."""
    nv = _nv()
    try:
        nv.nvmlInit()
    except _errors(nv) as exc:
        raise NvmlUnavailable(
            f"NVML could not start ({exc}); no NVIDIA driver is loaded, or this container was "
            "started without GPU access"
        ) from exc
    return nv


def shutdown() -> None:
    with contextlib.suppress(Exception):
        _nv().nvmlShutdown()


@contextlib.contextmanager
def session() -> Iterator[Any]:
    """``with nvml.session() as nv:`` initialise NVML for the block, shut it down after."""
    nv = init()
    try:
        yield nv
    finally:
        shutdown()


def handles() -> list[Any]:
    """One handle per GPU NVML sees; raises NvmlUnavailable when it cannot list them."""
    nv = _nv()
    try:
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    except _errors(nv) as exc:
        raise NvmlUnavailable(f"NVML could not list the GPUs ({exc})") from exc


def driver() -> dict[str, Any]:
    cuda = _try("nvmlSystemGetCudaDriverVersion")  # e.g. 12040
    return {
        "driver_version": _text(_try("nvmlSystemGetDriverVersion")),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        "nvml_version": _text(_try("nvmlSystemGetNVMLVersion")),
    }


def bus_id(handle) -> str | None:
    pci = _try("nvmlDeviceGetPciInfo", handle)
    return normalize_bus_id(pci.busId) if pci is not None else None


def _numa_node(handle, pci_bus_id: str | None) -> int | None:
    for fn in ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNUMANodeId"):
        node = _try(fn, handle)
        if isinstance(node, int) and node >= 0:
            return node
    if pci_bus_id:  # the kernel knows it too
        try:
            with open(f"/sys/bus/pci/devices/{pci_bus_id}/numa_node") as f:
                node = int(f.read())
            return node if node >= 0 else None
        except (OSError, ValueError):
            pass
    return None


def device_info(handle) -> dict[str, Any]:
    """Static facts about one GPU: name, memory, compute capability, clocks, power, PCIe."""
    mem = _try("nvmlDeviceGetMemoryInfo", handle)
    cc = _try("nvmlDeviceGetCudaComputeCapability", handle)
    major, minor = (int(cc[0]), int(cc[1])) if cc else (None, None)
    power_mw = _try("nvmlDeviceGetPowerManagementLimit", handle)
    pci_bus_id = bus_id(handle)
    return {
        "name": _text(_try("nvmlDeviceGetName", handle)),
        "uuid": _text(_try("nvmlDeviceGetUUID", handle)),
        "pci_bus_id": pci_bus_id,
        "memory_total_bytes": mem.total if mem is not None else None,
        "memory_used_bytes": mem.used if mem is not None else None,
        "compute_capability": f"{major}.{minor}" if major is not None else None,
        "bf16": major >= 8 if major is not None else None,
        "tf32": major >= 8 if major is not None else None,
        "sm_clock_mhz": _try("nvmlDeviceGetClockInfo", handle, _CLOCK_SM),
        "sm_clock_max_mhz": _try("nvmlDeviceGetMaxClockInfo", handle, _CLOCK_SM),
        "mem_clock_mhz": _try("nvmlDeviceGetClockInfo", handle, _CLOCK_MEM),
        "mem_clock_max_mhz": _try("nvmlDeviceGetMaxClockInfo", handle, _CLOCK_MEM),
        "power_limit_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        "pcie_gen": _try("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": _try("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width": _try("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": _try("nvmlDeviceGetMaxPcieLinkWidth", handle),
        "numa_node": _numa_node(handle, pci_bus_id),
    }


def nvlinks(handle) -> list[dict[str, Any]]:
    """Active NVLink links of one GPU: [{"link", "remote_bus_id", "to_switch"}]."""
    nv = _nv()
    max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    enabled = getattr(nv, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
    switch = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", NVLINK_DEVICE_TYPE_SWITCH)
    links = []
    for link in range(max_links):
        if _try("nvmlDeviceGetNvLinkState", handle, link) != enabled:
            continue  # inactive, or no such link on this GPU
        remote = _try("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link)
        if remote is None:
            remote = _try("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        kind = _try("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        links.append(
            {
                "link": link,
                "remote_bus_id": normalize_bus_id(remote.busId) if remote is not None else None,
                "to_switch": kind == switch,
            }
        )
    return links


def topology(hs: list[Any], bus_ids: list[str | None]) -> dict[str, Any]:
    """The GPU-to-GPU matrix of ``nvidia-smi topo -m``: ``NV#`` (# NVLink links) where GPUs are
    joined by NVLink, directly or through NVSwitch, else the PCIe path level (PIX/PXB/PHB/NODE/SYS)."""
    n = len(hs)
    index = {b: i for i, b in enumerate(bus_ids) if b}
    counts = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    for i, h in enumerate(hs):
        for link in nvlinks(h):
            if link["to_switch"]:
                switch_links[i] += 1
            elif link["remote_bus_id"] in index and index[link["remote_bus_id"]] != i:
                counts[i][index[link["remote_bus_id"]]] += 1
    for i in range(n):
        for j in range(n):
            if i != j and switch_links[i] and switch_links[j]:  # NVSwitch: every GPU reaches every GPU
                counts[i][j] += min(switch_links[i], switch_links[j])
    matrix = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            links = max(counts[i][j], counts[j][i])
            if links:
                matrix[i][j] = f"NV{links}"
            else:
                level = _try("nvmlDeviceGetTopologyCommonAncestor", hs[i], hs[j])
                matrix[i][j] = TOPOLOGY_LEVELS.get(level, "?") if level is not None else "?"
    return {
        "labels": [f"GPU{i}" for i in range(n)],
        "matrix": matrix,
        "nvlink_counts": [[max(counts[i][j], counts[j][i]) if i != j else 0 for j in range(n)] for i in range(n)],
        "nvswitch": any(switch_links),
        "source": "nvml",
    }


def sample(handle) -> dict[str, Any]:
    """One monitoring reading of a GPU (NVML must be initialised).

    ``gpu_util_pct`` is NVML's "GPU utilization": the percent of time one or more kernels ran
    (kernel-busy time, not efficiency). ``mem_copy_util_pct`` is the percent of time device memory
    was read or written."""
    util = _try("nvmlDeviceGetUtilizationRates", handle)
    mem = _try("nvmlDeviceGetMemoryInfo", handle)
    power_mw = _try("nvmlDeviceGetPowerUsage", handle)
    return {
        "gpu_util_pct": util.gpu if util is not None else None,
        "mem_copy_util_pct": util.memory if util is not None else None,
        "power_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        "sm_clock_mhz": _try("nvmlDeviceGetClockInfo", handle, _CLOCK_SM),
        "memory_used_bytes": mem.used if mem is not None else None,
        "temperature_c": _try("nvmlDeviceGetTemperature", handle, _TEMPERATURE_GPU),
    }

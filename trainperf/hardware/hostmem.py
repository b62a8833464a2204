"""How the process's C allocator returns freed host memory: ``run.host_memory``.

On Linux, glibc's malloc serves a large block (above ``M_MMAP_THRESHOLD``: 128 KiB at start,
raised dynamically up to 32 MiB) with a fresh ``mmap`` and unmaps it when freed, and it trims
the top of the heap back to the kernel once more than ``M_TRIM_THRESHOLD`` is free there. A
training step on the CPU allocates and frees its activations and gradients (MiB each) every
step, so every step takes thousands of page faults, each handing the process a new zeroed page
(``trainperf tune`` records the minor faults per step of each candidate).

``retain`` sets both thresholds to 1 GiB through ``mallopt``: freed blocks stay in the heap and
the next step reuses pages already mapped. The cost: the process keeps its peak resident memory
instead of giving it back between steps (it reaches that peak every step anyway), which matters
where other jobs share the host. This is what a preloaded jemalloc or tcmalloc buys CPU training
(PyTorch's ``torch.backends.xeon.run_cpu`` launcher preloads them), without a preload. It is a
setting of the whole process, applied once; it cannot be undone in that process.
"""

from __future__ import annotations

import platform

from trainperf.errors import ConfigError

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
RETAIN_BYTES = 1 << 30

_applied: str | None = None


def supported() -> tuple[bool, str]:
    """(whether ``retain`` can apply here, the C library named)."""
    lib, ver = platform.libc_ver()
    return lib == "glibc", f"{lib or 'unknown'} {ver}".strip()


def check(mode: str) -> None:
    """ConfigError when ``mode`` cannot apply on this platform."""
    ok, lib = supported()
    if mode == "retain" and not ok:
        raise ConfigError(f"run.host_memory=retain sets glibc malloc's thresholds (mallopt), but this process's C "
                          f"library is {lib}: set run.host_memory=release, or preload jemalloc/tcmalloc instead")


def apply(mode: str) -> str | None:
    """Apply ``mode`` to this process; a note saying what was set (None for ``release``)."""
    global _applied
    if mode == "release":
        return None
    check(mode)
    if _applied != mode:
        import ctypes

        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_THRESHOLD, RETAIN_BYTES) == 1 and libc.mallopt(M_TRIM_THRESHOLD, RETAIN_BYTES) == 1
        if not ok:
            raise ConfigError("run.host_memory=retain: glibc's mallopt refused the 1 GiB thresholds: "
                              "set run.host_memory=release")
        _applied = mode
    return ("retain: glibc malloc keeps freed blocks below 1 GiB mapped (mallopt M_MMAP_THRESHOLD and "
            "M_TRIM_THRESHOLD = 1 GiB): steps reuse mapped pages; the process keeps its peak resident memory")

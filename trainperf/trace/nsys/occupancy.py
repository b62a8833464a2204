"""Kineto's two per-kernel estimates, from a kernel's launch parameters, so an Nsight Systems capture gives
the same ``blocks per SM`` and ``est. achieved occupancy %`` a torch.profiler trace of the same kernel has.

Kineto (``libkineto/src/DeviceProperties.cpp``) computes, per kernel:

* ``blocks per SM`` = grid size (gridX*gridY*gridZ) / the device's SM count;
* ``est. achieved occupancy %`` = round(100 * min(active blocks per SM, blocks per SM) * block size /
  max threads per SM), where "active blocks per SM" is CUDA's occupancy calculator
  (``cudaOccMaxActiveBlocksPerMultiprocessor`` in ``cuda_occupancy.h``) fed the kernel's registers per
  thread, static shared memory, block size and dynamic shared memory, with the function's default shared
  memory limit (no opt-in): the minimum of the limits set by warps, registers (allocated per warp in units
  of 256, across 4 sub-partitions), shared memory (allocated in units of 128 B on 8.x+, 256 B before, plus
  1 KB the driver reserves per block on 8.x+) and the architecture's blocks per SM. A block above the
  default 48 KB of shared memory gets 0 (Kineto's figure for such kernels too; the figures treat 0 as
  "not estimated").

So this is a *theoretical* occupancy capped by the grid, not a measured one: the measured counterpart is
nsys's ``GPU_METRICS`` (see :mod:`trainperf.trace.nsys.metrics`). The device limits come from the export's
``TARGET_INFO_GPU`` when it has them, else from the compute capability's published limits (CUDA C
Programming Guide, "Compute Capabilities" table) below.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# compute capability -> (max threads per SM, max blocks per SM, shared memory per SM in bytes)
CC_LIMITS: dict[tuple[int, int], tuple[int, int, int]] = {
    (6, 0): (2048, 32, 65536), (6, 1): (2048, 32, 98304), (7, 0): (2048, 32, 98304), (7, 2): (2048, 32, 98304),
    (7, 5): (1024, 16, 65536), (8, 0): (2048, 32, 167936), (8, 6): (1536, 16, 102400), (8, 7): (2048, 16, 167936),
    (8, 9): (1536, 24, 102400), (9, 0): (2048, 32, 233472), (10, 0): (2048, 32, 233472),
    (10, 3): (2048, 32, 233472), (12, 0): (1536, 24, 102400),
}
# shared-memory carveouts (KB) a Volta-or-later SM can be configured to: an SM's capacity rounds up to one
_CARVEOUTS_KB = {7: (0, 8, 16, 32, 64, 96), 8: (0, 8, 16, 32, 64, 100, 132, 164),
                 9: (0, 8, 16, 32, 64, 100, 132, 164, 196, 228), 10: (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
                 12: (0, 8, 16, 32, 64, 100)}
_INT_MAX = np.iinfo(np.int64).max // 4


def limits(cc: tuple[int, int] | None, num_sms: int | None, override: dict[str, Any] | None = None
           ) -> dict[str, Any] | None:
    """The device limits the estimate needs, or None when the compute capability is unknown. ``override``:
    values the capture recorded (TARGET_INFO_GPU), which win over the table."""
    if cc is None:
        return None
    major, minor = cc
    base = CC_LIMITS.get((major, minor)) or next((v for (a, _), v in sorted(CC_LIMITS.items()) if a == major), None)
    if base is None:
        return None
    out = {"cc": (major, minor), "num_sms": num_sms, "threads_per_sm": base[0], "blocks_per_sm": base[1],
           "smem_per_sm": base[2], "smem_per_block": 49152, "threads_per_block": 1024, "regs_per_block": 65536,
           "regs_per_sm": 65536, "warp_size": 32, "reserved_smem": 1024 if major >= 8 else 0,
           "from": "compute capability table"}
    for k, v in (override or {}).items():
        if v is not None and v > 0:
            out[k] = int(v)
            out["from"] = "capture (TARGET_INFO_GPU)"
    return out


def _round_up(x: np.ndarray, unit: int) -> np.ndarray:
    return -(-x // unit) * unit


def _carveout(size: int, major: int) -> int:
    """An SM's shared memory rounded up to the next carveout the architecture offers (as the calculator does)."""
    for kb in _CARVEOUTS_KB.get(major, ()):
        if size <= kb * 1024:
            return kb * 1024
    return size


def active_blocks(block: np.ndarray, regs: np.ndarray, smem_static: np.ndarray, smem_dynamic: np.ndarray,
                  lim: dict[str, Any]) -> np.ndarray:
    """CUDA's occupancy calculator: resident blocks per SM, per kernel (int64; 0: cannot run as given)."""
    major = lim["cc"][0]
    ws = lim["warp_size"]
    warps = _round_up(block, ws) // ws  # warps allocated per block
    # warps
    by_warps = np.where(block > lim["threads_per_block"], 0, (lim["threads_per_sm"] // ws) // np.maximum(warps, 1))
    # registers: per warp in units of 256, across the SM's 4 sub-partitions
    sub = 2 if lim["cc"] == (6, 0) else 4
    per_warp = _round_up(regs * ws, 256)
    per_block = per_warp * warps
    assumed = per_warp * _round_up(warps, sub)
    too_many = (lim["regs_per_block"] < assumed) | (lim["regs_per_block"] < per_block) | \
               (regs > (255 if major < 7 else 256))
    warps_per_sub = (lim["regs_per_sm"] // sub) // np.maximum(per_warp, 1)
    by_regs = np.where(per_warp > 0, (warps_per_sub * sub) // np.maximum(warps, 1), _INT_MAX)
    by_regs = np.where(too_many, 0, by_regs)
    # shared memory, with the function's default limit (Kineto does not opt in)
    unit = 128 if major >= 8 else 256
    alloc = _round_up(smem_static + lim["reserved_smem"] + smem_dynamic, unit)
    per_sm = _carveout(lim["smem_per_sm"], major) if major >= 7 else lim["smem_per_sm"]
    by_smem = np.where(alloc > lim["smem_per_block"] + lim["reserved_smem"], 0,
                       np.where(alloc > 0, per_sm // np.maximum(alloc, 1), _INT_MAX))
    return np.minimum(np.minimum(by_warps, by_regs), np.minimum(by_smem, lim["blocks_per_sm"]))


def estimate(grid: np.ndarray, block: np.ndarray, regs: np.ndarray, smem_static: np.ndarray,
             smem_dynamic: np.ndarray, lim: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """(blocks per SM, est. achieved occupancy %) per kernel, both float32, as Kineto writes them: NaN where
    the device's limits or SM count are unknown, or the launch parameters are not a launch (block size 0)."""
    n = grid.size
    nan = np.full(n, np.nan, dtype=np.float32)
    if lim is None or not lim.get("num_sms") or n == 0:
        return nan, nan.copy()
    grid = grid.astype(np.int64)
    block = block.astype(np.int64)
    act = active_blocks(block, regs.astype(np.int64), smem_static.astype(np.int64),
                        smem_dynamic.astype(np.int64), lim)
    # in float32, as Kineto computes them (22.5% of a V100 is 22.4999 there, so it rounds to 22)
    f = np.float32
    bps = grid.astype(f) / f(lim["num_sms"])
    occ32 = np.minimum(act.astype(f), bps) * block.astype(f) / f(lim["threads_per_sm"])
    occ = np.floor(occ32.astype(np.float64) * 100.0 + 0.5)  # std::lround of a positive value
    ok = block > 0
    return np.where(ok, bps, np.nan).astype(np.float32), np.where(ok, occ, np.nan).astype(np.float32)


__all__ = ["CC_LIMITS", "active_blocks", "estimate", "limits"]

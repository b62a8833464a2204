"""CPUs this process may actually use (affinity and cgroup quota), not os.cpu_count()."""

from __future__ import annotations

import math
import os


def _cgroup_cpu_limit() -> float | None:
    """CPU quota from cgroup v2 (cpu.max) or v1 (cfs_quota/cfs_period); None if unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        if quota > 0 and period > 0:
            return quota / period
    except (OSError, ValueError):
        pass
    return None


def usable_cpus() -> int:
    """min(affinity mask size, ceil(cgroup quota)), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def local_world_size() -> int:
    """Ranks on this node (torchrun's LOCAL_WORLD_SIZE), 1 when not launched by torchrun."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def loader_workers(local_ranks: int | None = None, cpus: int | None = None) -> int:
    """The founding document's min(32, 2 x cores), corrected: usable CPUs divided among the
    ranks of the node, so an 8-GPU node is not oversubscribed."""
    local_ranks = local_ranks or local_world_size()
    cpus = cpus or usable_cpus()
    return max(0, min(32, cpus // local_ranks))

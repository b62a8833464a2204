"""The one evidence model every reader fills, and every rule reads.

A reader turns what it read into :class:`Evidence`: a run directory (:mod:`trainperf.diagnosis.run_evidence`),
one rank of profiler traces or an Nsight Systems capture (:mod:`trainperf.diagnosis.trace_evidence`). A rule
(:mod:`trainperf.diagnosis.rules`) reads fields, never where they came from, and declares the fields it needs
(``Rule.needs``). A reader that cannot measure a field records why in ``Evidence.missing`` (``field ->
reason``, e.g. ``"loss": "a profiler trace holds no loss values"``); a rule that needs such a field is then
"not measured" with that reason, without being run. A field that is None but not in ``missing`` was measured
and has nothing to report (no step recorded a bad loss, no NVML sample).

Times are seconds unless the field name says ``_us``; fractions are shares of the step in [0, 1]; fields
ending in ``_pct`` are percents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal


def num(v: Any) -> float | None:
    """A figure read from a file: a finite number, else None (a bool, text, NaN or inf is no figure)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def median(values):
    """``statistics.median`` (the middle value, or the mean of the two middle ones), without importing
    ``statistics`` (with its fractions, decimal and random: ~5 ms of every `diagnose` process)."""
    v = sorted(values)
    n = len(v)
    if not n:
        raise ValueError("median of no values")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


@dataclass
class DataWait:
    """The step's wait for its next batch."""
    fraction: float = 0.0
    """share of the step (run: the ``data`` phase; trace: the DataLoader's share, the TensorBoard plugin's)"""
    mean_s: float = 0.0
    """seconds per step"""
    label: str = "data wait"
    """what the wait is called where it was measured ("data wait", "DataLoader")"""
    waits: str = "data waits"
    """the same, as the thing a fix hides ("data waits", "DataLoader waits")"""
    cpu_ratio: float | None = None
    """CPU seconds the training process used per wall second of the wait (run), None where not recorded"""
    iterators: list[str] | None = None
    """the DataLoader iterators the trace names (``_SingleProcessDataLoaderIter``...), None where unknown"""
    single_process: bool | None = None
    """the loader runs in the training process (num_workers=0), None where unknown"""


@dataclass
class CommWait:
    """Communication the step waits for."""
    fraction: float = 0.0
    """exposed communication as a share of the step (on traces: not overlapped by compute, less the wait for
    a slower rank, which the straggler speaks for)"""
    mean_s: float = 0.0
    overlap_pct: float | None = None
    """communication time overlapped by compute, %"""
    kinds_us: dict[str, float] = field(default_factory=dict)
    """communication kernel time per step by kind (all_reduce, all_to_all...)"""
    wait_s: float = 0.0
    """seconds per step waiting inside collectives for a slower rank (left out of ``fraction``)"""
    includes_absent: bool = False
    """the job's other ranks are not in the evidence: ``fraction`` includes waiting for them, which cannot be
    told apart from the transfer"""


@dataclass
class GpuUse:
    """How busy the device was. Each figure has the label that says how it was measured."""
    busy_pct: float | None = None
    busy_label: str = "NVML kernel-busy utilization"
    launch_label: str = "NVML kernel-busy"
    """how ``busy_pct`` is named in the launch_bound finding"""
    sm_active_pct: float | None = None
    sm_label: str = "SM activity (GPM)"
    mem_copy_util_pct: float | None = None
    mem_copy_label: str = "NVML memory-copy utilization"
    tensor_active_pct: float | None = None
    """tensor-pipe activity, % (NVML GPM / nsys GPU_METRICS), where measured"""
    measured: str | None = None
    """where the device figures were measured when not by trainperf's own sampler (e.g. "nsys GPU_METRICS")"""
    idle_frac: float | None = None
    """share of the GPU timeline with no kernel, copy or fill (HTA's idle)"""
    host_wait_frac: float | None = None
    """share of the step the GPU idles waiting for the host (HTA's host_wait)"""


@dataclass
class Evidence:
    """One run's, or one rank's, figures for the rules."""

    # --- where and how the figures were taken
    rank: int | None = None
    """the rank these figures are of; None: the run as a whole (its ranks in ``ranks``)"""
    world: int = 1
    window: str = "mean over the steady steps"
    """how the figures were averaged, as a finding says it"""
    steps_used: int | None = None
    fixes: Literal["config", "code"] = "config"
    """how a fix is written: "config", trainperf settings (the job ran under trainperf); "code", the PyTorch
    calls to change in the user's own loop (a profiler trace of any job)"""
    device: dict | None = None
    """{"name", "compute_capability"} of the GPU, where known"""
    path: str | None = None

    # --- the step
    step_time_s: float | None = None
    """median step time (run) or mean time per profiler step (trace)"""
    step_s: float | None = None
    """the step time gains are measured against (run: the sum of the mean phases)"""
    step_time_p90_s: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    train_time_s: float | None = None
    compile_s: float | None = None
    phase_fractions: dict[str, float] = field(default_factory=dict)
    phase_mean_s: dict[str, float] = field(default_factory=dict)
    other_frac: float | None = None
    """share of the step in no torch op at all (Python, sleeps, I/O waits; the TensorBoard plugin's Other)"""
    memcpy_frac: float | None = None
    """share of the step in host-device copies that no kernel overlaps (the TensorBoard plugin's Memcpy)"""

    # --- what the step waits for
    data: DataWait = field(default_factory=DataWait)
    comm: CommWait = field(default_factory=CommWait)
    gpu: GpuUse = field(default_factory=GpuUse)

    # --- ranks
    ranks: dict[int, dict] = field(default_factory=dict)
    """per rank, from each rank's own metrics file: step_time_s, compute_s, comm_s, comm_fraction"""
    rank_compute: dict | None = None
    """the trainer's per-rank compute clock (log windows), where recorded"""
    trace_ranks: dict | None = None
    """the figures across the ranks of profiler traces (straggler by GPU compute, waits)"""
    balance_enabled: bool = False
    balance_log: list[str] | None = None
    """the load balancer's mid-run changes, moves and verdicts in order (metrics.jsonl balance/*), where it ran"""

    # --- host
    cpu_cores_got: float | None = None
    cpu_share: float | None = None
    """CPU seconds per wall second the process got in its compute phases, at most one core (CPU devices)"""
    threads: int | None = None
    cpu_pct: float | None = None
    proc_cpu_pct: float | None = None

    # --- model, memory, numerics
    loss: dict | None = None
    mfu: float | None = None
    peak_source: str | None = None
    mem_peak_bytes: int | float | None = None
    mem_capacity_bytes: int | float | None = None
    oom_events: list[dict] | None = None
    xla_steps: list[dict] | None = None

    # --- what only a trace has
    attribution: dict | None = None
    """the step charged to named causes (:mod:`trainperf.trace.attribution`): ``gpu_pct`` summing to 100 and
    ``idle_causes`` [{cause, detail, names, us_per_step, pct, calls_per_step, callers, whatif_step_us,
    gain_us}]"""
    tensor_cores: dict | None = None
    memcpy: dict | None = None
    host_syncs: list[dict] | None = None
    occupancy: dict | None = None
    launch: dict | None = None

    missing: dict[str, str] = field(default_factory=dict)
    """field -> why the reader could not measure it"""

    def where(self) -> str:
        """' on rank N' when these are one rank's figures of several, else ''."""
        return f" on rank {self.rank}" if self.rank is not None and self.world > 1 else ""

    def lacks(self, name: str, reason: str) -> None:
        """Record that ``name`` could not be measured (the first reason given stands)."""
        if name not in FIELD_NAMES:
            raise KeyError(f"Evidence has no field {name!r}")
        self.missing.setdefault(name, reason)


FIELD_NAMES = frozenset(f.name for f in fields(Evidence)) | {f"gpu.{f.name}" for f in fields(GpuUse)}


def value(ev: Evidence, name: str) -> Any:
    """A field by name (``gpu.busy_pct`` for the device figures)."""
    obj: Any = ev
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


__all__ = ["CommWait", "DataWait", "Evidence", "FIELD_NAMES", "GpuUse", "num", "value"]

"""Every constant of the planner's cost model, named, documented and overridable.

Override on the command line with ``trainperf plan --set-constant NAME=VALUE`` (repeatable) or
in code with ``dataclasses.replace(DEFAULTS, name=value)``. ``trainperf plan --constants``
lists them. ``--calibrate RUN_DIR`` replaces ``matmul_peak_fraction`` by the one a real run
measured (see :mod:`trainperf.planner.calibrate`).

The defaults are physically motivated and few; none is fitted to a single published run:
the efficiencies come from measurements of one kernel or one collective, the byte counts from
the data types of Megatron-style mixed-precision training.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace

from trainperf.errors import UserError


@dataclass(frozen=True)
class Constants:
    # ------------------------------------------------------------- compute
    matmul_peak_fraction: float = 0.84
    """Fraction of the dense peak a large GEMM reaches before size effects. Chosen so an
    8192³ BF16 GEMM (three dims each scaled by matmul_dim_half below: 0.954) reaches 0.80 of
    peak, the fraction measured on H200 (770–798 of 989 TFLOP/s, REFERENCE.md)."""
    matmul_dim_half: float = 128.0
    """Each GEMM dimension d scales efficiency by d/(d + matmul_dim_half): the cost of filling
    one 128-wide tensor-core tile (pipeline fill, partial tiles, wave tails). Small dims
    (head dim 64–128, thin TP shards) lose efficiency, large ones approach the peak fraction."""
    hbm_fraction: float = 0.90
    """Fraction of HBM bandwidth reached by memory-bound kernels (softmax, dropout, layer norm,
    GELU, optimizer). Measured device-to-device copy on H200: 4.3 of 4.8 TB/s (REFERENCE.md)."""
    kernel_overhead_s: float = 5e-6
    """Fixed cost per kernel launch (launch + tail), seconds."""

    # ------------------------------------------------------------- communication
    nvlink_fraction: float = 0.80
    """NCCL bus bandwidth reached on NVLink as a fraction of one direction of the quoted total
    (DGX A100: ~235 of 300 GB/s in nccl-tests all_reduce_perf for messages >= 64 MB)."""
    internode_fraction: float = 0.80
    """NCCL bus bandwidth reached across nodes as a fraction of the per-GPU NIC rate."""
    collective_latency_s: float = 20e-6
    """Start-up latency of one collective step (NCCL ring/tree hop), seconds."""
    tp_overlap: float = 0.0
    """Fraction of tensor-parallel collective time hidden behind compute (0: Megatron 2022,
    where the all-reduces sit on the critical path)."""
    p2p_overlap: float = 0.0
    """Fraction of pipeline send/receive time hidden behind compute (0: blocking p2p)."""
    dp_overlap: float = 1.0
    """Fraction of the last micro-batch's backward during which the data-parallel gradient
    reduction can run (1: bucketed overlap as in PyTorch DDP/FSDP; 0: reduce after the step)."""

    # ------------------------------------------------------------- memory (bytes per parameter)
    param_bytes: float = 2.0
    """BF16/FP16 weights."""
    grad_bytes: float = 4.0
    """FP32 gradient accumulation buffer (Megatron; 2 with BF16 gradients)."""
    optimizer_bytes: float = 12.0
    """FP32 master weights + Adam m and v (the ZeRO paper's K=12)."""
    dp_grad_comm_bytes: float = 4.0
    """Bytes per gradient element in the data-parallel reduction (FP32 reduce)."""
    optimizer_traffic_bytes: float = 42.0
    """HBM bytes touched per (local) parameter by the optimizer step: Adam reads the FP32 grad,
    master, m, v (16) and writes master, m, v and the BF16 weight (14); grad-norm and clipping
    read and scale the gradient (12)."""
    memory_reserved_gib: float = 2.5
    """Device memory not available to the model: CUDA context, NCCL and cuBLAS workspaces,
    allocator fragmentation (GiB)."""

    def with_overrides(self, items) -> "Constants":
        """Apply ``NAME=VALUE`` strings; unknown names are rejected with the nearest valid one."""
        values = {}
        names = [f.name for f in fields(self)]
        for item in items or ():
            if "=" not in item:
                raise UserError(f"--set-constant {item!r}: expected NAME=VALUE, e.g. --set-constant nvlink_fraction=0.7")
            name, raw = (part.strip() for part in item.split("=", 1))
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise UserError(f"--set-constant {name!r} is not a planner constant; {hint}see `trainperf plan --constants`")
            try:
                value = float(raw)
            except ValueError:
                raise UserError(f"--set-constant {name}={raw!r}: the value must be a number") from None
            if value < 0:
                raise UserError(f"--set-constant {name}={value}: must be >= 0")
            if name.endswith(("_fraction", "_overlap")) and value > 1:
                raise UserError(f"--set-constant {name}={value}: a fraction must be between 0 and 1")
            values[name] = value
        return replace(self, **values)

    def describe(self) -> list[tuple[str, float, str]]:
        """(name, value, first line of its docstring) for every constant."""
        docs = _field_docs()
        return [(f.name, getattr(self, f.name), docs.get(f.name, "")) for f in fields(self)]

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _field_docs() -> dict[str, str]:
    """Attribute docstrings, read from this module's source (first sentence)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Constants))
    docs: dict[str, str] = {}
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
            text = " ".join(str(nxt.value.value).split())
            docs[node.target.id] = text
    return docs


DEFAULTS = Constants()

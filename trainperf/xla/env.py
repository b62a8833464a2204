"""Is torch_xla usable here? ``require_torch_xla()`` answers with one clear message or the module.

torch-xla wheels are built against one torch release: torch-xla X.Y.* needs torch X.Y.*
(2.9.0 needs 2.9.x). A mismatched pair fails at import with an undefined-symbol error that
names neither version, so the versions are compared before importing.
"""

from __future__ import annotations

from importlib import metadata

from trainperf.errors import ConfigError

# The newest pair published on PyPI (checked 2026-12: torch-xla 2.9.0 is the latest release).
RECOMMENDED = ("2.9.1", "2.9.0")  # (torch, torch-xla)


def _minor(version: str) -> tuple[int, ...]:
    core = version.split("+")[0]
    parts = []
    for p in core.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def install_hint() -> str:
    t, x = RECOMMENDED
    return (f"install a matching pair in its own environment: `pip install torch=={t} torch-xla=={x}` "
            f"(or `pip install 'trainperf[xla]'`; `make test-xla` builds one in .venv-xla)")


def installed_versions() -> tuple[str, str | None]:
    """(torch version, torch-xla version or None when not installed)."""
    import torch

    try:
        xla = metadata.version("torch-xla")
    except metadata.PackageNotFoundError:
        xla = None
    return torch.__version__, xla


def check_versions(torch_version: str, xla_version: str | None) -> str | None:
    """The problem with this pair, or None when it can work."""
    if xla_version is None:
        return (f"run.device='xla' needs torch_xla, which is not installed (torch {torch_version} is); "
                + install_hint())
    if _minor(torch_version) != _minor(xla_version):
        want = ".".join(map(str, _minor(xla_version)))
        return (f"run.device='xla': torch-xla {xla_version} needs torch {want}.x, but torch {torch_version} is "
                f"installed; either `pip install torch=={want}.*` to match it, or " + install_hint())
    return None


def require_torch_xla():
    """Import and return ``torch_xla``, or raise ConfigError (exit code 2) saying what to install."""
    problem = check_versions(*installed_versions())
    if problem:
        raise ConfigError(problem)
    try:
        import torch_xla
    except Exception as exc:  # noqa: BLE001 - a broken install: say which and what to do
        torch_v, xla_v = installed_versions()
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(f"run.device='xla': torch_xla {xla_v} is installed for torch {torch_v} but does not "
                          f"import ({type(exc).__name__}: {first}); " + install_hint()) from None
    return torch_xla


def xla_available() -> bool:
    return check_versions(*installed_versions()) is None


def resolve_xla(cfg, notes: dict, world_size: int = 1) -> None:
    """``run.device: xla`` in ``resolve``: check torch_xla, then precision and backend (in place).

    precision auto: bf16 on TPU (its native matmul type), fp32 elsewhere (the CPU PJRT device
    and XLA:GPU get no automatic reduced precision); fp16 and tf32 are rejected by ``resolve``.
    The optimizer kernel resolves to foreach (torch has no fused AdamW for XLA)."""
    require_torch_xla()
    import torch_xla.runtime as xr

    if world_size > 1:
        raise ConfigError(f"run.device=xla under torchrun (WORLD_SIZE={world_size}) is not supported: trainperf's "
                          "torchrun path is torch.distributed (gloo/nccl), and the CLI trains on XLA in one process; "
                          "run `trainperf train` without torchrun")

    kind = str(xr.device_type() or "CPU")
    notes["run.device"] = f"XLA, PJRT device {kind}"
    if cfg.precision.dtype == "auto":
        cfg.precision.dtype = "bf16" if kind == "TPU" else "fp32"
        notes["precision.dtype"] = (f"XLA {kind}: bf16 is its native matmul type" if kind == "TPU"
                                    else f"XLA {kind}: fp32 (precision.dtype=bf16 to choose autocast bf16)")
    backend = cfg.distributed.backend
    if backend == "auto":
        cfg.distributed.backend = "xla"
        notes["distributed.backend"] = "XLA: gradients are all-reduced by torch_xla's collectives"
    elif backend != "xla":
        raise ConfigError(f"distributed.backend={backend!r} with run.device=xla: XLA processes communicate through "
                          "torch_xla's collectives; use distributed.backend=auto or xla")
    if cfg.compile.enabled and cfg.compile.backend == "inductor":
        raise ConfigError("compile.enabled=true with compile.backend='inductor' on run.device=xla: inductor does not "
                          "compile XLA tensors; use compile.backend=openxla (torch.compile through XLA), or "
                          "compile.enabled=false (XLA already compiles each step's traced graph)")

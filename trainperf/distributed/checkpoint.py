"""Sharded checkpoints with torch.distributed.checkpoint (DCP), resumable on another layout.

Layout of one checkpoint::

    <dir>/step-00000100/            DCP files: every rank writes its own shards, in parallel
    <dir>/step-00000100/trainer.pt  rank 0: step, schedule, loader position, RNG, config
    <dir>/step-00000100/MANIFEST.json  rank 0: every file's bytes and sha256, checked before a resume
    <dir>/step-00000100/COMPLETE    written last, after every rank finished (marks it usable)

Model and optimizer states are keyed by the parameter names of the full model (pipeline stages
keep them; FSDP/DDP/compile/AC wrappers are stripped by ``get_state_dict``), and optimizer
state is flattened per parameter name, so a checkpoint saved at data=4 loads at data=2,
tensor=2, pipeline=2 or in one process: DCP reads, on each rank, the slices its shards need.
The loader position is layout-free (global batches consumed), the schedule a function of the step.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from trainperf.config.resume import check_resume_compatible, previous_dir, schedule_change_notes
from trainperf.errors import CheckpointError

_NAME = re.compile(r"^step-(\d{8})$")


def _options(full: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, full_state_dict=full)


def model_optim_state(modules: list, optimizers: list) -> dict:
    """{"model": {fqn: tensor}, "optim": {flattened per fqn}} merged over this rank's model parts."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = {}, {}
    for m, o in zip(modules, optimizers):
        msd, osd = get_state_dict(m, o, options=_options())
        model_sd.update(msd)
        optim_sd.update(osd)
    return {"model": model_sd, "optim": optim_sd}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def interrupts_unwrapped():
    """DCP gathers every rank's exception into one ``CheckpointException``: a Ctrl-C or SIGTERM that lands
    inside a save or load is re-raised as itself (``KeyboardInterrupt`` / ``interrupt.Terminated``), so the
    command ends as any interrupt does (130 / 143, no traceback), not as a failed checkpoint."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        for err, _trace in (exc.failures or {}).values():
            if isinstance(err, KeyboardInterrupt):
                raise err from None
        raise


def save(ckpt_dir: str | Path, step: int, modules: list, optimizers: list, extra: dict, *, keep: int = 3,
         kill_midway: bool = False) -> Path:
    """Collective: every rank writes its shards; rank 0 writes ``trainer.pt`` and then ``COMPLETE``.
    ``kill_midway`` (a test knob, ``Knobs.checkpoint_kill_step``): this rank SIGKILLs itself once its shards
    are written, before the checkpoint is complete."""
    import torch.distributed.checkpoint as dcp

    path = Path(ckpt_dir) / f"step-{step:08d}"
    if _rank() == 0:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
    _barrier()
    with interrupts_unwrapped():
        dcp.save(model_optim_state(modules, optimizers), checkpoint_id=str(path))
    if kill_midway:
        _kill_self(step)
    if _rank() == 0:
        torch.save(extra, path / "trainer.pt")
    _barrier()
    if _rank() == 0:
        write_manifest(path)  # every shard's size and sha256: a flipped byte is found before it trains
        (path / "COMPLETE").write_text(str(step))
        _prune(Path(ckpt_dir), keep)
    _barrier()
    return path


def _kill_self(step: int) -> None:
    import os
    import signal
    import sys
    import time

    print(f"trainperf: injected fault 'kill in checkpoint' on rank {_rank()} at step {step} (t={time.time():.3f}): "
          "SIGKILL with its shards written, the checkpoint not complete", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


MANIFEST = "MANIFEST.json"


def _sha256(f: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(path: Path) -> None:
    """``MANIFEST.json``: the bytes and sha256 of every file of the checkpoint (shards, .metadata, trainer.pt),
    written atomically before ``COMPLETE``."""
    from trainperf.runio import write_json

    files = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(path.iterdir()) if f.is_file() and f.name not in (MANIFEST, "COMPLETE")}
    write_json(path / MANIFEST, {"files": files})


def verify_manifest(path: Path) -> None:
    """Each file the manifest lists is there with its bytes and sha256 (CheckpointError naming the first that is
    not). A checkpoint saved before manifests were written has none: nothing to check."""
    import json

    m = path / MANIFEST
    if not m.is_file():
        return
    try:
        files = json.loads(m.read_text())["files"]
        assert isinstance(files, dict)
    except Exception:  # noqa: BLE001 - any damage to the manifest itself
        raise CheckpointError(f"{m}: unreadable; {_FIX}") from None
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (the manifest lists it); {_FIX}")
        if f.stat().st_size != want.get("bytes") or _sha256(f) != want.get("sha256"):
            raise CheckpointError(f"{f}: its bytes differ from those saved (size or sha256 does not match "
                                  f"{MANIFEST}): the file is corrupt; {_FIX}")


def _prune(ckpt_dir: Path, keep: int) -> None:
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        shutil.rmtree(old[1], ignore_errors=True)


def list_checkpoints(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (COMPLETE marker present), oldest first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and (p / "COMPLETE").exists():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest(ckpt_dir: str | Path) -> Path | None:
    """The newest complete checkpoint whose marker, DCP metadata and ``trainer.pt`` read back; each
    unreadable newer one is reported (a warning) and skipped."""
    for step, path in reversed(list_checkpoints(ckpt_dir)):
        try:
            check_readable(path)
        except CheckpointError as exc:
            warnings.warn(f"checkpoint of step {step} is unusable: {exc}; trying the previous one", stacklevel=2)
            continue
        return path
    return None


_FIX = "resume from an earlier checkpoint (delete this one) or start over with --resume never"


def check_readable(path: str | Path) -> dict:
    """Read-only checks of one DCP checkpoint, before any collective: the COMPLETE marker names its
    step, DCP's metadata unpickles, ``trainer.pt`` loads (weights_only). Returns the trainer state."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a distributed checkpoint directory (step-XXXXXXXX/); {_FIX}")
    try:
        marker = (path / "COMPLETE").read_bytes()[:64]
    except OSError:
        raise CheckpointError(f"{path} is not a complete distributed checkpoint (no COMPLETE marker); {_FIX}") from None
    m = _NAME.match(path.name)
    if m and marker.strip() != str(int(m.group(1))).encode():
        raise CheckpointError(f"{path / 'COMPLETE'}: holds {marker[:20]!r}, not the step {int(m.group(1))}; "
                              f"the marker is corrupt; {_FIX}")
    try:
        from torch.distributed.checkpoint import FileSystemReader

        FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to unpickle means unusable
        raise CheckpointError(f"{path}: DCP metadata (.metadata) unreadable ({_why(exc)}); {_FIX}") from None
    verify_manifest(path)
    return read_trainer_state(path)


def read_trainer_state(path: str | Path) -> dict:
    """``trainer.pt`` of a DCP checkpoint (step, schedule, loader, RNG, config), loaded with weights_only=True."""
    f = Path(path) / "trainer.pt"
    if not f.is_file():
        raise CheckpointError(f"{f}: missing; {_FIX}")
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means unusable
        raise CheckpointError(f"{f}: cannot be loaded ({_why(exc)}); {_FIX}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{f}: not a trainer state (no integer 'step'); {_FIX}")
    return state


def _why(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: the first rank's own error
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def load(path: str | Path, modules: list, optimizers: list) -> dict:
    """Collective: fill this rank's model parts and optimizers from a checkpoint saved on any layout;
    returns the ``trainer.pt`` dict (step, loader, RNG, config)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    extra = check_readable(path)  # every rank reads the same files: all refuse together, before a collective
    state = model_optim_state(modules, optimizers)  # the shapes and shards this layout wants
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with interrupts_unwrapped():
            dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a missing or cut shard, a shape this model lacks
        # (CheckpointException, DCP's gathered failure, is a BaseException: named here, an interrupt is not)
        raise CheckpointError(f"{path}: cannot be loaded into this model ({_why(exc)}); {_FIX}") from None
    for m, o in zip(modules, optimizers):
        names = _fqns(m)
        msd = {k: v for k, v in state["model"].items() if k in names}
        osd = {k: v for k, v in state["optim"].items() if _optim_key_fqn(k) in names}
        set_state_dict(m, o, model_state_dict=msd, optim_state_dict=osd, options=_options())
    return extra


def _fqns(module) -> set[str]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return set(get_model_state_dict(module).keys())


def _optim_key_fqn(key: str) -> str:
    # flattened keys: "state.<fqn>.<exp_avg|exp_avg_sq|step>" and "param_groups.<fqn>.<option>"
    head, _, rest = key.partition(".")
    return rest.rsplit(".", 1)[0] if head in ("state", "param_groups") else key


class DcpCheckpointer:
    """Several processes: sharded DCP checkpoints, every rank writing its shards (resumable on another
    layout). Collective: every rank calls :meth:`save` and :meth:`resume`."""

    def __init__(self, directory: str | Path, keep: int = 3, *, kill_step: int | None = None, kill_rank: int = 0):
        self.dir = Path(directory)
        self.keep = keep
        # a test knob (Knobs.checkpoint_kill_step / checkpoint_kill_rank): that rank SIGKILLs itself midway
        # through writing that step's checkpoint (its shards written, the checkpoint never complete)
        self.kill_step, self.kill_rank = kill_step, kill_rank
        self.set_aside: Path | None = None  # rank 0: the previous run's checkpoints, while this run has none

    def save(self, trainer) -> Path:
        kill = self.kill_step is not None and self.kill_step == trainer.step and _rank() == self.kill_rank
        path = save(self.dir, trainer.step, trainer.pm.modules, trainer.optimizer.optimizers, trainer.extra_state(),
                    keep=self.keep, kill_midway=kill)
        if self.set_aside is not None:  # this run has a complete checkpoint now: the previous run's are superseded
            shutil.rmtree(self.set_aside, ignore_errors=True)
            self.set_aside = None
        return path

    def _start_over(self) -> None:
        """Rank 0, ``--resume never``: the previous run's checkpoints renamed to ``<dir>.previous`` (nothing is
        deleted before this run writes its own; an aside kept from an attempt that wrote none stays)."""
        aside = previous_dir(self.dir)
        if not self.dir.is_dir() or not any(self.dir.iterdir()):
            self.set_aside = aside if aside.is_dir() else None
            return
        if aside.exists():
            if not list_checkpoints(self.dir):  # only leftovers of an attempt that never completed a checkpoint
                shutil.rmtree(self.dir)
                self.set_aside = aside
                return
            shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
        self.dir.replace(aside)
        self.set_aside = aside
        print(f"resume never: the previous run's checkpoints were moved to {aside}; they are deleted once this run "
              f"writes its first checkpoint (to go back to them, move {aside} back to {self.dir} and resume)",
              flush=True)

    def resume(self, trainer, mode: str) -> int | None:
        """``--resume auto | never | PATH`` (PATH: a step-XXXXXXXX directory saved on any layout)."""
        if mode == "never":
            _barrier()
            if _rank() == 0:
                self._start_over()
            _barrier()
            return None
        path = latest(self.dir) if mode == "auto" else Path(mode)
        if path is None:
            return None
        saved, current = read_trainer_state(path).get("config", {}), trainer.cfg.model_dump(mode="json")
        check_resume_compatible(saved, current)
        if _rank() == 0:
            for line in schedule_change_notes(saved, current):
                print(line, flush=True)
        extra = load(path, trainer.pm.modules, trainer.optimizer.optimizers)
        trainer.load_extra_state(extra)
        return trainer.step

"""Atomic, verified checkpoints for one process (distributed runs use torch.distributed.checkpoint).

Layout in the checkpoint directory::

    step-00000100.pt     the state (torch.save), written atomically
    step-00000100.json   manifest: step, size, sha256; written last, marks the checkpoint complete

Writing: serialize to memory, hash, write a temporary file, fsync, rename, fsync
the directory, then the manifest the same way. A process killed at any moment
(kill -9 included) leaves either a complete checkpoint or one that is ignored
(a temporary file, or a .pt without manifest). Reading verifies size and
sha256 and loads with ``weights_only=True``; a corrupt latest checkpoint is
reported and the previous good one is used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

import torch

from trainperf.errors import CheckpointError

_NAME = re.compile(r"^step-(\d{8})\.json$")
# Sections whose change makes a checkpoint meaningless for this run.
RESUME_KEYS = ("model", "data.source", "data.path", "train.global_batch")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, kill_midway: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            if kill_midway:
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C / SIGTERM mid-write included: the previous checkpoint stays the newest
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def read_manifest(path: Path, step: int) -> dict:
    """A checkpoint's manifest, checked field by field: CheckpointError naming the file if it is not one."""
    from trainperf.errors import UserError
    from trainperf.runio import read_json

    try:
        manifest = read_json(path, what="checkpoint manifest")
    except UserError as exc:
        raise CheckpointError(str(exc)) from None
    name = f"step-{step:08d}.pt"
    problems = []
    if manifest.get("file") != name:
        problems.append(f"file={manifest.get('file')!r} (expected {name!r})")
    size = manifest.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        problems.append(f"bytes={size!r} (expected a byte count)")
    digest = manifest.get("sha256")
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        problems.append(f"sha256={digest!r} (expected 64 hex digits)")
    if problems:
        raise CheckpointError(f"{path}: not a valid checkpoint manifest ({'; '.join(problems)}); "
                              "delete this checkpoint's .json and .pt, or start over with --resume never")
    return manifest


class CheckpointManager:
    """Single-file checkpoints in a directory. ``kill_step``: a test knob (``Knobs.checkpoint_kill_step``)
    that SIGKILLs this process half-way through writing that step's file (crash consistency)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, *, kill_step: int | None = None):
        self.dir = Path(directory)
        self.keep = keep
        self.kill_step = kill_step

    # ------------------------------------------------------------------ write
    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        path = self.dir / f"step-{step:08d}.pt"
        atomic_write(path, data, kill_midway=self.kill_step == step)
        manifest = {"step": step, "file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        atomic_write(self.dir / f"step-{step:08d}.json", json.dumps(manifest).encode())
        self.prune()
        return path

    def prune(self) -> None:
        steps = self.steps()
        for step in steps[: max(0, len(steps) - self.keep)]:
            for suffix in (".json", ".pt"):  # manifest first: a half-pruned checkpoint is never "complete"
                (self.dir / f"step-{step:08d}{suffix}").unlink(missing_ok=True)
        for tmp in self.dir.glob(".step-*.tmp*"):
            pid = tmp.name.rsplit("tmp", 1)[-1]
            if pid != str(os.getpid()):
                tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ read
    def steps(self) -> list[int]:
        """Steps with a manifest (complete as written), ascending."""
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := _NAME.match(p.name)))

    def verify_and_load(self, step: int, map_location: str | torch.device = "cpu") -> dict:
        manifest_path = self.dir / f"step-{step:08d}.json"
        manifest = read_manifest(manifest_path, step)
        path = self.dir / manifest["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if len(data) != manifest["bytes"]:
            raise CheckpointError(f"{path}: truncated ({len(data)} of {manifest['bytes']} bytes)")
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise CheckpointError(f"{path}: checksum mismatch (the file was altered or corrupted)")
        try:
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means unusable
            raise CheckpointError(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from None

    def load_latest(self, map_location: str | torch.device = "cpu") -> tuple[int, dict] | None:
        """The newest checkpoint that verifies; warns about each corrupt one skipped. None if there is none."""
        steps = self.steps()
        errors = []
        for step in reversed(steps):
            try:
                state = self.verify_and_load(step, map_location)
            except CheckpointError as exc:
                errors.append(str(exc))
                warnings.warn(f"checkpoint of step {step} is corrupt: {exc}; trying the previous one", stacklevel=2)
                continue
            if errors:
                print(f"resume: skipped {len(errors)} corrupt checkpoint(s); using step {step}", flush=True)
            return step, state
        if errors:
            raise CheckpointError(
                f"every checkpoint in {self.dir} is corrupt ({'; '.join(errors)}); "
                "start over with --resume never or point --resume at a good checkpoint file"
            )
        return None

    def load_file(self, path: str, map_location="cpu") -> dict:
        """Load a checkpoint file named by the user (verified against its manifest when present)."""
        p = Path(path)
        if not p.exists():
            raise CheckpointError(f"--resume {path!r}: no such file; pass a step-XXXXXXXX.pt file or 'auto'")
        if p.is_dir():
            raise CheckpointError(f"--resume {path!r} is a directory; pass a step-XXXXXXXX.pt file inside it, or 'auto'")
        m = re.match(r"^step-(\d{8})\.pt$", p.name)
        if m and (p.parent / f"step-{m.group(1)}.json").exists():
            return CheckpointManager(p.parent).verify_and_load(int(m.group(1)), map_location)
        try:
            return torch.load(p, map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{path}: cannot be loaded as a checkpoint ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------- the trainer's checkpointer (one process)
def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d


def check_resume_compatible(saved: dict, current: dict) -> None:
    """Refuse a checkpoint whose model, data or global batch differ from this run's config."""
    for key in RESUME_KEYS:
        if _get(saved, key) != _get(current, key):
            raise CheckpointError(
                f"the checkpoint was written with {key}={_get(saved, key)!r} but this run has {_get(current, key)!r}; "
                "resume with the same setting, or start over with --resume never (or another run.dir)"
            )


class FileCheckpointer:
    """One process: the whole training state in one atomic, sha256-verified file per checkpoint
    (model, optimizer and the trainer's extra state: step, loader position, RNG, scaler, config)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, *, kill_step: int | None = None):
        self.manager = CheckpointManager(directory, keep, kill_step=kill_step)
        self.dir = self.manager.dir

    def save(self, trainer) -> Path | None:
        if not trainer.is_main:
            return None
        (model,), (optimizer,) = trainer.pm.modules, trainer.optimizer.optimizers
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **trainer.extra_state()}
        return self.manager.save(trainer.step, trainer.backend.to_host(state))

    def resume(self, trainer, mode: str) -> int | None:
        """``--resume auto | never | PATH``. Returns the step resumed from, or None for a fresh start."""
        if mode == "never":
            if self.dir.exists():
                shutil.rmtree(self.dir)
            return None
        where = trainer.backend.map_location
        if mode == "auto":
            found = self.manager.load_latest(map_location=where)
            if found is None:
                return None
            state = found[1]
        else:
            state = self.manager.load_file(mode, map_location=where)
        check_resume_compatible(state.get("config", {}), trainer.cfg.model_dump(mode="json"))
        (model,), (optimizer,) = trainer.pm.modules, trainer.optimizer.optimizers
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        trainer.load_extra_state(state)
        return trainer.step

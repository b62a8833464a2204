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

from trainperf.config.resume import (  # noqa: F401  (the policy both checkpointers share: trainperf.config.resume)
    RESUME_KEYS, SCHEDULE_KEYS, check_resume_compatible, previous_dir, schedule_change_notes,
)
from trainperf.errors import CheckpointError

_NAME = re.compile(r"^step-(\d{8})\.json$")


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


def _load_error(path, exc: Exception, what: str = "cannot be loaded") -> CheckpointError:
    """torch.load's failure as trainperf's refusal. torch's weights_only text (its advice to retry with
    weights_only=False, which would run the file's code) is never passed on: only its specific finding."""
    text = str(exc)
    if "Weights only load failed" in text or "weights_only" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if found:
            return CheckpointError(
                f"{path}: refused: the file contains pickled Python code or objects ({found.group(1)}), not only "
                "tensors; it is not a trainperf checkpoint or it comes from an untrusted source. trainperf loads "
                "checkpoints with weights_only=True and never runs code from them; do not load it another way: point "
                "--resume at a checkpoint written by trainperf train, or start over with --resume never")
        parts = [p.strip() for p in text.split("\n\n")]
        detail = next((p for p in parts[1:] if p and not p.startswith("Check the documentation")), "unreadable")
        text = f"not a torch.save file of tensors: {detail}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return CheckpointError(f"{path}: {what} ({text}); it is not a trainperf checkpoint; point --resume at a "
                           "step-XXXXXXXX.pt written by trainperf train, or start over with --resume never")


_REQUIRED = ("model", "optimizer", "step", "config")


def check_state(path, state, step: int | None = None) -> dict:
    """A loaded file is a trainperf checkpoint: a dict with model/optimizer/step/config, a whole step >= 0 (the
    file's own step when it has a manifest). CheckpointError naming the file otherwise."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a trainperf checkpoint (its top level is a {type(state).__name__}, not a "
                              "dict of model, optimizer, step and config); point --resume at a step-XXXXXXXX.pt "
                              "written by trainperf train, or start over with --resume never")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a trainperf checkpoint (no {', '.join(repr(k) for k in missing)} "
                              f"key{'s' if len(missing) > 1 else ''}); point --resume at a step-XXXXXXXX.pt written "
                              "by trainperf train, or start over with --resume never")
    if not isinstance(state["model"], dict):
        raise CheckpointError(f"{path}: corrupt checkpoint ('model' is a {type(state['model']).__name__}, not a "
                              "state dict); use another checkpoint or start over with --resume never")
    value = state["step"]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"{path}: corrupt checkpoint: step={state['step']!r} is not a valid checkpoint step "
                              "(a whole number >= 0); use another checkpoint or start over with --resume never")
    if step is not None and value != step:
        raise CheckpointError(f"{path}: corrupt checkpoint: it holds step {value} but its name and manifest say "
                              f"step {step}; use another checkpoint or start over with --resume never")
    state["step"] = value
    return state


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
            state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means unusable
            raise _load_error(path, exc) from None
        return check_state(path, state, step)

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
            state = torch.load(p, map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise _load_error(path, exc, "cannot be loaded as a checkpoint") from None
        return check_state(path, state)


# ---------------------------------------------------------------------- the trainer's checkpointer (one process)
def load_model_state(model, saved: dict, source) -> None:
    """``model.load_state_dict`` with a refusal naming the checkpoint and the first tensor that does not fit (a
    missing, unexpected or differently shaped one) instead of torch's RuntimeError."""
    mine = model.state_dict()
    fix = "use a checkpoint of this model, or start over with --resume never (or another run.dir)"
    for name, tensor in mine.items():
        if name not in saved:
            raise CheckpointError(f"checkpoint {source}: has no tensor {name} that this model needs; {fix}")
        theirs = saved[name]
        if not isinstance(theirs, torch.Tensor):
            raise CheckpointError(f"checkpoint {source}: {name} is a {type(theirs).__name__}, not a tensor; {fix}")
        if tuple(theirs.shape) != tuple(tensor.shape):
            raise CheckpointError(f"checkpoint {source}: tensor {name} has shape {list(theirs.shape)}, the model needs "
                                  f"{list(tensor.shape)}; {fix}")
    extra = [k for k in saved if k not in mine]
    if extra:
        raise CheckpointError(f"checkpoint {source}: holds tensor {extra[0]} that this model does not have"
                              f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; {fix}")
    try:
        model.load_state_dict(saved)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {source}: its model state does not fit this model ({exc}); {fix}") from None


class FileCheckpointer:
    """One process: the whole training state in one atomic, sha256-verified file per checkpoint
    (model, optimizer and the trainer's extra state: step, loader position, RNG, scaler, config).

    ``--resume never`` deletes nothing up front: the previous run's checkpoints are renamed to
    ``<dir>.previous`` and deleted only once this run has written its first checkpoint (or finished), so a run
    that fails or is killed before then leaves the old ones where the user can take them back."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, *, kill_step: int | None = None,
                 sharded=None):
        self.manager = CheckpointManager(directory, keep, kill_step=kill_step)
        self.dir = self.manager.dir
        self.set_aside: Path | None = None  # the previous run's checkpoints, while this run has none
        # trainperf.distributed.checkpoint, handed in by the builder (it imports this module): resumes a
        # distributed run's sharded checkpoint in this one process
        self.sharded = sharded

    def save(self, trainer) -> Path | None:
        if not trainer.is_main:
            return None
        (model,), (optimizer,) = trainer.pm.modules, trainer.optimizer.optimizers
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **trainer.extra_state()}
        path = self.manager.save(trainer.step, trainer.backend.to_host(state))
        self.discard_previous()  # this run has a complete checkpoint now: the previous run's are superseded
        return path

    def discard_previous(self) -> None:
        if self.set_aside is not None:
            shutil.rmtree(self.set_aside, ignore_errors=True)
            self.set_aside = None

    def _start_over(self) -> None:
        """``--resume never``: move the previous run's checkpoints aside (a rename; nothing is deleted yet)."""
        aside = previous_dir(self.dir)
        if not self.dir.is_dir() or not any(self.dir.iterdir()):
            if aside.is_dir():
                self.set_aside = aside  # kept from an earlier attempt that never wrote a checkpoint
            return
        if aside.exists():
            if self.manager.steps():
                # a run started over after the one in aside/ and wrote checkpoints: aside/ is superseded
                if aside.is_dir():
                    shutil.rmtree(aside)
                else:
                    aside.unlink()
            else:
                # only leftovers of an attempt that never completed a checkpoint (temporary or manifest-less
                # files): nothing to keep; aside/ still holds the good run
                shutil.rmtree(self.dir)
                self.set_aside = aside
                return
        os.replace(self.dir, aside)
        _fsync_dir(aside.parent)
        self.set_aside = aside
        print(f"resume never: the previous run's checkpoints were moved to {aside}; they are deleted once this run "
              f"writes its first checkpoint (to go back to them, move {aside} back to {self.dir} and resume)",
              flush=True)

    def _sharded(self, mode: str) -> Path | None:
        """A sharded (DCP) checkpoint to resume from: PATH when it is one (a step-XXXXXXXX directory), or with
        ``auto`` the newest usable one in the directory when it is newer than every single-file checkpoint."""
        dcp_ckpt = self.sharded
        if dcp_ckpt is None:
            return None
        if mode not in ("auto", "never"):
            p = Path(mode)
            return p if p.is_dir() else None
        if mode != "auto" or not dcp_ckpt.list_checkpoints(self.dir):
            return None
        newest_file = max(self.manager.steps(), default=-1)
        if dcp_ckpt.list_checkpoints(self.dir)[-1][0] <= newest_file:
            return None
        found = dcp_ckpt.latest(self.dir)
        return found if found is not None and int(found.name[5:]) > newest_file else None

    def _resume_sharded(self, trainer, path: Path) -> int:
        dcp_ckpt = self.sharded
        saved = dcp_ckpt.read_trainer_state(path).get("config", {})
        current = trainer.cfg.model_dump(mode="json")
        check_resume_compatible(saved, current)
        if trainer.is_main:
            for line in schedule_change_notes(saved, current):
                print(line, flush=True)

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")  # DCP in one process
            extra = dcp_ckpt.load(path, trainer.pm.modules, trainer.optimizer.optimizers)
        trainer.load_extra_state(extra)
        print(f"resume: step {trainer.step} from the sharded checkpoint {path} (a distributed run's); this run "
              "saves single-file checkpoints beside it", flush=True)
        return trainer.step

    def resume(self, trainer, mode: str) -> int | None:
        """``--resume auto | never | PATH``. Returns the step resumed from, or None for a fresh start. A sharded
        (DCP) checkpoint of a distributed run, newer than the single-file ones (or named), loads too."""
        if mode == "never":
            if trainer.is_main:
                self._start_over()
            return None
        sharded = self._sharded(mode)
        if sharded is not None:  # saved by a distributed run: DCP loads it into this one process
            return self._resume_sharded(trainer, sharded)
        where = trainer.backend.map_location
        if mode == "auto":
            found = self.manager.load_latest(map_location=where)
            if found is None:
                if previous_dir(self.dir).is_dir():
                    print(f"resume: no checkpoint in {self.dir}; starting over. The checkpoints of the run before "
                          f"`--resume never` are in {previous_dir(self.dir)}: to resume that run instead, stop, "
                          f"move them back to {self.dir} and run again", flush=True)
                return None
            source, state = self.dir / f"step-{found[0]:08d}.pt", found[1]
        else:
            source, state = mode, self.manager.load_file(mode, map_location=where)
        current = trainer.cfg.model_dump(mode="json")
        check_resume_compatible(state.get("config", {}), current)
        if trainer.is_main:
            for line in schedule_change_notes(state.get("config", {}), current):
                print(line, flush=True)
        (model,), (optimizer,) = trainer.pm.modules, trainer.optimizer.optimizers
        load_model_state(model, state["model"], source)
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {source}: its optimizer state does not fit this run's optimizer "
                                  f"({type(exc).__name__}: {exc}); use a checkpoint of this model and optimizer, or "
                                  "start over with --resume never") from None
        trainer.load_extra_state(state)
        return trainer.step

"""Profiling: a torch.profiler window, NVTX ranges (in the PhaseTimer), and CUDA OOM snapshots.

* ``monitor.profile: {start_step: S, steps: K}`` records steps S+1 .. S+K (the steps that run
  after S optimizer steps are done) with torch.profiler and writes
  ``profile/trace_rank{R}_step{S}.json.gz``: a Chrome trace, gzipped, that Perfetto
  (ui.perfetto.dev) and chrome://tracing open as is.
* On CUDA, with ``monitor.oom_snapshot``, the caching allocator records its history and a CUDA
  out-of-memory error writes ``oom_snapshot_rank{R}.pickle`` (open it at pytorch.org/memory_viz)
  before the error propagates.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from pathlib import Path

import torch


class ProfileWindow:
    def __init__(self, out_dir: Path, start_step: int | None, steps: int, rank: int = 0, cuda: bool = False):
        self.out_dir, self.start, self.steps, self.rank, self.cuda = out_dir, start_step, steps, rank, cuda
        self._prof = None
        self.path: Path | None = None

    def before_step(self, step: int) -> None:
        """``step``: optimizer steps done so far (the step about to run is step + 1)."""
        if self.start is None or self._prof is not None or step != self.start:
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=acts, record_shapes=True, with_stack=False, profile_memory=True)
        self._prof.__enter__()

    def after_step(self, step: int) -> None:
        """``step``: optimizer steps done after the step that just ran."""
        if self._prof is not None and step >= self.start + self.steps:
            self.close()

    def close(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        raw = self.out_dir / f"trace_rank{self.rank}_step{self.start}.json"
        prof.export_chrome_trace(str(raw))
        gz = raw.with_name(raw.name + ".gz")
        with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        self.path = gz


class OomSnapshot:
    """Record the CUDA caching allocator's history; on OOM dump it (only on CUDA, only if enabled)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = bool(enabled) and torch.cuda.is_available()
        self.written: Path | None = None
        if self.enabled:
            try:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
            except Exception:  # noqa: BLE001 - older torch or no allocator support
                self.enabled = False

    @contextlib.contextmanager
    def guard(self):
        try:
            yield
        except torch.cuda.OutOfMemoryError:
            self.dump()
            raise

    def dump(self) -> Path | None:
        if not self.enabled:
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(self.path))
            self.written = self.path
            print(f"monitor: CUDA out of memory; allocator snapshot written to {self.path} "
                  "(drag it into https://pytorch.org/memory_viz)", flush=True)
        except Exception as exc:  # noqa: BLE001 - never mask the OOM itself
            print(f"monitor: could not write the OOM snapshot: {exc}", flush=True)
        return self.written

    def close(self) -> None:
        if self.enabled:
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(enabled=None)


def trace_files(run_dir: str | os.PathLike) -> list[Path]:
    return sorted(Path(run_dir, "profile").glob("trace_*.json.gz"))

"""Metric sinks. JSONL is always on and line-buffered, so the file survives a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path


class JSONLSink:
    def __init__(self, path: str | os.PathLike, *, truncate_after_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            self._truncate(truncate_after_step)
        elif truncate_after_step is None and self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")  # line-buffered

    def _truncate(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be recomputed)."""
        keep = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if rec.get("step", -1) <= step:
                keep.append(line)
        self.path.write_text("".join(k + "\n" for k in keep), encoding="utf-8")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, default=float) + "\n")

    def close(self) -> None:
        self._f.close()

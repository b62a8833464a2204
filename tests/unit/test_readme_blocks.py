"""The Python code blocks of README.md and of the documentation site (docs/**/*.md) run as written
(each in a fresh namespace, in an empty directory). A block whose fence info string is
``python no-run`` is skipped: keep that set small."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import ROOT

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, info string, code) of each fenced block whose language is python."""
    out = []
    for m in FENCE.finditer(text):
        info = m.group(1).strip()
        if info.split()[:1] == ["python"]:
            out.append((text.count("\n", 0, m.start()) + 1, info, m.group(2)))
    return out


DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [(str(f.relative_to(ROOT)), *b) for f in DOC_FILES for b in python_blocks(f.read_text())]
RUNNABLE = [b for b in BLOCKS if "no-run" not in b[2].split()]


def test_docs_have_python_blocks_and_few_are_skipped():
    assert any(b[0] == "README.md" for b in RUNNABLE), "no runnable python block found in README.md"
    assert len({b[0] for b in RUNNABLE}) >= 3, "the guides' python blocks were not found under docs/"
    assert len(BLOCKS) - len(RUNNABLE) <= 2, [b[:2] for b in BLOCKS if b not in RUNNABLE]


@pytest.mark.parametrize("path,line,info,code", RUNNABLE, ids=[f"{b[0]}:{b[1]}" for b in RUNNABLE])
def test_docs_python_block_runs(path, line, info, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks write runs/... relative to the working directory
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        exec(compile(code, f"{path}:{line}", "exec"), {"__name__": "__readme__"})
    finally:
        torch.set_num_threads(threads)

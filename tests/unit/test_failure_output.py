"""The fail-fast report reaches the launcher's shared stderr as one whole line per rank.

CI saw two ranks fail at once and one report glued to the end of the other's line (``print`` writes the
text and its newline in two calls): the test that looks for rank 0's line at the start of a line missed it.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

from trainperf.distributed import failure


def test_a_line_goes_out_in_one_write_with_its_newline(monkeypatch):
    r, w = os.pipe()
    calls = []
    real_write = os.write

    def spy(fd, data):
        calls.append(bytes(data))
        return real_write(fd, data)

    with os.fdopen(w, "w") as out:
        monkeypatch.setattr(failure.os, "write", spy)
        failure.write_line("trainperf: rank 0 stopped at step 3: é", out)
        monkeypatch.undo()
    with os.fdopen(r, "rb") as f:
        got = f.read()
    assert got == "trainperf: rank 0 stopped at step 3: é\n".encode()
    assert calls == [got]


def test_a_stream_without_a_descriptor_gets_the_line_in_one_call():
    out = io.StringIO()
    failure.write_line("one line", out)
    assert out.getvalue() == "one line\n"


def test_lines_of_ranks_writing_at_once_stay_whole(tmp_path):
    """Four processes write 300 long lines each into one pipe at the same time: every line read back is one
    process's line, whole."""
    script = textwrap.dedent("""
        import sys
        from trainperf.distributed.failure import write_line
        tag = sys.argv[1]
        for i in range(300):
            write_line(f"trainperf: rank {tag} stopped at step {i}: " + tag * 1500 + ".")
    """)
    # one pipe shared by all writers, as torchrun's children share the job's stderr
    r, w = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], stderr=w, stdout=subprocess.DEVNULL)
             for k in range(4)]
    os.close(w)
    with os.fdopen(r, "r") as f:
        lines = f.read().splitlines()
    for p in procs:
        assert p.wait(timeout=120) == 0
    assert len(lines) == 4 * 300
    seen = set()
    for ln in lines:
        m = re.fullmatch(r"trainperf: rank (\d) stopped at step (\d+): (\d+)\.", ln)
        assert m and m.group(3) == m.group(1) * 1500, ln[:200]
        seen.add((m.group(1), int(m.group(2))))
    assert seen == {(str(k), i) for k in range(4) for i in range(300)}

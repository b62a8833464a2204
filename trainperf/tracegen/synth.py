"""Traces made from a real one: reading and writing them as streams of raw Chrome-trace events, and a longer
trace. The ranks of a job with a late rank (``multi_rank``, ``make_job``) are :mod:`trainperf.tracegen.ranks`.

Both work over the raw Chrome-trace events (no dependency on the reader) and write their output as a
stream, event by event, so they can make traces far larger than memory would hold as Python objects.

``trainperf.tracegen.ranks.multi_rank(src, out_dir, world=4, straggler=2, slowdown=1.3)`` writes ``world`` copies of one rank in
which rank ``straggler``'s compute kernels take ``slowdown`` times longer and every other rank's
collectives wait for it. The slow rank's timeline is warped: ``W(t) = t + (slowdown - 1) * C(t)``, where
``C(t)`` is the GPU time covered by compute kernels (the union of every non-communication kernel, across
streams) before ``t``; so each compute kernel lasts exactly ``slowdown`` times longer, everything after it
moves later, and its communication kernels keep their length (that rank arrives last at each
collective, so it does not wait). The other ranks keep their own timeline shifted per profiler step so
that every step starts when the slow rank's does, and each of their communication kernels starts on
time and ends when the slow rank's copy of it ends: it is longer by exactly the time it waited. The
profiler-step spans of every rank end where the slow rank's do, so wall-clock step times are equal and
only compute tells the straggler apart (the fast ranks have the most GPU kernel time). The answers are
returned (and written as ``truth.json``): the straggler, each rank's compute per step, and each rank's
wait on every collective (the injected stretch of its kernel), per step and in total.

``repeat(src, out, times=16, layout="lines"|"single")`` writes a trace ``times`` times longer: the events
repeated with their timestamps shifted by the trace's span, ids (correlation, external id, flow ids)
renumbered and profiler steps renumbered; ``layout="lines"`` writes one event per line as torch does,
``"single"`` one line as tools that re-save traces do.

The input trace is read whole (``json.load``): it is one real rank of a few MB. Which kernel is
communication: ``trainperf.trace.classify_kernel`` when it is there, else a plain name match.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import msgspec

_COMM_RE = re.compile(r"nccl|rccl|all_?to_?all|all_?gather|reduce_?scatter|all_?reduce|sendrecv|nvshmem|"
                      r"deep_?ep|dispatch|combine|notify", re.I)
KERNEL_CATS = {"kernel", "Kernel"}
GPU_CATS = KERNEL_CATS | {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def default_is_comm(name: str) -> bool:
    try:
        from trainperf.trace import classify_kernel  # the one pattern table, when the reader provides it
    except ImportError:
        return bool(_COMM_RE.search(name))
    return classify_kernel(name) == "communication"


# ---------------------------------------------------------------------------- reading and writing
def load_trace(path: str | Path) -> tuple[dict, list[dict]]:
    """(everything but traceEvents, the events) of a small trace file (.json or .json.gz)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as f:
        d = json.load(f)
    events = d.pop("traceEvents", None)
    if not isinstance(events, list):
        raise ValueError(f"{p}: no traceEvents list")
    return d, events


def num(x: float) -> float | int:
    if isinstance(x, float) and not x.is_integer():
        return round(x, 3)
    return int(x) if isinstance(x, float) and abs(x) < 2**53 else x


def write_trace(path: str | Path, meta: dict, events: Iterable[dict], *, layout: str = "lines") -> Path:
    """Write a Chrome trace as a stream: the metadata first, then ``traceEvents`` one event at a time
    (``layout="lines"``: one per line, as torch writes them; ``"single"``: the whole file one line).
    ``.gz`` names are gzipped. Written to a temporary name and renamed."""
    if layout not in ("lines", "single"):
        raise ValueError(f"layout={layout!r}: use 'lines' or 'single'")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    opener = (lambda q: gzip.open(q, "wt", encoding="utf-8", compresslevel=3)) if p.name.endswith(".gz") else (
        lambda q: open(q, "w", encoding="utf-8"))
    nl = "\n" if layout == "lines" else ""
    sep = (",", ": ") if layout == "lines" else (",", ":")
    with opener(tmp) as f:
        f.write("{" + nl)
        for k, v in meta.items():
            f.write(f"{json.dumps(k)}:{json.dumps(v, separators=sep)},{nl}")
        f.write('"traceEvents":[' + nl)
        first = True
        buf: list[str] = []
        enc = msgspec.json.Encoder()  # 10x json.dumps; compact separators in both layouts
        for e in events:
            buf.append(("" if first else "," + nl) + enc.encode(e).decode())
            first = False
            if len(buf) >= 4096:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf) + nl + "]}" + nl)
    tmp.replace(p)
    return p


# ---------------------------------------------------------------------------- a longer trace
_ID_KEYS = ("correlation", "External id", "external id", "Ev Idx", "Record function id")


def repeat(src: str | Path, out: str | Path, *, times: int = 16, layout: str = "lines") -> dict:
    """Write ``src``'s events ``times`` times, each copy shifted past the previous one. Returns
    {"events", "steps", "path"}."""
    if times < 1:
        raise ValueError(f"times={times}: need >= 1")
    meta, events = load_trace(src)
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") if isinstance(e.get("dur"), (int, float)) else 0) for e in timed)
    span = (t1 - t0) * 1.01 + 1000.0
    max_id = {k: 0 for k in _ID_KEYS}
    max_flow = 0
    step_nums = []
    for e in events:
        a = e.get("args") or {}
        for key in _ID_KEYS:
            v = a.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                max_id[key] = max(max_id[key], v)
        if isinstance(e.get("id"), int):
            max_flow = max(max_flow, e["id"])
        m = STEP_RE.match(str(e.get("name", "")))
        if m and e.get("cat") != "gpu_user_annotation":
            step_nums.append(int(m.group(1)))
    id_off = max(max_id.values()) + 1  # one offset for every id key: correlation and External id stay paired
    n_steps = (max(step_nums) - min(step_nums) + 1) if step_nums else 0

    def gen() -> Iterator[dict]:
        for c in range(times):
            for e in events:
                if c and e.get("ph") == "M":
                    continue  # metadata once
                if c == 0:
                    yield e
                    continue
                e2 = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e2["ts"] = num(e["ts"] + c * span)
                if isinstance(e.get("id"), int) and not isinstance(e.get("id"), bool):
                    e2["id"] = e["id"] + c * (max_flow + 1) if e.get("cat") not in ("ac2g",) else e["id"] + c * id_off
                m = STEP_RE.match(str(e.get("name", "")))
                if m and n_steps:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + c * n_steps}"
                a = e.get("args")
                if isinstance(a, dict):
                    a2 = dict(a)
                    for key in _ID_KEYS:
                        v = a.get(key)
                        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                            a2[key] = v + c * id_off
                    e2["args"] = a2
                yield e2

    p = write_trace(out, meta, gen(), layout=layout)
    n = len(events) + (times - 1) * sum(1 for e in events if e.get("ph") != "M")
    return {"path": str(p), "events": n, "steps": n_steps * times}


__all__ = ["default_is_comm", "load_trace", "num", "repeat", "write_trace"]

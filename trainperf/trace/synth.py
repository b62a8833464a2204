"""Traces made from a real one, with known answers: several ranks with a straggler, and a longer trace.

Both work over the raw Chrome-trace events (no dependency on the reader) and write their output as a
stream, event by event, so they can make traces far larger than memory would hold as Python objects.

``multi_rank(src, out_dir, world=4, straggler=2, slowdown=1.3)`` writes ``world`` copies of one rank in
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

import bisect
import gzip
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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


def _num(x: float) -> float | int:
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
        for e in events:
            buf.append(("" if first else "," + nl) + json.dumps(e, separators=sep))
            first = False
            if len(buf) >= 4096:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf) + nl + "]}" + nl)
    tmp.replace(p)
    return p


# ---------------------------------------------------------------------------- intervals
def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class _Covered:
    """C(t): the length of a union of intervals that lies before t."""

    def __init__(self, union: list[tuple[float, float]]):
        self.starts = [s for s, _ in union]
        self.ends = [e for _, e in union]
        self.prefix = [0.0]
        for s, e in union:
            self.prefix.append(self.prefix[-1] + (e - s))

    def __call__(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t)  # intervals starting at or before t
        if i == 0:
            return 0.0
        return self.prefix[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]

    def within(self, a: float, b: float) -> float:
        return self(b) - self(a)


def _is_kernel(e: dict) -> bool:
    return e.get("ph") == "X" and e.get("cat") in KERNEL_CATS and isinstance(e.get("dur"), (int, float))


def _stream(e: dict) -> Any:
    a = e.get("args") or {}
    return a.get("stream", e.get("tid"))


def _steps(events: list[dict]) -> list[tuple[float, float]]:
    """Start and end of each profiler step (CPU-side spans), in time order."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
                   and e.get("cat") not in GPU_CATS and e.get("cat") != "gpu_user_annotation"
                   and STEP_RE.match(str(e.get("name", ""))) and isinstance(e.get("dur"), (int, float)))
    return spans


# ---------------------------------------------------------------------------- several ranks
def multi_rank(src: str | Path, out_dir: str | Path, *, world: int = 4, straggler: int = 2,
               slowdown: float = 1.3, is_comm: Callable[[str], bool] | None = None,
               name: str = "rank{rank}.pt.trace.json.gz", layout: str = "lines") -> dict:
    """Write ``world`` ranks made from the one rank in ``src``; returns (and writes to truth.json) what a
    reader should find. See the module docstring for the construction."""
    if world < 2 or not 0 <= straggler < world or slowdown < 1:
        raise ValueError(f"world={world}, straggler={straggler}, slowdown={slowdown}: need world >= 2, "
                         "0 <= straggler < world, slowdown >= 1")
    is_comm = is_comm or default_is_comm
    meta, events = load_trace(src)
    out = Path(out_dir)
    comm_ids = {i for i, e in enumerate(events) if _is_kernel(e) and is_comm(str(e.get("name", "")))}
    compute = _union([(e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(events)
                      if _is_kernel(e) and i not in comm_ids and e["dur"] > 0])
    cov = _Covered(compute)
    k = slowdown - 1.0

    def warp(t: float) -> float:
        return t + k * cov(t)

    steps = _steps(events)
    starts = [s for s, _ in steps]

    def step_of(t: float) -> int | None:
        if not steps:
            return 0
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 else None

    shift = [warp(s) - s for s in starts] or [0.0]
    base_compute = [cov.within(s, e) for s, e in steps] or [cov(math.inf)]
    truth: dict[str, Any] = {"source": str(src), "world": world, "straggler": straggler, "slowdown": slowdown,
                             "steps": len(steps) or 1, "comm_kernels": len(comm_ids), "ranks": {}}
    order = sorted(comm_ids, key=lambda i: events[i]["ts"])
    for rank in range(world):
        slow = rank == straggler
        waits: list[float] = []
        waits_by_step = [0.0] * max(1, len(steps))
        new_ts: dict[int, float] = {}  # event index -> its new start (kernels), for their flows
        new_dur: dict[int, float] = {}
        if slow:
            for i, e in enumerate(events):
                if "ts" not in e or not isinstance(e.get("ts"), (int, float)):
                    continue
                t0 = warp(e["ts"])
                new_ts[i] = t0
                if isinstance(e.get("dur"), (int, float)):
                    new_dur[i] = e["dur"] if i in comm_ids else warp(e["ts"] + e["dur"]) - t0
            waits = [0.0] * len(order)
        else:
            last_end: dict[Any, float] = {}
            gpu = sorted((i for i, e in enumerate(events) if e.get("ph") == "X" and e.get("cat") in GPU_CATS
                          and isinstance(e.get("dur"), (int, float))), key=lambda i: events[i]["ts"])
            for i in gpu:
                e = events[i]
                st = step_of(e["ts"])
                t0 = e["ts"] + (shift[st] if st is not None else 0.0)
                t0 = max(t0, last_end.get(_stream(e), -math.inf))  # a stream runs one kernel at a time
                if i in comm_ids:
                    end = warp(e["ts"]) + e["dur"]  # when the slow rank's copy of it ends
                    dur = max(e["dur"], end - t0)
                    waits_by_step[st if st is not None else 0] += dur - e["dur"]
                else:
                    dur = e["dur"]
                new_ts[i], new_dur[i] = t0, dur
                last_end[_stream(e)] = t0 + dur
            waits = [new_dur[i] - events[i]["dur"] for i in order]
            for i, e in enumerate(events):
                if i in new_ts or not isinstance(e.get("ts"), (int, float)):
                    continue
                if e.get("ph") == "X" and STEP_RE.match(str(e.get("name", ""))):
                    new_ts[i] = warp(e["ts"])  # every rank's step spans end where the slow rank's do
                    new_dur[i] = warp(e["ts"] + e["dur"]) - new_ts[i]
                    continue
                st = step_of(e["ts"])
                new_ts[i] = e["ts"] + (shift[st] if st is not None else 0.0)
        # flows into a moved kernel follow it (ac2g flows carry the kernel's correlation id)
        corr_ts = {(events[i].get("args") or {}).get("correlation"): new_ts[i] for i in new_ts if _is_kernel(events[i])}
        comp = [c * (slowdown if slow else 1.0) for c in base_compute]
        truth["ranks"][rank] = {"compute_us_per_step": comp, "compute_us_mean": sum(comp) / len(comp),
                                "wait_us_per_collective": waits, "wait_us_total": sum(waits),
                                "wait_us_per_step": waits_by_step if not slow else [0.0] * len(waits_by_step),
                                "wait_us_mean_per_step": (sum(waits) / len(waits_by_step)) if not slow else 0.0}

        def gen(rank=rank, new_ts=new_ts, new_dur=new_dur, corr_ts=corr_ts) -> Iterator[dict]:
            for i, e in enumerate(events):
                if i not in new_ts:
                    yield e
                    continue
                e2 = dict(e)
                ts = new_ts[i]
                if e.get("ph") == "f" and e.get("cat") in ("ac2g", "async") and e.get("id") in corr_ts:
                    ts = corr_ts[e["id"]]
                e2["ts"] = _num(ts)
                if i in new_dur:
                    e2["dur"] = _num(new_dur[i])
                yield e2

        m = dict(meta)
        di = dict(m.get("distributedInfo") or {})
        di.update({"rank": rank, "world_size": world})
        di.setdefault("backend", "nccl")
        m["distributedInfo"] = di
        write_trace(out / name.format(rank=rank), m, gen(), layout=layout)
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


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
                    e2["ts"] = _num(e["ts"] + c * span)
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


__all__ = ["default_is_comm", "load_trace", "multi_rank", "repeat", "write_trace"]

"""The ranks of one job, made from one real rank, with known answers: which rank arrives late at the
collectives, why, how long every other rank waits for it, and each host's clock offset.

``make_job(src, out_dir, world=4, late=1, cause="dataloader", late_us=20_000.0, clock_offsets_us={...})`` writes
``world`` copies of the rank in ``src`` (a torch.profiler trace) and returns (and writes as ``truth.json``) what
a reader should find. The construction, over the raw Chrome-trace events (no dependency on the reader):

1. **Every rank** (``dataloader_us > 0``): a DataLoader span (``enumerate(DataLoader)#...__next__``) of
   ``dataloader_us`` at the start of each profiler step. Inserting host time (:func:`insert_host`) moves every
   later host event by its length and stretches the spans around it (the step, the op that called it); a GPU
   event moves by the host time inserted before its launch (its runtime call, by correlation id): in a
   host-bound trace (the real A100 rank's kernels start ~13 us after their launch) the GPU follows the host.
2. **The late rank** ``late``, by ``cause``:

   * ``"compute"``: its compute kernels take ``slowdown`` times longer. Its timeline is warped:
     ``W(t) = t + (slowdown - 1) * C(t)``, ``C(t)`` the GPU time covered by compute kernels (the union of every
     non-communication kernel) before ``t``: each compute kernel lasts exactly ``slowdown`` times longer,
     everything after it moves later, its communication kernels keep their length;
   * ``"dataloader"``: its DataLoader span is ``late_us`` longer at every step;
   * ``"allocator"``: its host is blocked in ``free_calls`` ``cudaFree`` calls just before it launches the
     ``collective``-th collective of each step (default: the middle one). cudaFree synchronizes the device,
     so the first call also waits for the GPU work launched before it to finish; then they free for
     ``late_us`` in all. The host time they block is the truth's ``allocator_us_per_step``.

3. **The other ranks follow it**: each keeps its own timeline, shifted per profiler step so that every step
   starts when the late rank's does, and each of its communication kernels starts on time and ends when the
   late rank's copy of it ends (a stream runs one kernel at a time): it is longer by exactly the time it
   waited. Their profiler-step spans end where the late rank's do.
4. **Clocks**: every time of rank r is moved by ``clock_offsets_us[r]`` (its host clock's offset), and with
   ``end_jitter_us`` each communication kernel of each rank ends up to that much later (uniform, seeded):
   the spread of a real collective's end across ranks.

``late=None`` writes identical ranks (with their clock offsets and jitter): the shape of a directory for a
scale test. Ranks are written one at a time, streamed (:func:`trainperf.tracegen.synth.write_trace`); the
followers' events are computed once for all of them.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any, Callable, Iterator

from trainperf.tracegen.synth import GPU_CATS, KERNEL_CATS, STEP_RE, default_is_comm, load_trace, num, write_trace

CAUSES = ("compute", "dataloader", "allocator")
DATALOADER_NAME = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
FREE_NAME = "cudaFree"
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "hip_runtime"}
FLOW_CATS = ("ac2g", "async")

Injection = tuple[float, float, list]
"""(host time p, host time inserted at p, [(name, cat, dur, args) laid back to back from p])"""


# ---------------------------------------------------------------------------- intervals
def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class Covered:
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


# ---------------------------------------------------------------------------- events
def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _timed(e: dict) -> bool:
    return _number(e.get("ts")) and e.get("ph") != "M"


def _has_dur(e: dict) -> bool:
    return _number(e.get("dur"))


def _is_kernel(e: dict) -> bool:
    return e.get("ph") == "X" and e.get("cat") in KERNEL_CATS and _has_dur(e)


def _is_gpu(e: dict) -> bool:
    return e.get("ph") == "X" and e.get("cat") in GPU_CATS and _has_dur(e)


def _stream(e: dict) -> Any:
    a = e.get("args") or {}
    return a.get("stream", e.get("tid"))


def _corr(e: dict) -> Any:
    return (e.get("args") or {}).get("correlation")


def step_indices(events: list[dict]) -> list[int]:
    """The indices of the host-side ProfilerStep#N spans, in time order."""
    idx = [i for i, e in enumerate(events) if e.get("ph") == "X" and _timed(e) and _has_dur(e)
           and e.get("cat") not in GPU_CATS and e.get("cat") != "gpu_user_annotation"
           and STEP_RE.match(str(e.get("name", "")))]
    return sorted(idx, key=lambda i: events[i]["ts"])


def _launches(events: list[dict]) -> dict:
    """correlation id -> the start of its runtime call (the launch)."""
    return {_corr(e): e["ts"] for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in RUNTIME_CATS
            and _timed(e) and _corr(e) is not None}


def _fix_flows(events: list[dict]) -> None:
    """Flows into a GPU event (ac2g, carrying its correlation id) follow the event."""
    at = {_corr(e): e["ts"] for e in events if _is_gpu(e) and _corr(e) is not None}
    for i, e in enumerate(events):
        if e.get("ph") == "f" and e.get("cat") in FLOW_CATS and e.get("id") in at and e.get("ts") != at[e["id"]]:
            events[i] = dict(e, ts=at[e["id"]])


def _shifted(e: dict, ts: float, dur: float | None = None) -> dict:
    e2 = dict(e)
    e2["ts"] = ts
    if dur is not None:
        e2["dur"] = dur
    return e2


# ---------------------------------------------------------------------------- transformations
def insert_host(events: list[dict], injections: list[Injection], *, pid: Any = None, tid: Any = None) -> list[dict]:
    """``events`` with host time inserted: at each host time p, d us. A host event starting at or after p
    moves by d, one that spans p is stretched by d; a GPU event moves by the time inserted at or before its
    launch (its runtime call by correlation id; its own start when it has none) and keeps its length. The
    injection's events (``(name, cat, dur, args)``) are appended, laid back to back from p, on ``pid``/``tid``."""
    inj = sorted(injections, key=lambda x: x[0])
    ps = [p for p, _, _ in inj]
    pre = [0.0]
    for _, d, _ in inj:
        pre.append(pre[-1] + d)

    def incl(t: float) -> float:  # host time inserted at or before t
        return pre[bisect.bisect_right(ps, t)]

    def excl(t: float) -> float:  # strictly before t
        return pre[bisect.bisect_left(ps, t)]

    launch = _launches(events)
    out = []
    for e in events:
        if not _timed(e):
            out.append(e)
        elif _is_gpu(e):
            out.append(_shifted(e, e["ts"] + incl(launch.get(_corr(e), e["ts"]))))
        else:
            ts = e["ts"] + incl(e["ts"])
            dur = None
            if _has_dur(e):
                end = e["ts"] + e["dur"]
                dur = max(0.0, end + excl(end) - ts)
            out.append(_shifted(e, ts, dur))
    for p, _, items in inj:
        t = p + excl(p)
        for name, cat, dur, args in items:
            out.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t, "dur": dur,
                        "args": args})
            t += dur
    _fix_flows(out)
    return out


def warp_compute(events: list[dict], comm_ids: set[int], slowdown: float) -> list[dict]:
    """The late rank of cause "compute": every time t moved to W(t) = t + (slowdown - 1) * C(t) (module
    docstring); communication kernels keep their length."""
    compute = _union([(e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(events)
                      if _is_kernel(e) and i not in comm_ids and e["dur"] > 0])
    cov = Covered(compute)
    k = slowdown - 1.0
    out = []
    for i, e in enumerate(events):
        if not _timed(e):
            out.append(e)
            continue
        t0 = e["ts"] + k * cov(e["ts"])
        dur = None
        if _has_dur(e):
            end = e["ts"] + e["dur"]
            dur = e["dur"] if i in comm_ids else end + k * cov(end) - t0
        out.append(_shifted(e, t0, dur))
    _fix_flows(out)
    return out


def follow(base: list[dict], late: list[dict], comm_ids: set[int], steps: list[int]) -> tuple[list[dict], dict]:
    """A rank that keeps its own pace and waits for ``late`` at every collective (module docstring, 3).
    ``base`` and ``late`` hold the same events at the same indices (``late`` may have more after them).
    Returns (its events, {comm index: the time it waited there})."""
    starts = [base[i]["ts"] for i in steps]
    shift = [late[i]["ts"] - base[i]["ts"] for i in steps] or [0.0]

    def step_of(t: float) -> int | None:
        if not starts:
            return 0
        j = bisect.bisect_right(starts, t) - 1
        return j if j >= 0 else None

    out = list(base)
    waits: dict[int, float] = {}
    last_end: dict[Any, float] = {}
    for i in sorted((i for i, e in enumerate(base) if _is_gpu(e)), key=lambda i: base[i]["ts"]):
        e = base[i]
        st = step_of(e["ts"])
        t0 = max(e["ts"] + (shift[st] if st is not None else 0.0), last_end.get(_stream(e), -math.inf))
        dur = e["dur"]
        if i in comm_ids:
            dur = max(e["dur"], late[i]["ts"] + late[i]["dur"] - t0)  # it ends when the late rank's copy ends
            waits[i] = dur - e["dur"]
        out[i] = _shifted(e, t0, dur)
        last_end[_stream(e)] = t0 + dur
    for i, e in enumerate(base):
        if not _timed(e) or _is_gpu(e):
            continue
        if e.get("ph") == "X" and STEP_RE.match(str(e.get("name", ""))):
            out[i] = _shifted(e, late[i]["ts"], late[i].get("dur"))  # every rank's steps end where the late one's do
            continue
        st = step_of(e["ts"])
        out[i] = _shifted(e, e["ts"] + (shift[st] if st is not None else 0.0))
    _fix_flows(out)
    return out, waits


# ---------------------------------------------------------------------------- the job
def _fresh_id(events: list[dict]) -> Iterator[int]:
    top = 0
    for e in events:
        a = e.get("args") or {}
        for k in ("correlation", "External id"):
            if isinstance(a.get(k), int):
                top = max(top, a[k])
    n = top + 1_000_000
    while True:
        n += 1
        yield n


def _drain_before(events: list[dict]) -> Callable[[float], float]:
    """G(p): the end of the last GPU work launched before host time p (when a device sync at p returns)."""
    launch = _launches(events)
    pairs = sorted((launch.get(_corr(e), e["ts"]), e["ts"] + e["dur"]) for e in events if _is_gpu(e))
    keys = [lt for lt, _ in pairs]
    run, best = [], -math.inf
    for _, end in pairs:
        best = max(best, end)
        run.append(best)

    def g(p: float) -> float:
        j = bisect.bisect_left(keys, p)
        return run[j - 1] if j else -math.inf
    return g


def _late_rank(base: list[dict], cause: str, *, comm_ids: set[int], steps: list[int], order: list[int],
               slowdown: float, late_us: float, dataloader_us: float, free_calls: int, collective: int | None,
               ids: Iterator[int], pid: Any, tid: Any) -> tuple[list[dict], list[float], dict]:
    """(the late rank's events, its injected lateness per step, the cause's own truth)."""
    if cause == "compute":
        comp = Covered(_union([(e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(base)
                               if _is_kernel(e) and i not in comm_ids and e["dur"] > 0]))
        spans = [(base[i]["ts"], base[i]["ts"] + base[i]["dur"]) for i in steps] or [(-math.inf, math.inf)]
        extra = [(slowdown - 1) * comp.within(a, b) for a, b in spans]
        return warp_compute(base, comm_ids, slowdown), extra, {"slowdown": slowdown}
    if cause == "dataloader":
        if dataloader_us > 0:  # the span every rank has grows by late_us (a pure delay inside it)
            inj = [(base[i]["ts"] + 1.0 + dataloader_us / 2, late_us, []) for i in steps]
        else:
            inj = [(base[i]["ts"] + 1.0, late_us, [(DATALOADER_NAME, "user_annotation", late_us,
                                                   {"External id": next(ids)})]) for i in steps]
        return (insert_host(base, inj, pid=pid, tid=tid), [late_us] * len(steps),
                {"dataloader_us_per_step": {"late": dataloader_us + late_us, "others": dataloader_us}})
    # allocator: free calls before the chosen collective of each step, on the thread that launches it (the
    # thread the GPU waits for: in a DDP job the autograd thread, not the one that holds the ProfilerStep)
    launch = _launches(base)
    drain = _drain_before(base)
    threads = {_corr(e): (e.get("pid"), e.get("tid")) for e in base if e.get("ph") == "X" and _timed(e)
               and str(e.get("cat", "")).lower() in RUNTIME_CATS and _corr(e) is not None}
    inj, blocked = [], []
    for j, i in enumerate(steps):
        lo, hi = base[i]["ts"], base[i]["ts"] + base[i]["dur"]
        mine = [c for c in order if lo <= base[c]["ts"] < hi]
        if not mine:
            raise ValueError(f"profiler step {j} holds no collective: the allocator case needs one in every step")
        c = mine[len(mine) // 2 if collective is None else min(collective, len(mine) - 1)]
        p = launch.get(_corr(base[c]), base[c]["ts"]) - 0.5
        wait = max(0.0, drain(p) - p)  # cudaFree synchronizes: the first call returns once the device is idle
        each = late_us / free_calls
        items = [(FREE_NAME, "cuda_runtime", (wait if k == 0 else 0.0) + each, {"cbid": 6, "correlation": next(ids)})
                 for k in range(free_calls)]
        inj.append((p, wait + late_us, items))
        blocked.append(wait + late_us)
        pid, tid = threads.get(_corr(base[c]), (pid, tid))
    return (insert_host(base, inj, pid=pid, tid=tid), blocked,
            {"allocator_us_per_step": blocked, "free_us_per_step": late_us, "free_calls_per_step": free_calls})


def _emit(events: list[dict], offset: float, jitter: dict[int, float]) -> Iterator[dict]:
    for i, e in enumerate(events):
        if not _timed(e):
            yield e
            continue
        e2 = dict(e)
        e2["ts"] = num(e["ts"] + offset)
        if _has_dur(e):
            e2["dur"] = num(e["dur"] + jitter.get(i, 0.0))
        yield e2


def make_job(src: str | Path, out_dir: str | Path, *, world: int = 4, late: int | None = 1, cause: str = "compute",
             slowdown: float = 1.3, late_us: float = 20_000.0, dataloader_us: float = 1_000.0, free_calls: int = 4,
             collective: int | None = None, clock_offsets_us: dict[int, float] | None = None,
             end_jitter_us: float = 0.0, seed: int = 0, is_comm: Callable[[str], bool] | None = None,
             name: str = "rank{rank}.pt.trace.json.gz", layout: str = "lines") -> dict:
    """Write ``world`` ranks made from the one rank in ``src``; return (and write to truth.json) what a
    reader should find (module docstring)."""
    if world < 2 or (late is not None and not 0 <= late < world) or slowdown < 1 or late_us < 0 or free_calls < 1 \
            or dataloader_us < 0 or end_jitter_us < 0 or cause not in CAUSES:
        raise ValueError(f"world={world}, late={late}, cause={cause!r}, slowdown={slowdown}, late_us={late_us}, "
                         f"free_calls={free_calls}, dataloader_us={dataloader_us}, end_jitter_us={end_jitter_us}: "
                         f"need world >= 2, 0 <= late < world (or None), cause in {CAUSES}, slowdown >= 1, "
                         "free_calls >= 1 and no negative time")
    offsets = {r: float((clock_offsets_us or {}).get(r, 0.0)) for r in range(world)}
    is_comm = is_comm or default_is_comm
    meta, events = load_trace(src)
    out = Path(out_dir)
    comm_ids = {i for i, e in enumerate(events) if _is_kernel(e) and is_comm(str(e.get("name", "")))}
    order = sorted(comm_ids, key=lambda i: events[i]["ts"])
    steps = step_indices(events)
    if cause in ("dataloader", "allocator") and late is not None and not steps:
        raise ValueError(f"{src}: no ProfilerStep#N spans; the {cause} case injects its time into each step")
    host = events[steps[0]] if steps else {}
    pid, tid = host.get("pid"), host.get("tid")
    ids = _fresh_id(events)
    base = events
    if dataloader_us > 0 and steps:
        base = insert_host(events, [(events[i]["ts"] + 1.0, dataloader_us, [
            (DATALOADER_NAME, "user_annotation", dataloader_us, {"External id": next(ids)})]) for i in steps],
            pid=pid, tid=tid)
    nsteps = max(1, len(steps))
    comp = Covered(_union([(e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(base)
                           if _is_kernel(e) and i not in comm_ids and e["dur"] > 0]))
    base_compute = [comp.within(base[i]["ts"], base[i]["ts"] + base[i]["dur"]) for i in steps] or [comp(math.inf)]
    truth: dict[str, Any] = {"source": str(src), "world": world, "late_rank": late, "cause": cause if late is not None
                             else None, "steps": nsteps, "comm_kernels": len(comm_ids), "dataloader_us": dataloader_us,
                             "clock_offsets_us": offsets,
                             "clock_offset_vs_rank0_us": {r: offsets[r] - offsets[0] for r in range(world)},
                             "end_jitter_us": end_jitter_us, "ranks": {}}
    if late is None:
        late_ev, follower, waits, extra = base, base, {}, [0.0] * nsteps
    else:
        late_ev, extra, own = _late_rank(base, cause, comm_ids=comm_ids, steps=steps, order=order, slowdown=slowdown,
                                         late_us=late_us, dataloader_us=dataloader_us, free_calls=free_calls,
                                         collective=collective, ids=ids, pid=pid, tid=tid)
        follower, waits = follow(base, late_ev, comm_ids, steps)
        truth |= own | {"late_us_per_step": extra, "straggler": late if cause == "compute" else None,
                        "slowdown": slowdown if cause == "compute" else 1.0}
    step_starts = [base[i]["ts"] for i in steps]
    for rank in range(world):
        is_late = rank == late or late is None
        w = [0.0 if is_late else waits.get(i, 0.0) for i in order]
        by_step = [0.0] * nsteps
        for i, x in zip(order, w):
            j = bisect.bisect_right(step_starts, base[i]["ts"]) - 1 if step_starts else 0
            by_step[max(j, 0)] += x
        c = [x * (slowdown if rank == late and cause == "compute" else 1.0) for x in base_compute]
        truth["ranks"][rank] = {"compute_us_per_step": c, "compute_us_mean": sum(c) / len(c),
                                "wait_us_per_collective": w, "wait_us_total": sum(w), "wait_us_per_step": by_step,
                                "wait_us_mean_per_step": sum(w) / nsteps}
        rng = random.Random(f"{seed}:{rank}")
        jitter = {i: rng.uniform(0.0, end_jitter_us) for i in order} if end_jitter_us else {}
        m = dict(meta)
        di = dict(m.get("distributedInfo") or {})
        di.update({"rank": rank, "world_size": world})
        di.setdefault("backend", "nccl")
        if isinstance(di.get("pg_config"), list):  # every process group of the source spans the new job
            di["pg_config"] = [dict(g, pg_size=world, ranks=list(range(world))) if isinstance(g, dict) else g
                               for g in di["pg_config"]]
        m["distributedInfo"] = di
        write_trace(out / name.format(rank=rank), m, _emit(late_ev if rank == late else follower, offsets[rank],
                                                           jitter), layout=layout)
    others = [truth["ranks"][r]["wait_us_mean_per_step"] for r in range(world) if r != late]
    truth["job"] = {"wait_us_per_step": sum(others), "delay_us_per_step": statistics.median(others) if others else 0.0,
                    "late_collectives": sum(1 for i in order if waits.get(i, 0.0) > 0)}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth




def multi_rank(src: str | Path, out_dir: str | Path, *, world: int = 4, straggler: int = 2,
               slowdown: float = 1.3, is_comm: Callable[[str], bool] | None = None,
               name: str = "rank{rank}.pt.trace.json.gz", layout: str = "lines") -> dict:
    """Write ``world`` ranks made from the one rank in ``src``, rank ``straggler`` slower in compute by
    ``slowdown``; returns (and writes to truth.json) what a reader should find. The construction is
    :func:`trainperf.tracegen.ranks.make_job` with ``cause="compute"`` (no DataLoader span added)."""
    if world < 2 or not 0 <= straggler < world or slowdown < 1:
        raise ValueError(f"world={world}, straggler={straggler}, slowdown={slowdown}: need world >= 2, "
                         "0 <= straggler < world, slowdown >= 1")
    return make_job(src, out_dir, world=world, late=straggler, cause="compute", slowdown=slowdown, dataloader_us=0.0,
                    is_comm=is_comm, name=name, layout=layout)


__all__ = ["CAUSES", "Covered", "DATALOADER_NAME", "FREE_NAME", "follow", "insert_host", "make_job", "multi_rank", "step_indices",
           "warp_compute"]

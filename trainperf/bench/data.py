"""``trainperf bench data``: HybridLoader vs torch DataLoader on the same slow source.

Three loaders read the same items from the same simulated slow storage (a real
``time.sleep`` per read, like a network filesystem) and pay the same decode cost
(real CPU work: ``--decode-ms`` of thread CPU time per sample, holding the GIL):

* ``dataloader_default`` -- ``DataLoader(ds, batch_size=B, shuffle=True)`` as most code writes it;
* ``dataloader_tuned``   -- the founding document's settings with the worker fix: workers =
  min(32, usable CPUs / local ranks), pin_memory on CUDA, prefetch_factor=3, persistent workers;
* ``hybrid``             -- HybridLoader, same worker count, a fresh disk cache, IO thread pools; its
  IO threads and prefetch depth derived from the measured read latency, decode time and step time
  (``--io-threads`` fixes the threads);
* ``hybrid_fixed``       -- the same with the former fixed settings (8 IO threads, 3 batches per worker,
  4 ready), for comparison;
* ``torchdata_stateful`` -- a peer: torchdata's ``StatefulDataLoader`` (resumable DataLoader) with the
  tuned settings, on the same source and decode (skipped with a note when torchdata is absent);
* ``mosaic_streaming``   -- a peer: Mosaic ``StreamingDataset``. Not measured: the row says why
  (mosaicml-streaming 0.13 pins transformers<5 and numpy 2.1, and imports torchvision, whose PyPI build
  does not load with a CPU torch 2.13; its shard-file model also needs an MDS copy of the items).

For each: samples/s of the first (cold) epoch, including worker start, and of the
following (warm) epochs; then a loop with a fixed compute time per step (a sleep: on a
GPU the host thread waits while the device computes, so the host CPU stays free for the
loader): a warm-up of a quarter epoch (at least 4 steps; the throughput epochs left every
queue empty, and a training loop refills them at its step rate: ``warmup_wait_s``), then
at least ``WAIT_LOOP_S`` (10) seconds of steps, and at least an epoch of them (steady state). The loop
is cut into ``WAIT_WINDOWS`` (5) windows of equal step counts; the data-wait figure
(``data_wait_fraction``) is the median of the windows' fractions of time spent in ``next()``: a
scheduler hiccup on a shared machine moves one window, not the figure. Beside it: the fraction over
the whole loop (``data_wait_fraction_total``), each window's, and the median, p95 and longest of the
per-step waits (``step_wait_p50_s``, ``step_wait_p95_s``, ``max_step_wait_s``).

``--quick`` (the test suite's seconds-long smoke run) sets only the sizes the user did not give (a
small epoch, short reads, a cheap decode) and a 0.3 s wait loop; ``settings.quick_set`` lists what it
chose.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import sys
import tempfile
import time
import zlib

import numpy as np



class BenchItems:
    """Deterministic items of ``item_bytes`` bytes (uint8), cut from one random buffer."""

    def __init__(self, n: int, item_bytes: int, seed: int = 0):
        self.n, self.item_bytes = n, item_bytes
        self.base = np.random.default_rng(seed).integers(0, 256, size=item_bytes * 2, dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise IndexError(i)
        off = (int(i) * 7919) % self.item_bytes
        return self.base[off:off + self.item_bytes].copy()

    def fingerprint(self) -> str:
        return f"bench:{self.n}:{self.item_bytes}"


class Decode:
    """``ms`` of CPU time per sample (checksumming the bytes, GIL held), then bytes -> float32 features."""

    def __init__(self, ms: float):
        self.s = ms / 1000.0

    def __call__(self, arr: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(arr, dtype=np.uint8)
        end = time.thread_time() + self.s
        acc, chunk = 1, x[:4096].tobytes()  # 4 KiB: zlib keeps the GIL below 5 KiB
        while time.thread_time() < end:
            acc = zlib.adler32(chunk, acc)
        out = x[: x.size // 4 * 4].view(np.uint32).astype(np.float32) * np.float32(1 / 2**32)
        out[0] = acc & 0xFF  # the result depends on the work done
        return out


class _Items:  # torch Dataset: source + decode, a float32 tensor per item
    def __init__(self, src, decode):
        self.src, self.decode = src, decode

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        import torch

        return torch.from_numpy(self.decode(self.src[i]))


KINDS = ("dataloader_default", "dataloader_tuned", "hybrid", "hybrid_fixed", "torchdata_stateful", "mosaic_streaming")
PEERS = ("dataloader_tuned", "torchdata_stateful", "mosaic_streaming")


def _missing_peer(kind: str) -> str | None:
    """Why a peer row cannot run here (None when it can)."""
    if kind == "torchdata_stateful":
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: F401
        except ImportError as exc:
            return f"torchdata is not installed ({exc}): pip install torchdata"
    if kind == "mosaic_streaming":
        try:
            import streaming  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - ImportError, or torchvision failing to load its ops
            return (f"mosaicml-streaming does not import here ({type(exc).__name__}: {str(exc)[:120]}); 0.13 pins "
                    "transformers<5 and numpy 2.1 and needs a torchvision built for this torch")
        return ("not measured: the Mosaic row needs the items written as an MDS directory and read through "
                "StreamingDataset's shard downloads; not implemented in this version")
    return None


DEFAULTS = {"samples": 1024, "batch": 32, "latency_ms": 5.0, "decode_ms": 0.5, "item_kb": 16.0}
"""The sizes a run uses when the user gives none; ``--quick`` takes its own (``QUICK``) for those."""
QUICK = {"samples": 96, "batch": 16, "latency_ms": 2.0, "decode_ms": 0.2, "item_kb": 4.0}
WAIT_LOOP_S = 10.0  # seconds of steady-state steps in the data-wait loop (at least an epoch of them)
QUICK_WAIT_LOOP_S = 0.3
WAIT_WINDOWS = 5  # the loop's windows; the data-wait figure is the median of their fractions


def _settings(args) -> dict:
    """The run's settings. A size left unset (None) takes ``QUICK``'s value under ``--quick``, else ``DEFAULTS``';
    a size the user gave is kept as given, ``--quick`` or not."""
    from trainperf.errors import UserError
    from trainperf.hardware.cpu import loader_workers, usable_cpus

    quick_set = {}
    for k, default in DEFAULTS.items():
        if getattr(args, k, None) is None:
            value = QUICK[k] if args.quick else default
            setattr(args, k, value)
            if args.quick:
                quick_set[k] = value
    if args.epochs < 2:
        raise UserError(f"--epochs {args.epochs}: the bench needs at least 2 (1 cold epoch + 1 warm); give --epochs 2 "
                        "or more")
    loop_s = QUICK_WAIT_LOOP_S if args.quick else WAIT_LOOP_S
    if args.quick:
        quick_set["wait_loop_s"] = loop_s
    workers = args.workers if args.workers is not None else max(1, loader_workers())
    compute = args.compute_ms if args.compute_ms is not None else max(5.0, 1.5 * args.batch * args.decode_ms / workers)
    return {"latency_ms": args.latency_ms, "bandwidth_mb_s": args.bandwidth_mb_s, "item_kb": args.item_kb,
            "decode_ms": args.decode_ms, "samples": args.samples, "batch": args.batch, "epochs": args.epochs,
            "workers": workers, "compute_ms": compute, "io_threads": args.io_threads, "usable_cpus": usable_cpus(),
            "wait_loop_s": loop_s, "wait_windows": WAIT_WINDOWS, "quick": bool(args.quick), "quick_set": quick_set,
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}  # other processes competing for the CPUs


def _epoch_iter(kind: str, state: dict):
    """A function returning one epoch's batches as an iterator."""
    if kind in ("hybrid", "hybrid_fixed"):
        loader, steps = state["loader"], state["steps"]
        return lambda: (loader.next() for _ in range(steps))
    dl = state["loader"]
    return lambda: iter(dl)


def _dataloader(cls, ds, s: dict, cuda: bool):
    """The tuned DataLoader settings (founding document + worker fix), for DataLoader and its peers."""
    return cls(ds, batch_size=s["batch"], shuffle=True, drop_last=True, num_workers=s["workers"], pin_memory=cuda,
               prefetch_factor=3 if s["workers"] else None, persistent_workers=s["workers"] > 0)


def _build(kind: str, src, decode, s: dict, cuda: bool, cache_dir: str):
    import torch

    if kind in ("hybrid", "hybrid_fixed"):
        from trainperf.data.hybrid import HybridLoader
        from trainperf.data.sampler import GlobalBatchSampler

        fixed = kind == "hybrid_fixed"
        sampler = GlobalBatchSampler(len(src), s["batch"], seed=0, drop_last=True)
        loader = HybridLoader(src, sampler, "cuda" if cuda else "cpu", num_workers=s["workers"], prefetch_factor=3,
                              io_threads=8 if fixed else (s["io_threads"] or "auto"), depth=4 if fixed else "auto",
                              cache_dir=os.path.join(cache_dir, kind), cache_max_bytes=50 * 10**9,
                              transform=decode, out_dtype=np.float32, lm=False)
        return {"loader": loader, "steps": sampler.batches_per_epoch}
    ds = _Items(src, decode)
    if kind == "dataloader_default":
        dl = torch.utils.data.DataLoader(ds, batch_size=s["batch"], shuffle=True, drop_last=True)
    elif kind == "torchdata_stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        dl = _dataloader(StatefulDataLoader, ds, s, cuda)
    else:
        dl = _dataloader(torch.utils.data.DataLoader, ds, s, cuda)
    return {"loader": dl}


def _percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (linear between the nearest ranks; ``xs`` not empty): the diagnosis's."""
    from trainperf.diagnosis.run_evidence import _percentile as quantile

    return quantile(xs, q)


def wait_figures(waits: list[float], starts: list[float], end: float, windows: int = WAIT_WINDOWS) -> dict:
    """The data-wait figures of a loop: ``waits[i]`` seconds in ``next()`` for the step that began at
    ``starts[i]``, the loop ending at ``end``. The loop is cut into ``windows`` windows of equal step counts
    (fewer when it has fewer steps); the figure is the median of their wait fractions (a stall of the machine
    moves one window, not the median), with the whole loop's fraction and the per-step median / p95 / max."""
    n = len(waits)
    k = max(1, min(windows, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    edges = list(starts) + [end]
    fracs = []
    for a, b in zip(bounds, bounds[1:]):
        span = edges[b] - edges[a]
        fracs.append(sum(waits[a:b]) / span if span > 0 else 0.0)
    total = end - starts[0]
    return {"data_wait_fraction": statistics.median(fracs),
            "data_wait_fraction_total": sum(waits) / total if total > 0 else 0.0,
            "data_wait_windows": fracs, "step_wait_p50_s": statistics.median(waits),
            "step_wait_p95_s": _percentile(waits, 0.95), "max_step_wait_s": max(waits), "loop_steps": n,
            "loop_s": total}


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its live children (loader workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _measure(kind: str, src, decode, s: dict, cuda: bool, cache_dir: str, bar) -> dict:
    import torch

    n_per_epoch = (s["samples"] // s["batch"]) * s["batch"]
    t0 = time.perf_counter()
    state = _build(kind, src, decode, s, cuda, cache_dir)
    try:
        epoch = _epoch_iter(kind, state)
        dev = torch.device("cuda" if cuda else "cpu")
        times = []
        cpu_warm = 0.0
        for e in range(s["epochs"]):
            t = t0 if e == 0 else time.perf_counter()
            c = _cpu_s()
            for b in epoch():
                b = b.to(dev, non_blocking=True)
                bar.update(1)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            if e > 0:
                cpu_warm += _cpu_s() - c
        # data-wait loop: fixed compute per step. The throughput epochs above drained every queue as fast as
        # the loader could fill it; a training loop consumes at its step rate, so the first steps refill the
        # queues (warm-up, timed apart), then at least wait_loop_s seconds and an epoch of steps are measured
        # (steady state; the iterators run on across epoch boundaries, as a training loop's do)
        compute_s = s["compute_ms"] / 1000.0
        per_epoch = n_per_epoch // s["batch"]
        warmup = max(4, per_epoch // 4)
        min_steps = max(per_epoch, s["wait_windows"])
        it = itertools.chain.from_iterable(epoch() for _ in itertools.count())
        waits, starts = [], []
        t_loop = 0.0
        i = 0
        while True:
            tw = time.perf_counter()
            if i == warmup:
                t_loop = tw
            elif i > warmup and i - warmup >= min_steps and tw - t_loop >= s["wait_loop_s"]:
                break
            b = next(it)
            waits.append(time.perf_counter() - tw)
            starts.append(tw)
            b = b.to(dev, non_blocking=True)
            time.sleep(compute_s)  # the device computes; the host thread waits
            bar.update(1)
            i += 1
        figures = wait_figures(waits[warmup:], starts[warmup:], tw, s["wait_windows"])
        row = {"name": kind, "cold_samples_per_s": n_per_epoch / times[0],
               "warm_samples_per_s": n_per_epoch * (len(times) - 1) / sum(times[1:]),
               **figures, "warmup_steps": warmup, "warmup_wait_s": sum(waits[:warmup]),
               "cold_epoch_s": times[0], "warm_epoch_s": sum(times[1:]) / (len(times) - 1),
               # CPU time of the main process and its workers per warm sample: the loader's cost,
               # unaffected by other processes competing for the CPUs (decode included)
               "warm_cpu_ms_per_sample": 1000 * cpu_warm / (n_per_epoch * (len(times) - 1))}
        if kind in ("hybrid", "hybrid_fixed"):
            st = state["loader"].stats()
            row["stats"] = {k: v for k, v in st.items() if k.startswith("cache_")}
            row["prefetch"] = {k: st[k] for k in ("io_threads", "host_slots", "depth", "plan")}
    finally:  # also on Ctrl-C / SIGTERM: the HybridLoader's workers and shared memory released now
        if kind in ("hybrid", "hybrid_fixed"):
            state["loader"].close()
    return row


def measure(args) -> dict:
    """The loaders side by side on the simulated slow source; the result with per-loader rows."""
    import torch

    from trainperf.data.sources import SlowStorage

    s = _settings(args)
    cuda = torch.cuda.is_available()
    src = SlowStorage(BenchItems(s["samples"], int(s["item_kb"] * 1024)), s["latency_ms"], s["bandwidth_mb_s"])
    decode = Decode(s["decode_ms"])
    kinds = args.only or list(KINDS)
    skipped = {k: why for k in kinds if (why := _missing_peer(k))}
    kinds = [k for k in kinds if k not in skipped]
    per_epoch = s["samples"] // s["batch"]
    # the wait loop is timed: its steps estimated at the compute rate (a data-bound loader takes fewer)
    loop = max(per_epoch, math.ceil(s["wait_loop_s"] / (s["compute_ms"] / 1000.0))) + max(4, per_epoch // 4)
    steps = (per_epoch * s["epochs"] + loop) * len(kinds)
    from tqdm import tqdm

    bar = tqdm(total=steps, desc="bench data", unit="batch", leave=False, file=sys.stderr,
               disable=None if not args.json else True)
    rows = []
    if args.cache_dir:
        from trainperf.runio import ensure_dir

        ensure_dir(args.cache_dir, "--cache-dir")  # a file there, or no parent: exit 2 naming it
        os.makedirs(args.cache_dir, exist_ok=True)
    # a fresh directory each run (inside --cache-dir when given): the first epoch is truly cold
    with tempfile.TemporaryDirectory(prefix="trainperf-cache-", dir=args.cache_dir) as tmp:
        for kind in kinds:
            bar.set_postfix_str(kind)
            rows.append(_measure(kind, src, decode, s, cuda, tmp, bar))
    bar.close()
    by = {r["name"]: r for r in rows}
    summary = {}
    if "hybrid" in by and "dataloader_tuned" in by:
        summary["warm_speedup_vs_tuned"] = by["hybrid"]["warm_samples_per_s"] / by["dataloader_tuned"]["warm_samples_per_s"]
        summary["cold_speedup_vs_tuned"] = by["hybrid"]["cold_samples_per_s"] / by["dataloader_tuned"]["cold_samples_per_s"]
    if "hybrid" in by:  # HybridLoader's warm-epoch throughput over each peer's
        summary["hybrid_warm_ratio_vs"] = {k: by["hybrid"]["warm_samples_per_s"] / by[k]["warm_samples_per_s"]
                                           for k in PEERS if k in by}
        summary["data_wait_fraction"] = {k: by[k]["data_wait_fraction"] for k in by}
    rows += [{"name": k, "skipped": why} for k, why in skipped.items()]
    s["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    out = {"settings": {**s, "device": "cuda" if cuda else "cpu"}, "loaders": rows, "summary": summary,
           "command": "trainperf bench data " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "data"] else [])}
    return out

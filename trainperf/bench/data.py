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
an epoch of steps and at least 3 s of compute, over which the data wait is the fraction of the
loop's time spent in ``next()`` (steady state; ``max_step_wait_s`` its longest single wait).
"""

from __future__ import annotations

import itertools
import math
import os
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


def _settings(args) -> dict:
    from trainperf.hardware.cpu import loader_workers, usable_cpus

    if args.quick:
        args.samples, args.batch = min(args.samples, 96), min(args.batch, 16)
        args.latency_ms, args.decode_ms, args.item_kb = min(args.latency_ms, 2.0), min(args.decode_ms, 0.2), 4.0
    if args.epochs < 2:
        args.epochs = 2
    workers = args.workers if args.workers is not None else max(1, loader_workers())
    compute = args.compute_ms if args.compute_ms is not None else max(5.0, 1.5 * args.batch * args.decode_ms / workers)
    return {"latency_ms": args.latency_ms, "bandwidth_mb_s": args.bandwidth_mb_s, "item_kb": args.item_kb,
            "decode_ms": args.decode_ms, "samples": args.samples, "batch": args.batch, "epochs": args.epochs,
            "workers": workers, "compute_ms": compute, "io_threads": args.io_threads, "usable_cpus": usable_cpus(),
            "wait_loop_s": 0.3 if args.quick else WAIT_LOOP_S,
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


WAIT_LOOP_S = 3.0


def wait_loop_steps(per_epoch: int, compute_s: float, loop_s: float = WAIT_LOOP_S) -> int:
    """Steps the data-wait loop measures: an epoch, and at least ``loop_s`` seconds of compute (a
    fraction of a half-second loop is a few waits' noise)."""
    return max(per_epoch, math.ceil(loop_s / max(compute_s, 1e-4)))


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
        # queues (warm-up, timed apart), then one epoch's worth of steps is measured (steady state; the
        # iterators run on across the epoch boundary, as a training loop's do)
        compute_s = s["compute_ms"] / 1000.0
        per_epoch = n_per_epoch // s["batch"]
        steps = wait_loop_steps(per_epoch, compute_s, s["wait_loop_s"])
        warmup = max(4, per_epoch // 4)
        it = itertools.chain.from_iterable(epoch() for _ in range(math.ceil((warmup + steps) / per_epoch) + 1))
        waits = []
        t_loop = None
        for i in range(warmup + steps):
            if i == warmup:
                t_loop = time.perf_counter()
            tw = time.perf_counter()
            b = next(it)
            waits.append(time.perf_counter() - tw)
            b = b.to(dev, non_blocking=True)
            time.sleep(compute_s)  # the device computes; the host thread waits
            bar.update(1)
        loop_s = time.perf_counter() - t_loop
        wait = sum(waits[warmup:])
        row = {"name": kind, "cold_samples_per_s": n_per_epoch / times[0],
               "warm_samples_per_s": n_per_epoch * (len(times) - 1) / sum(times[1:]),
               "data_wait_fraction": wait / loop_s, "warmup_steps": warmup,
               "warmup_wait_s": sum(waits[:warmup]), "max_step_wait_s": max(waits[warmup:]), "cold_epoch_s": times[0], "warm_epoch_s": sum(times[1:]) / (len(times) - 1),
               "loop_s": loop_s,
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
    loop = wait_loop_steps(per_epoch, s["compute_ms"] / 1000.0, s["wait_loop_s"]) + max(4, per_epoch // 4)
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
    out = {"settings": {**s, "device": "cuda" if cuda else "cpu"}, "loaders": rows, "summary": summary,
           "command": "trainperf bench data " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "data"] else [])}
    return out

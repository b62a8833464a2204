"""HybridLoader: disk cache, host and device prefetch rings, async IO, resumable sampling.

The tiers, from storage to the model::

    source (slow storage)  ->  disk cache (cache.py)  ->  worker IO pools + decode
      -> shared-memory host slots (prefetch.HostPipeline)  ->  device ring (CudaRing / ThreadQueue)
      -> next_batch()

The sampler (sampler.py) runs in the main process only; each batch carries the
sampler state *after* it, and ``state_dict()`` returns the state of the last
batch handed to the trainer, so batches prefetched but not consumed are read
again after a resume: a resumed run sees exactly the remaining order. Every rank
takes the same number of steps (the sampler decides, not the data files) and
workers take whole batches from the main process rather than owning shards, so
few shard files never leave a rank or worker without work.

``build_train_loader`` also builds the ``dataloader`` choice: torch's DataLoader
with the settings of the founding document (corrected worker count) behind the
same interface, for comparison.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections import deque
from typing import Callable

import numpy as np
import torch

from trainperf.data.prefetch_plan import PrefetchPlan, plan_prefetch
from trainperf.data.sampler import GlobalBatchSampler
from trainperf.data.sources import BadSample, fingerprint
from trainperf.errors import DataError


def split_lm(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T + 1) windows -> inputs (B, T) and targets shifted by one (B, T), each contiguous, so a
    user's ``targets.view(-1)`` works (slices of one tensor would be strided views)."""
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def check_shm(needed_bytes: int, *, what: str, path: str = "/dev/shm") -> str | None:
    """A warning when ``needed_bytes`` of shared memory would not fit comfortably in ``path``."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    if needed_bytes > 0.5 * free:
        return (
            f"{what} need {needed_bytes / 2**20:.0f} MiB of shared memory but {path} has {free / 2**20:.0f} MiB free; "
            "workers may fail with 'No space left on device' or a bus error. Lower data.num_workers or "
            "data.prefetch_factor, or enlarge /dev/shm (docker run --shm-size=8g)"
        )
    return None


def _probe_sample(source, transform, skip_bad: bool, reads: int = 1):
    """The first readable sample (decoded), and the median seconds of a source read and of a decode over
    up to ``reads`` samples (the prefetch plan's first measurement, before the workers report theirs)."""
    out, read_s, decode_s = None, [], []
    for i in range(min(len(source), 16 + reads)):
        t0 = time.perf_counter()
        try:
            arr = np.asarray(source[i])
        except BadSample:
            if not skip_bad:
                raise
            continue
        t1 = time.perf_counter()
        arr = np.asarray(transform(arr)) if transform is not None else arr
        read_s.append(t1 - t0)
        decode_s.append(time.perf_counter() - t1)
        out = arr if out is None else out
        if len(read_s) >= reads:
            break
    if out is None:
        raise DataError("the first 16 samples are all unreadable; check the data")
    return out, float(np.median(read_s)), float(np.median(decode_s))


def shard_note(source, ranks: int, workers: int) -> str | None:
    """Users of shard-based loaders hang when shards < ranks x workers; say why this one does not."""
    files = getattr(source, "num_files", None)
    if getattr(source, "layout", None) == "shard" and files is not None and files < ranks * max(workers, 1):
        return (
            f"{files} shard file(s) for {ranks} rank(s) x {max(workers, 1)} worker(s): HybridLoader indexes samples "
            "across shards and hands whole batches to workers, so every rank and worker still gets work and all "
            "ranks take the same number of steps; reads just concentrate on few files"
        )
    return None


class HybridLoader:
    """Batches of this rank's share, prefetched through the cache, host and device tiers.

    ``next_batch(shares=None)`` -> ``(x, y)`` (``lm=True``: int64 (B, T) pairs) or the
    batch tensor; ``state_dict()`` / ``load_state_dict()``; ``close()``. ``stats()``
    reports the time spent waiting for data, cache counters, skipped samples and the prefetch plan.

    ``io_threads="auto"`` / ``depth="auto"`` (the defaults): the IO threads per worker, the host slots
    and the ready batches come from measured rates (:mod:`trainperf.data.prefetch_plan`): the probe
    reads at start, then the workers' own read and decode times and the consumer's step time, planned
    after 8, 16, 32, 64 batches and every 64 after, from the fixed defaults up (settings only grow). An int fixes that setting
    (``depth`` fixed: ``num_workers x prefetch_factor`` host slots, as before).
    """

    REPLAN_AT = (8, 16, 32, 64)
    REPLAN_EVERY = 64
    START_IO_THREADS, START_DEPTH = 8, 4  # auto: the settings before a step is measured

    def __init__(self, source, sampler: GlobalBatchSampler, device: torch.device | str = "cpu", *,
                 num_workers: int = 0, prefetch_factor: int = 3, io_threads: int | str = "auto",
                 depth: int | str = "auto",
                 device_bytes: int = 8 * 2**30, cache_dir: str | None = None, cache_max_bytes: int = 50 * 10**9,
                 on_bad_sample: str = "error", transform: Callable | None = None, out_dtype=np.int64,
                 lm: bool = True, start_method: str = "fork"):
        self.source, self.sampler = source, sampler
        self.device = torch.device(device)
        self.lm = lm
        self.auto_threads, self.auto_depth = io_threads == "auto", depth == "auto"
        self.num_workers = num_workers
        self.device_bytes = device_bytes
        self.skip_bad = on_bad_sample == "skip"
        self.out_dtype = np.dtype(out_dtype)
        self.wait_s = 0.0
        self.last_wait_s = 0.0
        self.batches = 0
        self._warned: set[str] = set()
        self._n_skipped_seen = 0
        self.skipped: list = []  # (index, file, reason) of skipped samples in the batches handed out
        self._shares: tuple | None = None
        self._state = sampler.state_dict()  # after the last batch handed out
        self._tier = None
        self.pipe = None

        cache_args = None
        if cache_dir:
            from trainperf.data.cache import DiskCache

            ns = fingerprint(source)
            probe = DiskCache(cache_dir, cache_max_bytes, ns)
            self._warn(*probe.warnings)
            if probe.readable:
                cache_args = (cache_dir, cache_max_bytes, ns)
        self.cache_args = cache_args

        sample, self.probe_read_s, self.probe_decode_s = _probe_sample(
            source, transform, self.skip_bad, reads=3 if (self.auto_threads or self.auto_depth) else 1)
        self.sample_shape = tuple(sample.shape)
        local = sampler.global_batch // sampler.world
        self._steps: deque = deque(maxlen=32)  # the consumer's seconds between batches (its data wait left out)
        self._returned: float | None = None
        self.plan = self._plan(None)  # for the record: auto settings start at the fixed ones and grow from the
        # first plan with a measured step (an unknown step would be sized for the fastest the workers can go)
        self.depth = self.START_DEPTH if self.auto_depth else int(depth)
        io_threads = self.START_IO_THREADS if self.auto_threads else int(io_threads)
        slots = max(1, num_workers) * prefetch_factor
        note = shard_note(source, sampler.world, num_workers)
        if note:
            self._warn(note)
        if num_workers:
            per = local * int(np.prod(self.sample_shape, dtype=np.int64)) * self.out_dtype.itemsize
            msg = check_shm(slots * per, what=f"{num_workers} workers x prefetch {prefetch_factor} x {per} batch bytes")
            if msg:
                self._warn(msg)
        self.pipe = _host_pipeline(source, num_workers, slots, local, self.sample_shape, self.out_dtype, transform,
                                   cache_args, io_threads, self.skip_bad, start_method)
        self._start_tier()

    # -- the prefetch plan ---------------------------------------------------------------------
    def _plan(self, step_s: float | None) -> PrefetchPlan:
        """The plan from what is measured now: the workers' mean read (misses) and serial time per sample
        when they have reported, else the probe's; misses assumed for every read (a cold epoch, evictions)."""
        st = self.pipe.stats if self.pipe is not None else {}
        read = st["io_read_s"] / st["io_reads"] if st.get("io_reads") else self.probe_read_s
        serial = st["io_serial_s"] / st["io_samples"] if st.get("io_samples") else self.probe_decode_s
        return plan_prefetch(batch=self.sampler.global_batch // self.sampler.world, read_s=read, serial_s=serial,
                             workers=self.num_workers, step_s=step_s)

    def _replan(self) -> None:
        """Settings only grow (a restart drops the batches read ahead: the loader does not shrink them for a
        step that got slower for a while)."""
        self.plan = new = self._plan(float(np.median(self._steps)))
        if self.auto_threads and new.io_threads > self.pipe.io_threads:
            self.pipe.set_io_threads(new.io_threads)  # no restart: the workers' pools grow
        if self.auto_depth and (new.slots > self.pipe.n_slots or new.depth > self.depth):
            self.pipe.n_slots, self.depth = max(new.slots, self.pipe.n_slots), max(new.depth, self.depth)
            self._restart(shares=self._shares, resize=True)  # batches read ahead are read again: same order

    # -- tiers -------------------------------------------------------------------------------
    def _produce(self, stop):
        p = self.pipe
        while p.can_submit():
            idx = self.sampler.next_local(self._shares)
            p.submit(idx, self.sampler.state_dict())
        r = p.get(stop=stop)
        if r is None:
            return None
        state, view, slot, skipped = r
        return (state, skipped), view, lambda: p.release(slot)

    def _start_tier(self) -> None:
        from trainperf.data.prefetch import CudaRing, ThreadQueue

        if self.device.type == "cuda":
            shape = (self.pipe.slot_samples, *self.sample_shape)
            self._tier = CudaRing(self._produce, self.depth, self.device, shape,
                                  torch.from_numpy(np.empty(0, self.out_dtype)).dtype, self.device_bytes)
        else:
            self._tier = ThreadQueue(self._produce, self.depth)

    def _restart(self, state: dict | None = None, shares: tuple | None = None, resize: bool = False) -> None:
        """Stop prefetching, drop what was read ahead, continue from ``state`` (default: the consumed one)."""
        self._tier.shutdown()
        self.pipe.drain()
        self.sampler.load_state_dict(state if state is not None else self._state)
        self._state = self.sampler.state_dict()
        self._shares = shares
        need = max(shares) if shares else self.sampler.global_batch // self.sampler.world
        if resize or need > self.pipe.slot_samples:
            self.pipe.resize(max(need, self.pipe.slot_samples))
        self._start_tier()

    # -- the trainer's interface ---------------------------------------------------------------
    def next(self) -> torch.Tensor:
        t0 = time.perf_counter()
        if self._returned is not None:
            self._steps.append(t0 - self._returned)  # the consumer's step since the last batch
        tag, batch = self._tier.next()
        self.batches += 1
        self._state, skipped = tag
        self.skipped.extend(skipped)
        self._report()
        if self._steps and (self.batches in self.REPLAN_AT or self.batches % self.REPLAN_EVERY == 0):
            self._replan()  # a restart (drain of the batches in flight) is data wait too
        self._returned = time.perf_counter()
        self.last_wait_s = self._returned - t0
        self.wait_s += self.last_wait_s
        if batch.device != self.device:
            batch = batch.to(self.device)
        return batch

    def next_batch(self, shares=None):
        shares = tuple(int(s) for s in shares) if shares is not None else None
        if shares != self._shares:
            if shares is not None and sum(shares) != self.sampler.global_batch:
                raise ValueError(f"shares {list(shares)} do not sum to the global batch {self.sampler.global_batch}")
            self._restart(shares=shares)
        b = self.next()
        return split_lm(b) if self.lm else b  # (B, T), (B, T), contiguous

    def state_dict(self) -> dict:
        return {"sampler": dict(self._state)}

    def load_state_dict(self, state: dict) -> None:
        self._restart(state=state["sampler"], shares=self._shares)

    def stats(self) -> dict:
        out = {"batches": self.batches, "data_wait_s": self.wait_s, "last_data_wait_s": self.last_wait_s,
               "skipped_samples": len(self.skipped)}
        if self.pipe:
            out.update({f"cache_{k}": v for k, v in self.pipe.stats.items() if not k.startswith("io_")})
            out.update({"io_threads": self.pipe.io_threads, "host_slots": self.pipe.n_slots, "depth": self.depth,
                        "plan": self.plan.as_dict()})
        return out

    def close(self) -> None:
        if self._tier is not None:
            self._tier.shutdown()
            self._tier = None
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- reporting ---------------------------------------------------------------------------
    def _warn(self, *messages: str) -> None:
        for m in messages:
            if m not in self._warned:
                self._warned.add(m)
                warnings.warn(m, RuntimeWarning, stacklevel=3)

    def _report(self) -> None:
        p = self.pipe
        if p.new_warnings:
            self._warn(*p.new_warnings)
            p.new_warnings.clear()
        n = len(self.skipped)
        if n > self._n_skipped_seen:
            if self._n_skipped_seen == 0:
                i, f, why = self.skipped[0]
                self._warn(f"skipped unreadable sample {i} ({f}): {why} (data.on_bad_sample=skip; "
                           "the batch keeps its size by repeating a good sample; stats() counts skips)")
            self._n_skipped_seen = n


def _host_pipeline(source, num_workers, slots, local, shape, dtype, transform, cache_args, io_threads, skip_bad,
                   start_method):
    from trainperf.data.prefetch import HostPipeline

    return HostPipeline(source, num_workers=num_workers, slots=slots, slot_samples=local, sample_shape=shape,
                        out_dtype=dtype, transform=transform, cache_args=cache_args, io_threads=io_threads,
                        skip_bad=skip_bad, start_method=start_method)


# --------------------------------------------------------------------------- torch DataLoader
class _Samples(torch.utils.data.Dataset):
    def __init__(self, source, transform, skip_bad: bool):
        self.source, self.transform, self.skip_bad = source, transform, skip_bad

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        try:
            arr = np.asarray(self.source[i])
        except BadSample as exc:
            if self.skip_bad:
                return exc
            raise
        return self.transform(arr) if self.transform is not None else arr


def _collate(items, dtype=np.int64):
    good = [a for a in items if not isinstance(a, BadSample)]
    if not good:
        raise DataError(f"every sample of a batch is unreadable (first: {items[0]})")
    return torch.from_numpy(np.stack([a if not isinstance(a, BadSample) else good[0] for a in items]).astype(dtype))


class _Batches:
    """An endless batch sampler over GlobalBatchSampler that records the state after each batch."""

    def __init__(self, owner: "DataLoaderLoader"):
        self.owner = owner

    def __iter__(self):
        o = self.owner
        while True:
            idx = o.sampler.next_local(o._shares)
            o._states.append(o.sampler.state_dict())
            yield idx.tolist()


class DataLoaderLoader:
    """torch DataLoader (workers, pin_memory, prefetch_factor, persistent workers) behind the trainer's interface."""

    def __init__(self, source, sampler: GlobalBatchSampler, device, *, num_workers: int, pin_memory: bool,
                 prefetch_factor: int = 3, on_bad_sample: str = "error", transform=None, lm: bool = True):
        from collections import deque

        self.sampler, self.device, self.lm = sampler, torch.device(device), lm
        self._states: deque = deque()
        self._state = sampler.state_dict()
        self._shares = None
        self.wait_s = self.last_wait_s = 0.0
        self.batches = 0
        kw = dict(num_workers=num_workers, pin_memory=pin_memory and self.device.type == "cuda",
                  collate_fn=_collate)
        if num_workers:
            kw.update(prefetch_factor=prefetch_factor, persistent_workers=True)
        self.dl = torch.utils.data.DataLoader(_Samples(source, transform, on_bad_sample == "skip"),
                                              batch_sampler=_Batches(self), **kw)
        self._it = iter(self.dl)

    def _restart(self, state=None):
        self.sampler.load_state_dict(state if state is not None else self._state)
        self._state = self.sampler.state_dict()
        self._states.clear()
        self._it = iter(self.dl)

    def next_batch(self, shares=None):
        shares = tuple(int(s) for s in shares) if shares is not None else None
        if shares != self._shares:
            self._shares = shares
            self._restart()
        t0 = time.perf_counter()
        b = next(self._it)
        self.last_wait_s = time.perf_counter() - t0
        self.wait_s += self.last_wait_s
        self.batches += 1
        self._state = self._states.popleft()
        b = b.to(self.device, non_blocking=b.is_pinned())
        return split_lm(b) if self.lm else b

    def state_dict(self) -> dict:
        return {"sampler": dict(self._state)}

    def load_state_dict(self, state: dict) -> None:
        self._restart(state["sampler"])

    def stats(self) -> dict:
        return {"batches": self.batches, "data_wait_s": self.wait_s, "last_data_wait_s": self.last_wait_s}

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()  # now, not at garbage collection (persistent workers)
        self.dl._iterator = None


# --------------------------------------------------------------------------- config
def build_train_loader(cfg, source, sampler: GlobalBatchSampler, device):
    """The loader for ``data.loader`` in hybrid / dataloader, with settings from the (resolved) config."""
    d = cfg.data
    if d.num_workers == "auto" or d.pin_memory == "auto":
        from trainperf.hardware.cpu import loader_workers

        workers = loader_workers() if d.num_workers == "auto" else d.num_workers
        pin = torch.device(device).type == "cuda" if d.pin_memory == "auto" else d.pin_memory
    else:
        workers, pin = int(d.num_workers), bool(d.pin_memory)
    if d.loader == "dataloader":
        return DataLoaderLoader(source, sampler, device, num_workers=workers, pin_memory=pin,
                                prefetch_factor=d.prefetch_factor, on_bad_sample=d.on_bad_sample)
    return HybridLoader(source, sampler, device, num_workers=workers, prefetch_factor=d.prefetch_factor,
                        io_threads=d.prefetch.io_threads, depth=d.prefetch.depth,
                        device_bytes=d.prefetch.device_bytes, cache_dir=d.cache.dir,
                        cache_max_bytes=d.cache.max_bytes, on_bad_sample=d.on_bad_sample)

"""Host and device prefetch tiers of the HybridLoader.

Host tier (:class:`HostPipeline`): ``num_workers`` worker processes (or one
in-process thread when ``num_workers=0``) each own an IO thread pool. The main
process sends a task per batch (its sample indices and a slot of a ring of
shared-memory batch buffers); the worker issues every read of the batches it
holds at once on its pool (async IO: cache lookup, else the source, then a
cache write), decodes the samples in order and writes them into the slot.
Results come back in submission order. Workers only hold numpy metadata, so
their memory stays flat; a worker that dies is reported, never waited on.

Device tier: :class:`CudaRing` preallocates device buffers (bounded in bytes)
and fills them on a side CUDA stream; the compute stream waits on the event of
the batch it uses only. :class:`ThreadQueue` is the CPU stand-in with the same
interface: a bounded queue filled by a background thread.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from trainperf.data.prefetch_plan import IoClock
from trainperf.data.sources import BadSample, describe
from trainperf.errors import DataError

POLL_S = 0.5


# --------------------------------------------------------------------------- worker
class _Ready:
    """A finished read (a cache hit served inline), shaped like a Future."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _fetch(source, cache, i: int, clock: IoClock | None = None):
    """Read sample i from the source (a cache miss), then cache it. Returns the array or a BadSample."""
    t0 = time.perf_counter()
    try:
        arr = np.asarray(source[i])
    except BadSample as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a source's own failure, reported with its index and file
        return BadSample(i, describe(source, i), f"{type(exc).__name__}: {exc}")
    if clock is not None:
        clock.read(time.perf_counter() - t0)
    if cache is not None:
        cache.put_async(i, arr)  # write behind: the batch does not wait for the cache write
    return arr


def _issue(pool, source, cache, idx, clock: IoClock | None = None) -> list:
    """Start every read of a batch: cache hits inline (a local file read costs less than a thread
    hand-off), misses on the IO pool, where their latency overlaps."""
    out = []
    for i in idx:
        arr = cache.get(int(i)) if cache is not None else None
        out.append(_Ready(arr) if arr is not None else pool.submit(_fetch, source, cache, int(i), clock))
    return out


def worker_loop(wid: int, source, transform, cache_args, io_threads: int, skip_bad: bool,
                tasks, results, sample_shape, out_dtype, parent_pid: int | None) -> None:
    """Serve batch tasks ``(seq, indices, buffer_name, offset)`` until ``None``; ``("io_threads", n)``
    resizes the IO pool (reads already issued finish on the old one).

    Replies ``(seq, wid, "ok", n, skipped, stats)`` or ``(seq, wid, "error", exc, None, stats)``.
    """
    if parent_pid is not None:  # a worker process: the main process handles Ctrl-C (trainperf/interrupt.py)
        from trainperf.interrupt import worker_signals

        worker_signals()
        # Objects inherited from the parent move to the permanent generation: the cyclic GC
        # never walks them, so it does not write to (and copy) the parent's pages.
        import gc

        gc.freeze()
    cache = None
    if cache_args is not None:
        from trainperf.data.cache import DiskCache

        cache = DiskCache(*cache_args)
    buffers: dict = {}
    warned: set = set()
    pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix=f"trainperf-io{wid}")
    pending: deque = deque()
    clock = IoClock()

    def take(block: bool) -> bool:
        nonlocal pool
        try:
            task = tasks.get(timeout=POLL_S) if block else tasks.get_nowait()
        except queue.Empty:
            return True
        if task is None:
            return False
        if task[0] == "io_threads":  # the prefetch plan grew: a larger pool for the reads issued from now on
            old, pool = pool, ThreadPoolExecutor(max_workers=int(task[1]), thread_name_prefix=f"trainperf-io{wid}")
            old.shutdown(wait=False)
            return True
        seq, idx, buf_name, offset = task
        t0 = time.perf_counter()
        pending.append((seq, idx, buf_name, offset, _issue(pool, source, cache, idx, clock)))
        clock.serial_s += time.perf_counter() - t0  # cache hits are read inline
        return True

    running = True
    try:
        while running or pending:
            if running and not pending:
                running = take(block=True)
                if parent_pid is not None and os.getppid() != parent_pid:
                    return  # orphaned: the main process is gone
                continue
            while running:  # read ahead: issue the reads of every batch already queued
                before = len(pending)
                running = take(block=False)
                if len(pending) == before:
                    break
            if not pending:
                continue
            seq, idx, buf_name, offset, futures = pending.popleft()
            try:
                out = _attach(buffers, buf_name, offset, len(idx), sample_shape, out_dtype)
                skipped, good = [], None
                for j, fut in enumerate(futures):
                    arr = fut.result()
                    if isinstance(arr, BadSample):
                        if not skip_bad:
                            raise arr
                        skipped.append((arr.index, arr.file, arr.reason))
                        continue
                    t0 = time.perf_counter()
                    out[j] = transform(arr) if transform is not None else arr
                    clock.serial_s += time.perf_counter() - t0  # decode: the worker's serial work
                    good = j
                clock.samples += len(futures)
                if good is None:
                    raise DataError(f"every sample of a batch is unreadable (first: {skipped[0][1]}: {skipped[0][2]})")
                for j, fut in enumerate(futures):  # fill skipped places with a good sample: shapes stay equal
                    if isinstance(fut.result(), BadSample):
                        out[j] = out[good]
                stats = {**(cache.stats if cache is not None else {}), **clock.stats()}
                for w in (cache.warnings if cache is not None else []):
                    if w not in warned:
                        warned.add(w)
                        stats.setdefault("warnings", []).append(w)
                out = None  # no view left on the buffer
                results.put((seq, wid, "ok", len(idx), skipped, stats))
            except Exception as exc:  # noqa: BLE001 - sent to the main process, which raises it
                if not isinstance(exc, DataError):
                    exc = DataError(f"loader worker {wid}: {type(exc).__name__}: {exc}")
                results.put((seq, wid, "error", exc, None,
                             {**(cache.stats if cache is not None else {}), **clock.stats()}))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if cache is not None:
            cache.flush()
        out = None
        for b in buffers.values():
            try:
                b.close()
            except BufferError:
                pass


def _attach(buffers: dict, name, offset: int, n: int, shape, dtype) -> np.ndarray:
    if isinstance(name, np.ndarray):  # in-process mode: the buffer itself
        buf = name
    else:
        if name not in buffers:
            from multiprocessing import shared_memory

            for old in list(buffers):  # the ring was reallocated: drop old mappings
                buffers.pop(old).close()
            buffers[name] = shared_memory.SharedMemory(name=name)
        buf = np.frombuffer(buffers[name].buf, dtype=np.uint8)
    nbytes = n * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return buf[offset:offset + nbytes].view(dtype).reshape((n, *shape))


# --------------------------------------------------------------------------- host pipeline
class HostPipeline:
    """Ring of host batch slots filled by workers; results in submission order."""

    def __init__(self, source, *, num_workers: int, slots: int, slot_samples: int, sample_shape, out_dtype,
                 transform: Callable | None = None, cache_args=None, io_threads: int = 8, skip_bad: bool = False,
                 start_method: str = "fork"):
        self.sample_shape, self.out_dtype = tuple(sample_shape), np.dtype(out_dtype)
        self.num_workers = num_workers
        self.io_threads = io_threads
        self.n_slots = slots
        self.stats: dict = {}
        self._wstats: dict = {}
        self.new_warnings: list[str] = []
        self._seq = 0
        self._next = 0
        self._done: dict = {}
        self._inflight: dict = {}  # seq -> (slot, tag, n)
        self._shm = None
        self._alloc(slot_samples)
        args = (source, transform, cache_args, io_threads, skip_bad)
        if num_workers == 0:
            self.results = queue.Queue()
            self.task_qs = [queue.Queue()]
            self.procs = [threading.Thread(target=worker_loop, daemon=True, name="trainperf-loader",
                                           args=(0, *args, self.task_qs[0], self.results, self.sample_shape,
                                                 self.out_dtype, None))]
        else:
            import multiprocessing as mp

            ctx = mp.get_context(start_method if start_method in mp.get_all_start_methods() else "spawn")
            self.results = ctx.Queue()
            self.task_qs = [ctx.Queue() for _ in range(num_workers)]
            self.procs = [ctx.Process(target=worker_loop, daemon=True, name=f"trainperf-loader-{w}",
                                      args=(w, *args, self.task_qs[w], self.results, self.sample_shape,
                                            self.out_dtype, os.getpid()))
                          for w in range(num_workers)]
        from trainperf.interrupt import starting

        with starting():  # workers begin with Ctrl-C left to this process; a signal now waits for the start
            for p in self.procs:
                p.start()

    # -- slots -------------------------------------------------------------------------------
    @property
    def slot_bytes(self) -> int:
        return self.slot_samples * int(np.prod(self.sample_shape, dtype=np.int64)) * self.out_dtype.itemsize

    def _alloc(self, slot_samples: int) -> None:
        self.slot_samples = slot_samples
        total = max(1, self.n_slots * self.slot_bytes)
        self._release_shm()
        if self.num_workers == 0:
            self._buf = np.empty(total, dtype=np.uint8)
            self._name = self._buf
        else:
            from multiprocessing import shared_memory

            self._shm = shared_memory.SharedMemory(create=True, size=total)
            try:  # reserve the pages now: a full /dev/shm fails here with a message, not SIGBUS later
                os.posix_fallocate(self._shm._fd, 0, total)
            except (OSError, AttributeError) as exc:
                if isinstance(exc, OSError):
                    self._release_shm()
                    raise DataError(
                        f"cannot reserve {total / 2**20:.0f} MiB of shared memory in /dev/shm for "
                        f"{self.n_slots} batch slots ({exc}); lower data.num_workers or data.prefetch_factor "
                        "or the batch, or enlarge /dev/shm (docker: --shm-size)"
                    ) from None
            self._buf = np.frombuffer(self._shm.buf, dtype=np.uint8)
            self._name = self._shm.name
        self.free = deque(range(self.n_slots))

    def _release_shm(self) -> None:
        if self._shm is not None:
            self._buf = None
            try:
                self._shm.close()
                self._shm.unlink()
            except (OSError, BufferError):
                pass
            self._shm = None

    def view(self, slot: int, n: int) -> np.ndarray:
        return _attach({}, self._buf, slot * self.slot_bytes, n, self.sample_shape, self.out_dtype)

    def resize(self, slot_samples: int) -> None:
        """Reallocate the ring for batches of up to ``slot_samples`` (only when nothing is in flight)."""
        if self._inflight or self._done:
            raise RuntimeError("resize() with batches in flight; drain() first")
        self._alloc(slot_samples)

    # -- tasks -------------------------------------------------------------------------------
    def can_submit(self) -> bool:
        return bool(self.free)

    def submit(self, idx: np.ndarray, tag) -> None:
        if len(idx) > self.slot_samples:
            raise ValueError(f"batch of {len(idx)} exceeds slot capacity {self.slot_samples}")
        slot = self.free.popleft()
        seq = self._seq
        self._seq += 1
        self._inflight[seq] = (slot, tag, len(idx))
        w = seq % len(self.task_qs)
        self.task_qs[w].put((seq, np.asarray(idx, dtype=np.int64), self._name, slot * self.slot_bytes))

    def pending(self) -> int:
        return len(self._inflight)

    def set_io_threads(self, n: int) -> None:
        """Every worker's IO pool to ``n`` threads (from the next batch it takes)."""
        if n != self.io_threads:
            self.io_threads = n
            for q in self.task_qs:
                q.put(("io_threads", int(n)))

    def get(self, stop: threading.Event | None = None):
        """The next batch in order: (tag, view, slot, skipped samples). Raises the worker's error; never hangs on a dead worker."""
        seq = self._next
        if seq not in self._inflight:
            raise RuntimeError("get() with nothing submitted")
        while seq not in self._done:
            if stop is not None and stop.is_set():
                return None
            try:
                msg = self.results.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive()
                continue
            self._done[msg[0]] = msg
        _, wid, status, payload, skipped, stats = self._done.pop(seq)
        self._next += 1
        slot, tag, n = self._inflight.pop(seq)
        self._account(wid, stats)
        if status != "ok":
            self.free.append(slot)
            raise payload
        return tag, self.view(slot, n), slot, skipped

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def _account(self, wid: int, stats: dict) -> None:
        """Workers send their cumulative cache counters; the pipeline's are the sums."""
        self.new_warnings.extend(stats.pop("warnings", []))
        self._wstats[wid] = stats
        self.stats = {}
        for st in self._wstats.values():
            for k, v in st.items():
                self.stats[k] = self.stats.get(k, 0) + v

    def _check_alive(self) -> None:
        for w, p in enumerate(self.procs):
            if not p.is_alive():
                code = getattr(p, "exitcode", None)
                why = f"exit code {code}"
                if code is not None and code < 0:
                    why = f"killed by signal {-code}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
                raise DataError(
                    f"data loader worker {w} (pid {getattr(p, 'pid', os.getpid())}) stopped ({why}); "
                    "the batch it held is lost and the run stops here instead of hanging. "
                    "Check memory (dmesg) or run with data.num_workers=0 to see the error in-process."
                )

    def drain(self) -> None:
        """Wait for every batch in flight and free its slot (results are discarded)."""
        while self._inflight:
            try:
                r = self.get()
            except DataError:
                if any(not p.is_alive() for p in self.procs):  # a dead worker: give its slots back
                    for slot, _tag, _n in self._inflight.values():
                        self.free.append(slot)
                    self._inflight.clear()
                    self._next = self._seq
                continue
            self.release(r[2])
        self._done.clear()

    def close(self) -> None:
        for q in self.task_qs:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1  # then stop them: reads in flight are not worth waiting for
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive() and hasattr(p, "terminate"):
                p.terminate()
                p.join(timeout=1)
        if self.num_workers:
            for q in [*self.task_qs, self.results]:
                q.close()
                q.cancel_join_thread()
        self._release_shm()


# --------------------------------------------------------------------------- device tier
class ThreadQueue:
    """CPU device tier: a background thread turns host batches into tensors in a bounded queue.

    ``produce(stop_event)`` returns ``(tag, host_view, release)`` or None to stop; ``next()``
    returns ``(tag, tensor)`` or raises the producer's error.
    """

    def __init__(self, produce: Callable, depth: int, device=None):
        import torch

        self.torch = torch
        self.produce, self.device = produce, device
        self.q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="trainperf-prefetch")
        self.thread.start()

    def _to_tensor(self, view: np.ndarray):
        return self.torch.from_numpy(view.copy())  # the host slot is reused: own the bytes

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                item = self.produce(self.stop)
                if item is None:
                    return
                tag, view, release = item
                t = self._to_tensor(view)
                release()
                self._put((tag, t))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put(exc)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def next(self):
        while True:
            try:
                item = self.q.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.q.empty():
                    raise DataError("the prefetch thread stopped without a batch")
        if isinstance(item, BaseException):
            raise item
        return item

    def shutdown(self) -> None:
        self.stop.set()
        while self.thread.is_alive():
            try:
                while True:
                    self.q.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(timeout=POLL_S)


class CudaRing(ThreadQueue):
    """CUDA device tier: a ring of preallocated device buffers filled on a side stream.

    The background thread waits for a free buffer, queues the host-to-device copy
    on its own stream after the compute stream's "consumed" event for that buffer,
    records a "ready" event, and passes (tag, buffer, event) on. ``next()`` makes
    the compute stream wait for that batch's event only. A buffer is reused two
    ``next()`` calls after it was handed out, so the batch handed out before the
    current one may still be in use by queued work (e.g. the embedding backward).
    """

    def __init__(self, produce: Callable, depth: int, device, shape, dtype, device_bytes: int):
        import torch

        self.torch = torch
        per = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        n = max(3, min(depth + 2, device_bytes // max(per, 1)))
        if n * per > device_bytes:
            import warnings

            warnings.warn(f"data.prefetch.device_bytes={device_bytes} holds fewer than 3 batches of {per} bytes; "
                          f"using 3 device buffers ({3 * per} bytes)", RuntimeWarning, stacklevel=3)
        self.bufs = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n)]
        self.ready = [torch.cuda.Event() for _ in range(n)]
        self.consumed = [torch.cuda.Event() for _ in range(n)]
        self.side = torch.cuda.Stream(device=device)
        self.free_q: queue.Queue = queue.Queue()
        for i in range(n):
            self.free_q.put(i)
        self.held: deque = deque()
        self.staging: dict = {}
        self.device = device
        self.produce = produce
        self.q = queue.Queue(maxsize=max(1, min(depth, n - 2)))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="trainperf-cuda-prefetch")
        self.thread.start()

    def _run(self) -> None:
        torch = self.torch
        try:
            torch.cuda.set_device(self.device)
            while not self.stop.is_set():
                item = self.produce(self.stop)
                if item is None:
                    return
                tag, view, release = item
                i = None
                while i is None and not self.stop.is_set():
                    try:
                        i = self.free_q.get(timeout=POLL_S)
                    except queue.Empty:
                        pass
                if i is None:
                    release()
                    return
                host = torch.from_numpy(view)
                if not host.is_pinned():  # stage through a pinned buffer so the copy is truly async
                    st = self.staging.get(i)
                    if st is None or st.shape != host.shape:
                        st = self.staging[i] = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
                    else:
                        self.ready[i].synchronize()  # its previous copy has left the staging buffer
                    st.copy_(host)
                    release()
                    release = None
                    host = st
                dst = self.bufs[i][: host.shape[0]]
                with torch.cuda.stream(self.side):
                    self.side.wait_event(self.consumed[i])  # compute is done with this buffer
                    dst.copy_(host, non_blocking=True)
                    self.ready[i].record(self.side)
                if release is not None:
                    self.ready[i].synchronize()  # the host slot is reused only after its copy
                    release()
                self._put((tag, (i, dst)))
        except BaseException as exc:  # noqa: BLE001
            self._put(exc)

    def next(self):
        tag, (i, dst) = super().next()
        torch = self.torch
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.ready[i])  # wait for this batch only
        self.held.append(i)
        if len(self.held) > 2:
            j = self.held.popleft()
            self.consumed[j].record(stream)
            self.free_q.put(j)
        return tag, dst

"""Sample sources beyond the token memmap, and a slow-storage wrapper.

Every source is map-style: ``len(src)``, ``src[i] -> np.ndarray`` (one sample),
``src.gather(idx) -> (len(idx), ...)``, ``src.describe(i)`` (where sample i
lives, for error messages) and ``src.fingerprint()`` (identity of the data, used
as the disk cache's namespace, so a changed source never serves stale entries).

* :class:`SampleFiles` -- a directory of sample files: one file per sample
  (``.npy`` arrays or raw tokens) or shard files of raw tokens cut into windows.
  Its index (file names, window offsets) is kept in numpy arrays, not Python
  lists, so forked workers do not copy it page by page as refcounts change.
* :class:`DatasetSource` -- any map-style Dataset from ``"package.module:function"``, one sample per item.
* :class:`PackedRows` -- rows of any length (a tokenized Hugging Face ``datasets`` dataset of dict rows, or
  any map-style or iterable Dataset) packed into windows.
* :class:`SlowStorage` -- adds a real per-read latency and a bandwidth cap, like a
  network filesystem (``data.simulate``).

An unreadable or truncated sample raises :class:`BadSample`, naming the index and
the file; the loaders apply ``data.on_bad_sample`` to it.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
import time
from pathlib import Path

import numpy as np

from trainperf.errors import DataError


class BadSample(DataError):
    """Sample ``index`` (stored in ``file``) could not be read or is truncated."""

    def __init__(self, index: int, file: str, reason: str):
        self.index, self.file, self.reason = int(index), str(file), reason
        super().__init__(
            f"sample {index} ({file}): {reason}; fix or remove the file, "
            "or set data.on_bad_sample=skip to skip bad training samples and count them (every data.loader "
            "honours it; validation samples must be readable)"
        )

    def __reduce__(self):  # picklable across worker processes
        return (BadSample, (self.index, self.file, self.reason))


def _stack(src, idx) -> np.ndarray:
    return np.stack([src[int(i)] for i in idx])


def describe(src, i: int) -> str:
    fn = getattr(src, "describe", None)
    return fn(i) if fn else f"{type(src).__name__}[{i}]"


def fingerprint(src) -> str:
    """A short identity of the data behind ``src`` (cache namespace)."""
    fn = getattr(src, "fingerprint", None)
    if fn is not None:
        text = fn()
    elif hasattr(src, "file"):  # TokenWindows
        st = os.stat(src.file)
        text = f"tokens:{os.path.abspath(src.file)}:{st.st_size}:{st.st_mtime_ns}:{src.seq_len}"
    elif hasattr(src, "vocab_size") and hasattr(src, "seed"):  # SyntheticTokens
        text = f"synthetic:{src.vocab_size}:{src.seq_len}:{len(src)}:{src.seed}"
    else:
        text = f"{type(src).__module__}.{type(src).__qualname__}:{len(src)}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# --------------------------------------------------------------------------- files
def check_token_ids(arr: np.ndarray, vocab_size: int | None, index: int, where: str) -> np.ndarray:
    """``arr`` if it holds integer token ids in [0, vocab_size), else BadSample (data.on_bad_sample decides):
    a garbled sample is caught here, not by an IndexError in the embedding."""
    if vocab_size is None or arr.size == 0:
        return arr
    if arr.dtype.kind not in "iu":
        raise BadSample(index, where, f"dtype {arr.dtype} is not integer token ids")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise BadSample(index, where, f"token id {hi if hi >= vocab_size else lo} is outside the vocabulary of "
                                      f"{vocab_size}")
    return arr


class SampleFiles:
    """A directory of sample files.

    ``layout="sample"``: each file is one sample (``.npy``, or raw ``dtype``
    tokens of which the first ``seq_len + 1`` are used). ``layout="shard"``: each
    file is raw ``dtype`` tokens cut into non-overlapping windows of ``seq_len + 1``
    (stride ``seq_len``, like the token memmap). ``"auto"``: shard when every raw
    file holds at least two windows, else sample.
    """

    vocab_size: int | None = None  # set by build_sources: ids past it are bad samples

    def __init__(self, root: str, seq_len: int | None = None, *, dtype: str = "uint16", layout: str = "auto"):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(f"data directory {str(root)!r} does not exist or is not a directory")
        names, sizes = [], []
        for dirpath, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith(".") or name == "meta.json":
                    continue
                p = os.path.join(dirpath, name)
                names.append(os.path.relpath(p, self.root))
                sizes.append(os.path.getsize(p))
        if not names:
            raise DataError(f"data directory {str(root)!r} holds no sample files")
        self.seq_len = seq_len
        self.dtype = np.dtype(dtype)
        # numpy, not Python lists: no per-item objects whose refcounts dirty shared pages in workers
        self.names = np.array([n.encode() for n in names], dtype=np.bytes_)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        window = None if seq_len is None else (seq_len + 1) * self.dtype.itemsize
        if layout == "auto":
            raw = not any(n.endswith(".npy") for n in names)
            layout = "shard" if raw and window is not None and bool((self.sizes >= 2 * window).all()) else "sample"
        if layout not in ("sample", "shard"):
            raise DataError(f"files layout {layout!r} is not one of auto, sample, shard")
        self.layout = layout
        if layout == "shard":
            if seq_len is None:
                raise DataError("shard files need a sequence length to cut windows")
            n_tokens = self.sizes // self.dtype.itemsize
            per_file = np.maximum((n_tokens - 1) // seq_len, 0)
            self.starts = np.concatenate([[0], np.cumsum(per_file)]).astype(np.int64)  # window offsets per file
            self._len = int(self.starts[-1])
        else:
            self.starts = None
            self._len = len(names)
        if self._len < 1:
            raise DataError(f"{root}: no complete sample of {seq_len + 1 if seq_len else '?'} tokens in any file")

    @property
    def num_files(self) -> int:
        return len(self.names)

    def __len__(self) -> int:
        return self._len

    def _locate(self, i: int) -> tuple[int, int]:
        if self.starts is None:
            return i, 0
        f = int(np.searchsorted(self.starts, i, side="right")) - 1
        return f, int(i - self.starts[f])

    def describe(self, i: int) -> str:
        f, w = self._locate(int(i))
        path = self.root / self.names[f].decode()
        return str(path) if self.starts is None else f"{path} window {w}"

    def fingerprint(self) -> str:
        return f"files:{self.root.resolve()}:{self.num_files}:{int(self.sizes.sum())}:{self.layout}:{self.seq_len}"

    def __getitem__(self, i: int) -> np.ndarray:
        i = int(i)
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} out of range [0, {self._len})")
        f, w = self._locate(i)
        path = self.root / self.names[f].decode()
        try:
            if self.starts is not None:
                want = (self.seq_len + 1) * self.dtype.itemsize
                with open(path, "rb") as fh:
                    fh.seek(w * self.seq_len * self.dtype.itemsize)
                    raw = fh.read(want)
                if len(raw) < want:
                    raise BadSample(i, str(path), f"truncated: read {len(raw)} of {want} bytes")
                return check_token_ids(np.frombuffer(raw, dtype=self.dtype), self.vocab_size, i, f"{path} window {w}")
            if path.suffix == ".npy":
                arr = np.load(path, allow_pickle=False)
            else:
                arr = np.frombuffer(path.read_bytes(), dtype=self.dtype)
        except BadSample:
            raise
        except (OSError, ValueError, EOFError) as exc:
            raise BadSample(i, str(path), f"unreadable ({type(exc).__name__}: {exc})") from None
        if self.seq_len is not None:
            if arr.ndim != 1 or arr.size < self.seq_len + 1:
                raise BadSample(i, str(path), f"truncated: {arr.size} tokens, need {self.seq_len + 1}")
            arr = arr[: self.seq_len + 1]
        return check_token_ids(arr, self.vocab_size, i, str(path))

    def gather(self, idx) -> np.ndarray:
        return _stack(self, idx)


# --------------------------------------------------------------------------- dataset
def load_entrypoint(spec: str):
    from trainperf.entrypoint import load_entrypoint as _load

    return _load(spec, "data.dataset_entrypoint", error=DataError)


class DatasetSource:
    """Any map-style Dataset (``__len__``, ``__getitem__`` -> 1-D tokens) as a source."""

    vocab_size: int | None = None  # set by build_sources: ids past it are bad samples

    def __init__(self, dataset, name: str = "dataset", seq_len: int | None = None):
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise DataError(f"{name}: the object returned is not a map-style Dataset (needs __len__ and __getitem__)")
        self.dataset, self.name, self.seq_len = dataset, name, seq_len
        if len(dataset) < 1:
            raise DataError(f"{name}: the dataset is empty")

    def __len__(self) -> int:
        return len(self.dataset)

    def describe(self, i: int) -> str:
        return f"{self.name} item {i}"

    def fingerprint(self) -> str:
        return f"dataset:{self.name}:{len(self)}:{self.seq_len}"

    def __getitem__(self, i: int) -> np.ndarray:
        try:
            item = self.dataset[int(i)]
        except IndexError:
            raise
        except Exception as exc:  # user code: report where
            raise BadSample(i, self.describe(i), f"{type(exc).__name__}: {exc}") from None
        try:
            arr = _row_tokens(item, "input_ids")
        except KeyError as exc:
            raise BadSample(i, self.describe(i), str(exc)) from None
        if self.seq_len is not None:
            if arr.ndim != 1 or arr.size < self.seq_len + 1:
                raise BadSample(i, self.describe(i), f"{arr.size} tokens, need {self.seq_len + 1}")
            arr = arr[: self.seq_len + 1]
        return check_token_ids(arr, self.vocab_size, i, self.describe(i))

    def gather(self, idx) -> np.ndarray:
        return _stack(self, idx)


def _row_tokens(item, key: str) -> np.ndarray:
    """The token ids of one row: a dict row's ``key`` (Hugging Face ``datasets``: ``input_ids``), else the
    row itself (a tensor, array or list)."""
    if isinstance(item, dict):
        if key not in item:
            raise KeyError(f"the row has no {key!r} (keys: {sorted(item)[:8]})")
        item = item[key]
    arr = item.numpy() if hasattr(item, "numpy") else np.asarray(item)
    return arr.reshape(-1)


def is_row_dataset(dataset) -> bool:
    """Rows to pack rather than one sample per item: dict rows (a tokenized Hugging Face dataset) or an
    iterable (no ``__getitem__``)."""
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return hasattr(dataset, "__iter__")
    try:
        return len(dataset) > 0 and isinstance(dataset[0], dict)
    except Exception:  # noqa: BLE001 - the item itself reports its errors later
        return False


class PackedRows:
    """Token rows of any length (documents: a tokenized Hugging Face ``datasets`` dataset of dict rows,
    or any map-style or iterable Dataset) concatenated into one stream and cut into windows of
    ``seq_len + 1`` tokens, stride ``seq_len`` (like the token memmap): sample i is tokens
    ``[i*seq_len, i*seq_len + seq_len + 1)`` of the stream, so access is by index and resume is exact.

    One pass at construction reads every row's length (and the largest token, for a dataset without a
    ``vocab_size``). A map-style dataset is read by row on demand (in the loader's workers); an iterable
    one has no random access and is materialized in memory in that pass. No separator token is inserted
    between rows (tokenize with the EOS your model expects)."""

    def __init__(self, dataset, name: str, seq_len: int, key: str = "input_ids"):
        self.name, self.seq_len, self.key = name, int(seq_len), key
        lengths, self.max_token = [], -1
        if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
            self.dataset, self.tokens = dataset, None
            column = None
            if hasattr(dataset, "column_names") and key in getattr(dataset, "column_names", ()):
                column = dataset[key]  # a Hugging Face Dataset: one columnar read, not row by row
            rows = column if column is not None else (dataset[i] for i in range(len(dataset)))
            for i, r in enumerate(rows):
                arr = self._tokens_of(r if column is None else {key: r}, i)
                lengths.append(arr.size)
                if arr.size:
                    self.max_token = max(self.max_token, int(arr.max()))
        else:  # iterable: materialize
            parts = []
            for i, r in enumerate(dataset):
                arr = self._tokens_of(r, i)
                parts.append(arr.astype(np.int64))
                lengths.append(arr.size)
                if arr.size:
                    self.max_token = max(self.max_token, int(arr.max()))
            self.dataset, self.tokens = None, (np.concatenate(parts) if parts else np.zeros(0, np.int64))
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        self.n_tokens = int(self.offsets[-1])
        if len(self) < 1:
            raise DataError(f"{name}: {self.n_tokens} tokens in {len(lengths)} rows, fewer than one sample of "
                            f"{self.seq_len + 1} (model.block_size + 1); use more rows or a shorter block_size")

    def _tokens_of(self, item, i: int) -> np.ndarray:
        try:
            arr = _row_tokens(item, self.key)
        except Exception as exc:  # noqa: BLE001 - user data: say which row
            raise BadSample(i, self.describe_row(i), f"{type(exc).__name__}: {exc}") from None
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise BadSample(i, self.describe_row(i), f"token ids must be integers, got {arr.dtype}")
        return arr

    def describe_row(self, r: int) -> str:
        return f"{self.name} row {r}"

    def describe(self, i: int) -> str:
        r = int(np.searchsorted(self.offsets, i * self.seq_len, side="right")) - 1
        return f"{self.name} sample {i} (from row {r})"

    def fingerprint(self) -> str:
        return f"packed:{self.name}:{len(self.offsets) - 1}:{self.n_tokens}:{self.seq_len}:{self.key}"

    def __len__(self) -> int:
        return (self.n_tokens - 1) // self.seq_len

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range [0, {len(self)})")
        start, end = i * self.seq_len, i * self.seq_len + self.seq_len + 1
        if self.tokens is not None:
            return self.tokens[start:end]
        r = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts = []
        while start < end:
            row = self._tokens_of(self.dataset[r], r)
            lo = start - int(self.offsets[r])
            take = row[lo:lo + (end - start)]
            parts.append(take.astype(np.int64))
            start += take.size
            r += 1
        return np.concatenate(parts)

    def gather(self, idx) -> np.ndarray:
        return _stack(self, idx)


# --------------------------------------------------------------------------- slow storage
class SlowStorage:
    """Wrap a source so each read costs ``read_latency_ms`` plus its transfer time at ``bandwidth_mb_s``.

    The wait is real (``time.sleep``, which releases the GIL like a blocking read),
    so concurrent reads overlap their latency while the bandwidth is shared: reads
    of one process queue on one simulated link. (Each worker process has its own
    link; the cap is per process.)
    """

    def __init__(self, source, read_latency_ms: float = 0.0, bandwidth_mb_s: float | None = None):
        self.source = source
        self.latency_s = float(read_latency_ms) / 1000.0
        self.bytes_per_s = float(bandwidth_mb_s) * 1e6 if bandwidth_mb_s else None
        self._lock = threading.Lock()
        self._link_free = 0.0

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name):  # seq_len, vocab_size, ... of the wrapped source
        if name.startswith("__") or name in ("source", "_lock"):
            raise AttributeError(name)
        return getattr(self.source, name)

    def describe(self, i: int) -> str:
        return describe(self.source, i)

    def fingerprint(self) -> str:
        return fingerprint(self.source)

    def __getitem__(self, i: int) -> np.ndarray:
        t0 = time.perf_counter()
        arr = self.source[i]
        done = t0 + self.latency_s
        if self.bytes_per_s:
            with self._lock:
                start = max(done, self._link_free)
                self._link_free = start + arr.nbytes / self.bytes_per_s
                done = self._link_free
        wait = done - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return arr

    def gather(self, idx) -> np.ndarray:
        return _stack(self, idx)


# --------------------------------------------------------------------------- config
def _read_dir_meta(path: Path) -> dict:
    from trainperf.errors import UserError
    from trainperf.runio import read_json

    f = path / "meta.json"
    if not f.exists():
        return {}
    try:
        meta = read_json(f, what="sample-files manifest")
    except UserError as exc:
        raise DataError(f"{exc}; fix or delete it") from None
    vocab = meta.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2):
        raise DataError(f"{f}: vocab_size={vocab!r} is not a vocabulary size (an integer >= 2); fix or delete it")
    dtype = meta.get("dtype", "uint16")
    try:
        ok = isinstance(dtype, str) and np.dtype(dtype).kind in "iu"
    except TypeError:
        ok = False
    if not ok:
        raise DataError(f"{f}: dtype={dtype!r} is not an integer token dtype (e.g. 'uint16', 'int32'); fix or delete it")
    if not isinstance(meta.get("layout", "auto"), str) or not isinstance(meta.get("tokenizer", ""), str):
        raise DataError(f"{f}: 'layout' and 'tokenizer' must be strings; fix or delete it")
    return meta


def dataset_vocab(cfg, dataset, packed: PackedRows | None) -> tuple[int, str]:
    """The data's vocabulary: the dataset's ``vocab_size``, else model.vocab_size, else the model's (model.hf),
    else the largest token id + 1 seen (a packed dataset reads every token once): (vocab, how it was found)."""
    v = getattr(dataset, "vocab_size", None)
    if v:
        return int(v), ""
    if cfg.model.vocab_size != "auto":
        return int(cfg.model.vocab_size), "the dataset has no vocab_size: model.vocab_size used"
    if cfg.model.hf is not None:
        from trainperf.models.shape import model_shape

        mv = model_shape(cfg).get("vocab_size")
        if mv:
            return int(mv), "the dataset has no vocab_size: the model's vocab_size used"
    if packed is not None and packed.max_token >= 0:
        return packed.max_token + 1, (f"the dataset has no vocab_size: largest token id {packed.max_token} + 1 "
                                      "used (set model.vocab_size if the tokenizer's vocabulary is larger)")
    raise DataError(
        f"data.dataset_entrypoint={cfg.data.dataset_entrypoint!r}: the dataset has no vocab_size attribute; "
        "give it one or set model.vocab_size"
    )


def build_sources(cfg, seq_len: int):
    """(train_source, val_source, meta) for ``data.source`` in files / dataset."""
    d = cfg.data
    model_vocab = cfg.model.vocab_size if cfg.model.vocab_size != "auto" else None
    if d.source == "files":
        root = Path(d.path)
        if not root.exists():
            raise DataError(
                f"data.path={d.path!r} does not exist; point it at a directory of sample files "
                "(or write one with `trainperf data export --src TOKENS_DIR --out DIR`)"
            )
        meta = _read_dir_meta(root)
        vocab = meta.get("vocab_size", model_vocab)
        if vocab is None:
            raise DataError(
                f"{root}: the vocabulary size is unknown; add a meta.json with {{\"vocab_size\": N}} "
                "or set model.vocab_size"
            )
        dtype, layout = meta.get("dtype", "uint16"), meta.get("layout", "auto")
        train_dir = root / "train" if (root / "train").is_dir() else root
        train = SampleFiles(str(train_dir), seq_len, dtype=dtype, layout=layout)
        if (root / "val").is_dir():
            val = SampleFiles(str(root / "val"), seq_len, dtype=dtype, layout=layout)
            val_note = str(root / "val")
        else:
            val, val_note = train, "train (no val/ directory: validation overlaps training)"
        train.vocab_size = val.vocab_size = int(vocab)
        return train, val, {"tokenizer": meta.get("tokenizer", "unknown"), "vocab_size": int(vocab),
                            "source": str(root), "layout": train.layout, "files": train.num_files, "val": val_note}
    if d.source == "dataset":
        fn = load_entrypoint(d.dataset_entrypoint or "")
        params = inspect.signature(fn).parameters

        def make(split: str):
            kwargs = {k: v for k, v in (("split", split), ("seq_len", seq_len)) if k in params}
            return fn(**kwargs)

        train_ds = make("train")
        val_ds = make("val") if "split" in params else train_ds
        packed = is_row_dataset(train_ds)
        if packed:  # rows of any length (tokenized HF datasets, iterables): packed into windows
            train = PackedRows(train_ds, d.dataset_entrypoint, seq_len)
            val = train if val_ds is train_ds else PackedRows(val_ds, d.dataset_entrypoint + " (val)", seq_len)
        else:
            train = DatasetSource(train_ds, d.dataset_entrypoint, seq_len)
            val = DatasetSource(val_ds, d.dataset_entrypoint + " (val)", seq_len)
        vocab, note = dataset_vocab(cfg, train_ds, train if packed else None)
        train.vocab_size = val.vocab_size = int(vocab)  # token ids are checked against it per sample
        meta = {"tokenizer": getattr(train_ds, "tokenizer", "unknown"), "vocab_size": int(vocab),
                "source": d.dataset_entrypoint, "layout": "packed rows" if packed else "one sample per item"}
        if note:
            meta["vocab_note"] = note
        return train, val, meta
    raise DataError(f"data.source={d.source!r} is not built by trainperf.data.sources")

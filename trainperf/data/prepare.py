"""``trainperf data prepare``: a directory of text files -> a token memmap (nanoGPT-style).

Output directory: ``train.bin`` and ``val.bin`` (uint16 token ids) and
``meta.json`` (tokenizer, vocabulary, token counts, sizes and sha256 of both
files, the source). The tokenizer is byte-level (vocabulary 256): exact,
reversible, and needs no download. The default corpus is the Python standard
library's own source, real text present on every machine.

Files are written atomically (temporary file, fsync, rename) and ``meta.json``
last, so a directory with a ``meta.json`` is always complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from pathlib import Path
from typing import Iterator

import numpy as np

from trainperf.errors import DataError

META = "meta.json"
TOKENIZER = "bytes"
VOCAB_SIZE = 256


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_text_files(src: Path) -> Iterator[Path]:
    """Regular files under ``src`` in a stable order; for the stdlib only *.py outside site-packages."""
    is_stdlib = src == stdlib_dir()
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in {"site-packages", "__pycache__"})
        for name in sorted(files):
            if is_stdlib and not name.endswith(".py"):
                continue
            if name.startswith("."):
                continue
            yield Path(root) / name


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def encode(text: bytes) -> np.ndarray:
    return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)


def decode(tokens) -> str:
    return bytes(int(t) & 0xFF for t in tokens).decode("utf-8", errors="replace")


def _is_own_temp(name: str) -> bool:
    """A temporary file an interrupted prepare of ours left behind (``train.bin.tmp1234``)."""
    return re.fullmatch(r"(train\.bin|val\.bin|meta\.json)\.tmp\d+", name) is not None


def is_token_dataset(path) -> bool:
    """``path`` holds a dataset written by ``trainperf data prepare``: a meta.json with the token splits
    (not a sample-file export, not a meta.json of some other tool)."""
    import json as _json

    try:
        meta = _json.loads((Path(path) / META).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return (isinstance(meta, dict) and "layout" not in meta and meta.get("tokenizer") is not None
            and isinstance(meta.get("splits"), dict) and {"train", "val"} <= set(meta["splits"]))


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_output_dir(out_dir: str, what: str = "--out") -> bool:
    """Refuse to write a token dataset where it would overwrite or mix with files that are not ours.

    Allowed: a path that does not exist yet, an empty directory, or a directory that already holds a
    trainperf token dataset (its meta.json; returns True: that dataset is replaced). Anything else is a
    DataError naming the folder, what is in it and how to proceed; nothing is written."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{what} {out_dir!r} is a file, not a directory; point {what} at a directory "
                        "(a new or empty one to prepare the data into, or a prepared dataset)")
    if not out.exists():
        return False
    names = [n for n in os.listdir(out) if not _is_own_temp(n)]
    if not names:
        return False
    if is_token_dataset(out):
        return True
    fix = (f"point {what} at a new or empty directory (trainperf prepares its dataset there), or move "
           f"these files away")
    if "train.bin" in names or "val.bin" in names:
        kind = "a meta.pkl (nanoGPT-style)" if "meta.pkl" in names else "no trainperf meta.json"
        raise DataError(
            f"{what} {out_dir!r} already holds token files ({_listing(names)}) with {kind}: a dataset trainperf "
            f"did not write, so it is not overwritten. {fix[0].upper() + fix[1:]}. To train on raw uint16 "
            f"token files like these, put train.bin in DIR/train/ and val.bin in DIR/val/ and set "
            f"data.source=files data.path=DIR model.vocab_size=N (their vocabulary size); if they are a stale "
            f"trainperf preparation, delete them yourself"
        )
    if META in names:
        raise DataError(f"{what} {out_dir!r} holds a meta.json that is not a trainperf token dataset (files: "
                        f"{_listing(names)}), so nothing is written there; {fix}")
    raise DataError(f"{what} {out_dir!r} is not empty ({_listing(names)}) and holds no trainperf dataset "
                    f"(no {META}), so trainperf does not write its train.bin/val.bin/{META} among these "
                    f"files; {fix}")


def prepare_tokens(src: str, out_dir: str, *, max_bytes: int = 16 * 10**6, val_fraction: float = 0.05,
                   progress: bool = False, what: str = "--out") -> dict:
    """Tokenize the text files under ``src`` ("stdlib" for the Python standard library) into ``out_dir``.

    ``out_dir`` must not exist, be empty or hold a trainperf token dataset (which is replaced; the caller
    says so): see :func:`check_output_dir` (``what`` names ``out_dir`` in its messages)."""
    check_output_dir(out_dir, what)
    if not 0 < val_fraction < 1:  # 1 left no training tokens, 0 one validation token
        raise DataError(f"--val-fraction {val_fraction:g} must be between 0 and 1 (exclusive): the held-out share "
                        "of the tokens, e.g. 0.05; both splits need tokens")
    if max_bytes < 1:
        raise DataError(f"--max-bytes {max_bytes} must be at least 1 (the bound on the text read, e.g. 16000000)")
    src_path = stdlib_dir() if src == "stdlib" else Path(src)
    if src_path.is_file():
        raise DataError(f"data source {src!r} is a file; --src takes a directory of text files (every file under "
                        f"it is read): pass {str(src_path.parent)!r}, or put the file in a directory of its own")
    if not src_path.is_dir():
        raise DataError(f"data source directory {src!r} does not exist; pass a directory of text files or 'stdlib'")
    chunks: list[bytes] = []
    total = 0
    n_files = 0
    skipped = 0  # unreadable or binary files
    files = iter_text_files(src_path)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=max_bytes, unit="B", unit_scale=True, desc="reading text", leave=False)
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            skipped += 1
            continue
        if b"\x00" in data[:4096]:  # binary file
            skipped += 1
            continue
        data = data[: max_bytes - total]
        chunks.append(data + b"\n\n")
        total += len(data) + 2
        n_files += 1
        if bar:
            bar.update(len(data) + 2)
        if total >= max_bytes:
            break
    if bar:
        bar.close()
    if total < 1000:
        files_note = f"{n_files} text file(s)" + (f"; {skipped} binary or unreadable file(s) skipped" if skipped else "")
        raise DataError(f"{src!r} holds only {max(0, total - 2 * n_files)} bytes of text ({files_note}); need at "
                        "least 1000 to train and validate: point --src at a directory with more text")
    tokens = encode(b"".join(chunks))
    n_val = int(len(tokens) * val_fraction)
    if n_val < 2 or len(tokens) - n_val < 2:  # 1e-300 (or 0.99999) left one token on a side: nothing to learn from
        need = 2 / len(tokens)
        raise DataError(f"--val-fraction {val_fraction} of {len(tokens):,} tokens leaves {n_val:,} validation and "
                        f"{len(tokens) - n_val:,} training tokens; each split needs at least an input and its target "
                        f"(and thousands for a useful evaluation): use a fraction in [{need:.2g}, {1 - need:.6g}], "
                        "e.g. 0.05")
    train, val = tokens[:-n_val], tokens[-n_val:]
    out = Path(out_dir)
    check_output_dir(out_dir, what)  # again: the folder may have changed while the text was read
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": 1,
        "tokenizer": TOKENIZER,
        "vocab_size": VOCAB_SIZE,
        "dtype": "uint16",
        "source": str(src_path),
        "files": n_files,
        "splits": {},
    }
    for split, arr in (("train", train), ("val", val)):
        raw = arr.tobytes()
        _atomic_write_bytes(out / f"{split}.bin", raw)
        meta["splits"][split] = {"tokens": int(arr.size), "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    _atomic_write_bytes(out / META, json.dumps(meta, indent=2).encode())
    return meta


def read_meta(path: str) -> dict | None:
    """The prepared data's meta.json, checked against its token files; None if there is none.
    Garbage (binary, cut off, wrong fields) or a token file of the wrong size is a DataError."""
    from trainperf.errors import UserError
    from trainperf.runio import read_json

    meta_path = Path(path) / META
    if not meta_path.exists():
        return None
    redo = f"delete {path!r} and run `trainperf data prepare` again"
    try:
        meta = read_json(meta_path, what="prepared-data manifest")
    except UserError as exc:
        raise DataError(f"{exc}; {redo}") from None
    vocab, splits = meta.get("vocab_size"), meta.get("splits")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= 2**16:
        raise DataError(f"{meta_path}: vocab_size={vocab!r} is not a vocabulary size of uint16 tokens "
                        f"(2..65536); {redo}")
    if not isinstance(splits, dict) or not {"train", "val"} <= set(splits):
        raise DataError(f"{meta_path}: no 'splits' with train and val; {redo}")
    dtype = meta.get("dtype", "uint16")
    if dtype != "uint16":  # the token files are read as uint16: any other dtype would be misread
        raise DataError(f"{meta_path}: dtype={dtype!r}, but a prepared token directory holds uint16 token ids "
                        f"(trainperf reads train.bin/val.bin as uint16); {redo}")
    for split, info in splits.items():
        size = info.get("bytes") if isinstance(info, dict) else None
        if split not in ("train", "val") or isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise DataError(f"{meta_path}: splits.{split} has no byte count; {redo}")
        tokens = info.get("tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens * 2 != size:
            raise DataError(f"{meta_path}: splits.{split}.tokens={tokens!r} does not match its {size} bytes of "
                            f"uint16 tokens ({size // 2} tokens); {redo}")
        f = Path(path) / f"{split}.bin"
        if f.exists() and not f.is_file():
            raise DataError(f"{f} is a {'directory' if f.is_dir() else 'special file'}, not the file of "
                            f"{size} bytes of tokens meta.json describes; {redo}")
        if not f.is_file():
            raise DataError(f"{f}: missing ({size} bytes of tokens expected from meta.json); {redo}")
        if f.stat().st_size != size:
            what = "truncated" if f.stat().st_size < size else "longer than meta.json says"
            raise DataError(f"{f}: {what} ({f.stat().st_size} of {size} bytes); {redo}")
    return meta


def ensure_prepared(path: str, prepare_from: str | None, *, max_bytes: int, val_fraction: float,
                    verbose: bool = True) -> dict:
    """Return the metadata of the prepared data at ``path``, preparing it from ``prepare_from`` if absent."""
    if Path(path).exists() and not Path(path).is_dir():
        raise DataError(f"data.path {path!r} is a file, not a directory; point data.path at a prepared dataset "
                        "directory, or at a new or empty directory to prepare the data into")
    meta = read_meta(path)
    if meta is not None:
        return meta
    if not prepare_from:
        raise DataError(
            f"data.path={path!r} holds no prepared tokens (no {META}); run "
            f"`trainperf data prepare --src DIR --out {path}` or set data.prepare_from"
        )
    check_output_dir(path, "data.path")  # only into a new or empty folder: never among the user's files
    if verbose:
        print(f"data: preparing {path} from {prepare_from} (first use; later runs reuse it)", flush=True)
    return prepare_tokens(prepare_from, path, max_bytes=max_bytes, val_fraction=val_fraction, what="data.path")

"""``trainperf data``: prepare, export and inspect training data.

* ``prepare`` -- text files (or the Python standard library) -> a token memmap.
* ``export``  -- a token memmap -> a directory of sample files (one per sample, or shards),
  the input of ``data.source=files``.
* ``inspect`` -- what a data directory or a disk cache holds; ``--verify`` reads every
  sample and names the unreadable ones (index and file).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainperf.cli._common import add_json_flag, print_json, whole


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="prepare, export and inspect training data", description=__doc__)
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    p = sub.add_parser("prepare", help="tokenize a directory of text files into a token memmap")
    p.add_argument("--src", default="stdlib", help="directory of text files, or 'stdlib' (default)")
    p.add_argument("--out", default="data/stdlib", help="output directory (default: data/stdlib)")
    p.add_argument("--max-bytes", type=int, default=16 * 10**6, help="bound on the text read (default 16e6)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="held-out fraction (default 0.05)")
    add_json_flag(p)
    p.set_defaults(func=prepare_command)

    p = sub.add_parser("export", help="write a token memmap as a directory of sample files (data.source=files)")
    p.add_argument("--src", required=True, help="prepared token directory (train.bin, val.bin, meta.json)")
    p.add_argument("--out", required=True, help="output directory (train/ and val/ inside)")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sample (each file holds seq_len + 1)")
    p.add_argument("--layout", choices=["sample", "shard"], default="sample",
                   help="one file per sample (default) or shard files of many windows")
    p.add_argument("--shards", type=whole(1), default=8, help="shard files per split for --layout shard (default 8)")
    p.add_argument("--max-samples", type=whole(1), default=None, help="stop after this many samples per split")
    add_json_flag(p)
    p.set_defaults(func=export_command)

    p = sub.add_parser("inspect", help="what a token directory, a sample-file directory or a disk cache holds")
    p.add_argument("path", help="directory to inspect")
    p.add_argument("--seq-len", type=whole(1), default=256, help="sample length used to count samples (default 256)")
    p.add_argument("--verify", action="store_true", help="read every sample and name the unreadable ones")
    add_json_flag(p)
    p.set_defaults(func=inspect_command)


def prepare_command(args) -> int:
    from trainperf.cli._common import ensure_dir
    from trainperf.data.prepare import prepare_tokens
    from trainperf.errors import UserError

    ensure_dir(args.out, "--out")
    try:
        meta = prepare_tokens(args.src, args.out, max_bytes=args.max_bytes, val_fraction=args.val_fraction,
                              progress=not args.json and sys.stderr.isatty())
    except OSError as exc:  # writing the output (unreadable source files are skipped while reading)
        raise UserError(f"--out {args.out!r}: cannot write it ({exc.strerror or exc}); choose a writable "
                        "directory") from None
    if args.json:
        print_json({"out": args.out, **meta})
    else:
        s = meta["splits"]
        print(f"prepared {args.out}: {meta['files']} files from {meta['source']}, "
              f"{s['train']['tokens']:,} train + {s['val']['tokens']:,} val tokens ({meta['tokenizer']} tokenizer, "
              f"vocabulary {meta['vocab_size']})")
    return 0


def export_command(args) -> int:
    import numpy as np

    from trainperf.data.prepare import _atomic_write_bytes, read_meta
    from trainperf.data.tokens import TokenWindows
    from trainperf.errors import DataError

    meta = read_meta(args.src)
    if meta is None:
        raise DataError(f"{args.src!r} holds no prepared tokens (no meta.json); run `trainperf data prepare` first")
    if args.seq_len < 1:
        raise DataError(f"--seq-len {args.seq_len} must be at least 1")
    from trainperf.cli._common import ensure_dir

    ensure_dir(args.out, "--out")
    out = Path(args.out)
    counts = {}
    bar = None
    if not args.json and sys.stderr.isatty():  # one atomic write (fsync) per file: long for many files
        from tqdm import tqdm

        bar = tqdm(desc="exporting", unit="file", leave=False)
    for split in ("train", "val"):
        src = TokenWindows(args.src, split, args.seq_len)
        n = len(src) if args.max_samples is None else min(len(src), args.max_samples)
        d = out / split
        d.mkdir(parents=True, exist_ok=True)
        if args.layout == "sample":
            for i in range(n):
                _atomic_write_bytes(d / f"{i:08d}.bin", src[i].astype(np.uint16).tobytes())
                if bar:
                    bar.update(1)
            counts[split] = {"samples": n, "files": n}
        else:
            shards = max(1, min(args.shards, n))
            per = -(-n // shards)
            files = 0
            for s in range(shards):
                lo, hi = s * per, min(n, (s + 1) * per)
                if lo >= hi:
                    break
                # windows overlap by one token (stride seq_len): store the token run they cover
                start, stop = lo * args.seq_len, (hi - 1) * args.seq_len + args.seq_len + 1
                _atomic_write_bytes(d / f"shard-{s:05d}.bin", np.asarray(src.tokens[start:stop]).tobytes())
                files += 1
                if bar:
                    bar.update(1)
            counts[split] = {"samples": n, "files": files}
    if bar:
        bar.close()
    info = {"vocab_size": meta["vocab_size"], "tokenizer": meta["tokenizer"], "dtype": "uint16",
            "layout": args.layout, "seq_len": args.seq_len, "source": os.path.abspath(args.src), "splits": counts}
    _atomic_write_bytes(out / "meta.json", json.dumps(info, indent=2).encode())
    if args.json:
        print_json({"out": str(out), **info})
    else:
        print(f"exported {args.out}: {counts['train']['samples']:,} train / {counts['val']['samples']:,} val samples "
              f"of {args.seq_len + 1} tokens as {args.layout} files; use data.source=files data.path={args.out}")
    return 0


def inspect_command(args) -> int:
    from trainperf.errors import DataError

    path = Path(args.path)
    if not path.is_dir():
        raise DataError(f"{args.path!r} does not exist or is not a directory")
    if (path / ".lock").exists() and not (path / "meta.json").exists():
        info = _inspect_cache(path)
    elif (path / "train.bin").exists():
        info = _inspect_tokens(path, args.seq_len, args.verify)
    else:
        info = _inspect_files(path, args.seq_len, args.verify)
    if args.json:
        print_json(info)
    else:
        for k, v in info.items():
            if k == "bad_samples":
                for b in v[:20]:
                    print(f"  bad sample {b['index']}: {b['file']}: {b['reason']}")
                if len(v) > 20:
                    print(f"  ... and {len(v) - 20} more")
            else:
                print(f"{k}: {v}")
    return 1 if info.get("bad_samples") else 0


def _inspect_tokens(path: Path, seq_len: int, verify: bool) -> dict:
    import hashlib

    from trainperf.data.prepare import read_meta

    meta = read_meta(str(path)) or {}
    info = {"kind": "token memmap", "path": str(path), "tokenizer": meta.get("tokenizer"),
            "vocab_size": meta.get("vocab_size")}
    for split, s in meta.get("splits", {}).items():
        info[f"{split}_tokens"] = s["tokens"]
        info[f"{split}_samples_at_seq_len_{seq_len}"] = max(0, (s["tokens"] - 1) // seq_len)
        if verify:
            h = hashlib.sha256((path / f"{split}.bin").read_bytes()).hexdigest()
            info[f"{split}_sha256_ok"] = h == s["sha256"]
    return info


def _inspect_files(path: Path, seq_len: int, verify: bool) -> dict:
    from trainperf.data.sources import BadSample, SampleFiles, _read_dir_meta

    meta = _read_dir_meta(path)
    seq_len = meta.get("seq_len", seq_len)
    info = {"kind": "sample files", "path": str(path), "vocab_size": meta.get("vocab_size")}
    for split_dir in ([path / "train", path / "val"] if (path / "train").is_dir() else [path]):
        if not split_dir.is_dir():
            continue
        src = SampleFiles(str(split_dir), seq_len, dtype=meta.get("dtype", "uint16"), layout=meta.get("layout", "auto"))
        key = split_dir.name if split_dir != path else "all"
        info[f"{key}_layout"] = src.layout
        info[f"{key}_files"] = src.num_files
        info[f"{key}_samples"] = len(src)
        info[f"{key}_bytes"] = int(src.sizes.sum())
        if verify:
            bad = info.setdefault("bad_samples", [])
            for i in _progress(range(len(src)), f"verifying {key}"):
                try:
                    src[i]
                except BadSample as exc:
                    bad.append({"index": exc.index, "file": exc.file, "reason": exc.reason})
    return info


def _inspect_cache(path: Path) -> dict:
    import struct

    from trainperf.data.cache import decode_entry

    entries = total = corrupt = 0
    namespaces = set()
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name.endswith(".e") and not name.startswith("."):
                full = os.path.join(root, name)
                entries += 1
                total += os.path.getsize(full)
                namespaces.add(os.path.relpath(full, path).split(os.sep)[0])
                if decode_entry(open(full, "rb").read()) is None:
                    corrupt += 1
    raw = (path / ".lock").read_bytes()[:8]
    counted = struct.unpack("<q", raw)[0] if len(raw) == 8 else None
    return {"kind": "disk cache", "path": str(path), "entries": entries, "bytes": total, "counted_bytes": counted,
            "sources": len(namespaces), "corrupt_entries": corrupt}


def _progress(it, desc: str):
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(it, desc=desc, leave=False)
    return it

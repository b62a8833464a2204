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
import re
import shutil
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
    from trainperf.data.prepare import prepare_tokens
    from trainperf.errors import UserError
    from trainperf.runio import ensure_dir

    ensure_dir(args.out, "--out")
    from trainperf.data.prepare import check_output_dir

    replacing = check_output_dir(args.out, "--out")  # refuses a folder of other files or another dataset format
    if replacing:
        print(f"data prepare: --out {args.out!r} holds a trainperf dataset; it is replaced by the new one "
              "(choose another --out to keep it)", file=sys.stderr, flush=True)
    try:
        meta = prepare_tokens(args.src, args.out, max_bytes=args.max_bytes, val_fraction=args.val_fraction,
                              progress=not args.json and sys.stderr.isatty())
    except OSError as exc:  # writing the output (unreadable source files are skipped while reading)
        raise UserError(f"--out {args.out!r}: cannot write it ({exc.strerror or exc}); choose a writable "
                        "directory") from None
    if args.json:
        print_json({"out": args.out, "replaced": replacing, **meta})
    else:
        s = meta["splits"]
        print(f"{'replaced' if replacing else 'prepared'} {args.out}: {meta['files']} files from {meta['source']}, "
              f"{s['train']['tokens']:,} train + {s['val']['tokens']:,} val tokens ({meta['tokenizer']} tokenizer, "
              f"vocabulary {meta['vocab_size']})")
    return 0


def export_command(args) -> int:
    from trainperf.data.prepare import read_meta
    from trainperf.errors import DataError

    meta = read_meta(args.src)
    if meta is None:
        raise DataError(f"{args.src!r} holds no prepared tokens (no meta.json); run `trainperf data prepare` first")
    if args.seq_len < 1:
        raise DataError(f"--seq-len {args.seq_len} must be at least 1")
    from trainperf.runio import ensure_dir

    ensure_dir(args.out, "--out")
    final = Path(args.out)
    replacing = _check_export_target(final)
    # written into a fresh sibling folder, then swapped in: no stale file of an earlier export survives, and
    # a failed export leaves the earlier one intact
    final.absolute().parent.mkdir(parents=True, exist_ok=True)
    out = final.absolute().parent / f".{final.name}.export-tmp{os.getpid()}"
    try:
        counts, info = _export_into(args, meta, out)
        _swap_in(out, final)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if replacing:
        print(f"data export: replaced the earlier export in {args.out!r} ({replacing} files removed)",
              file=sys.stderr)
    if args.json:
        print_json({"out": str(final), "replaced": bool(replacing), **info})
    else:
        print(f"exported {args.out}: {counts['train']['samples']:,} train / {counts['val']['samples']:,} val samples "
              f"of {args.seq_len + 1} tokens as {args.layout} files; use data.source=files data.path={args.out}")
    return 0


_EXPORT_FILE = re.compile(r"(\d{8}\.bin|shard-\d{5}\.bin)(\.tmp\d+)?")


def _check_export_target(out: Path) -> int:
    """0 when ``out`` does not exist or is empty; the number of files of an earlier trainperf export it holds
    (meta.json with a layout, train/ and val/ of our file names, nothing else); else a DataError naming what
    is there (a folder of other files is never written into or removed)."""
    from trainperf.data.prepare import _listing
    from trainperf.errors import DataError

    if not out.exists():
        return 0
    names = os.listdir(out)
    if not names:
        return 0
    fix = "choose a new or empty --out directory, or move those files away"
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        meta = None
    if not (isinstance(meta, dict) and "layout" in meta):
        raise DataError(f"--out {str(out)!r} is not empty ({_listing(names)}) and holds no trainperf export "
                        f"(no meta.json with a layout), so nothing is written there; {fix}")
    foreign = [n for n in names if n not in ("meta.json", "train", "val")]
    n_files = 1
    for split in ("train", "val"):
        d = out / split
        if not d.exists():
            continue
        if not d.is_dir():
            foreign.append(split)
            continue
        for n in os.listdir(d):
            if _EXPORT_FILE.fullmatch(n) and (d / n).is_file():
                n_files += 1
            else:
                foreign.append(f"{split}/{n}")
    if foreign:
        raise DataError(f"--out {str(out)!r} holds a trainperf export and also other files ({_listing(foreign)}); "
                        f"it is not replaced, so that nothing of yours is removed: {fix}")
    return n_files


def _swap_in(new: Path, final: Path) -> None:
    """Put the finished folder ``new`` at ``final``; an earlier export there (checked) is removed after."""
    if not final.exists():
        os.replace(new, final)
        return
    if not any(final.iterdir()):
        final.rmdir()
        os.replace(new, final)
        return
    old = final.absolute().parent / f".{final.name}.export-old{os.getpid()}"
    os.replace(final, old)
    try:
        os.replace(new, final)
    except BaseException:
        os.replace(old, final)
        raise
    shutil.rmtree(old)


def _export_into(args, meta: dict, out: Path) -> tuple[dict, dict]:
    import numpy as np

    from trainperf.data.prepare import _atomic_write_bytes
    from trainperf.data.tokens import TokenWindows

    out.mkdir()
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
    return counts, info


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
            elif k == "problems":
                for msg in v:
                    print(f"  problem: {msg}")
            else:
                print(f"{k}: {v}")
    if info.get("bad_samples") or info.get("problems"):
        n = len(info.get("bad_samples", [])) + len(info.get("problems", []))
        print(f"data inspect: {args.path}: {n} problem(s) found (listed above); training would refuse or misread "
              "this data: fix or re-create it", file=sys.stderr)
        return 2  # bad data, like every other refusal of user input
    return 0


def _inspect_tokens(path: Path, seq_len: int, verify: bool) -> dict:
    import hashlib

    import numpy as np

    from trainperf.data.prepare import read_meta

    meta = read_meta(str(path)) or {}  # a dtype or token count that does not fit the files is refused here
    info = {"kind": "token memmap", "path": str(path), "tokenizer": meta.get("tokenizer"),
            "vocab_size": meta.get("vocab_size")}
    problems = []
    if not meta:
        problems.append(f"{path / 'meta.json'} does not exist: not a trainperf dataset (`trainperf data prepare` "
                        "writes one), so trainperf cannot train on it as data.source=tokens")
    vocab = meta.get("vocab_size")
    for split, s in meta.get("splits", {}).items():
        f = path / f"{split}.bin"
        info[f"{split}_tokens"] = s["tokens"]
        samples = max(0, (s["tokens"] - 1) // seq_len)
        info[f"{split}_samples_at_seq_len_{seq_len}"] = samples
        if samples < 1:
            problems.append(f"{f} has {s['tokens']} tokens, fewer than one sample of {seq_len + 1} "
                            "(--seq-len + 1); prepare more text, or use a shorter sequence")
        if verify:
            h = hashlib.sha256(f.read_bytes()).hexdigest()
            info[f"{split}_sha256_ok"] = h == s.get("sha256")
            if not info[f"{split}_sha256_ok"]:
                problems.append(f"{f}: sha256 {h[:12]}... differs from meta.json's {str(s.get('sha256'))[:12]}...: "
                                "the file changed after `trainperf data prepare`")
            mm = np.memmap(f, dtype=np.uint16, mode="r") if s["bytes"] else np.zeros(0, np.uint16)
            chunk = 1 << 24
            for lo in range(0, mm.size, chunk):
                part = mm[lo:lo + chunk]
                if vocab is not None and int(part.max()) >= vocab:
                    at = lo + int(np.argmax(part >= vocab))
                    problems.append(f"{f}: token id {int(mm[at])} at position {at} is outside the vocabulary of "
                                    f"{vocab} (meta.json); training refuses it")
                    break
    if problems:
        info["problems"] = problems
    return info


def _inspect_files(path: Path, seq_len: int, verify: bool) -> dict:
    from trainperf.data.sources import BadSample, SampleFiles, _read_dir_meta

    meta = _read_dir_meta(path)
    seq_len = meta.get("seq_len", seq_len)
    info = {"kind": "sample files", "path": str(path), "vocab_size": meta.get("vocab_size")}
    problems = []
    splits = meta.get("splits") if isinstance(meta.get("splits"), dict) else {}
    for split_dir in ([path / "train", path / "val"] if (path / "train").is_dir() else [path]):
        if not split_dir.is_dir():
            continue
        src = SampleFiles(str(split_dir), seq_len, dtype=meta.get("dtype", "uint16"), layout=meta.get("layout", "auto"))
        if meta.get("vocab_size") is not None:
            src.vocab_size = int(meta["vocab_size"])  # ids past it are bad samples, as in training
        key = split_dir.name if split_dir != path else "all"
        info[f"{key}_layout"] = src.layout
        info[f"{key}_files"] = src.num_files
        info[f"{key}_samples"] = len(src)
        info[f"{key}_bytes"] = int(src.sizes.sum())
        want = splits.get(key) if isinstance(splits.get(key), dict) else {}
        for what, found in (("samples", len(src)), ("files", src.num_files)):
            if isinstance(want.get(what), int) and want[what] != found:
                problems.append(f"{split_dir}: meta.json records {want[what]} {what}, the folder holds {found}: "
                                "files not written by this export are mixed in; re-export into a new or empty "
                                "--out directory")
        if verify:
            bad = info.setdefault("bad_samples", [])
            exact = (src.layout == "sample" and "seq_len" in meta) and (seq_len + 1) * src.dtype.itemsize
            for i in _progress(range(len(src)), f"verifying {key}"):
                try:
                    src[i]
                except BadSample as exc:
                    bad.append({"index": exc.index, "file": exc.file, "reason": exc.reason})
                    continue
                name = src.names[i].decode()
                if exact and not name.endswith(".npy") and int(src.sizes[i]) != exact:
                    bad.append({"index": i, "file": str(split_dir / name),
                                "reason": f"{int(src.sizes[i]) // src.dtype.itemsize} tokens, but meta.json's "
                                          f"seq_len {seq_len} means {seq_len + 1} per sample file"})
    if problems:
        info["problems"] = problems
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

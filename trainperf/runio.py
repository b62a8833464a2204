"""Reading and writing the JSON files of a run (summary.json, metrics.jsonl, manifests), strictly.

Writing: :func:`dumps_strict` is standard JSON only: NaN and +-Infinity become ``null`` (Python's
``json`` would write the non-standard ``NaN``), numpy scalars become numbers, anything else
unknown its ``str``. :func:`write_json` writes it atomically (temporary file, fsync, rename).

Reading: :func:`read_json` and :func:`read_jsonl` accept nothing but JSON text: binary, non-UTF-8,
empty or cut-off files raise :class:`~trainperf.errors.UserError` naming the file and the fix.
Old files holding ``NaN``/``Infinity`` still load; those values read as ``None``, as a strictly
written file would hold them. A JSON-lines file may hold lines cut or zero-filled by a crash (skipped).

Directories: :func:`ensure_dir` checks that an output directory can be made and written before anything
is (a UserError naming the flag or field otherwise); :func:`previous_name` is where a run directory keeps
another run's records.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import stat
from pathlib import Path
from typing import Any

from trainperf.errors import UserError

MAX_JSON_BYTES = 256 * 2**20  # summaries and manifests are KiB; metrics of long runs some MiB


def strict(obj: Any) -> Any:
    """A copy of ``obj`` with non-finite floats as None and numpy scalars as Python numbers."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (str, int, float, bool)) and k is not None else k: strict(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        f = float(obj)
        return f if math.isfinite(f) else None
    if hasattr(obj, "tolist") and not isinstance(obj, (bytes, bytearray)):  # numpy arrays, tensors
        try:
            return strict(obj.tolist())
        except Exception:  # noqa: BLE001 - not convertible: its text
            return str(obj)
    return obj


def dumps_strict(obj: Any, *, indent: int | None = 2, **kwargs) -> str:
    """``json.dumps`` that never writes NaN/Infinity (they become null); unknown objects as their str."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False, default=str, **kwargs)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``obj`` as strict JSON, atomically: a reader sees the old file or the new one, never half."""
    return atomic_write_text(path, dumps_strict(obj, indent=indent) + "\n")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically: temporary file, fsync, rename; the temporary file never stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        special = False
    if special:  # a device or a pipe (/dev/stdout, /dev/null): written through, never renamed over
        with open(path, "wb") as f:
            f.write(data)
        return path
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def ensure_dir(path, what: str) -> None:
    """Check that the output directory ``path`` (``what``: the flag or field naming it) can be created and
    written, without creating it (a command refused later for another reason leaves nothing behind); raise
    a UserError that says why not: a file in the way, a file above it, no permission (never an OSError
    traceback later)."""
    if path is None:
        return
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise UserError(f"{what} {str(path)!r} is a file, not a directory; choose a directory path")
    probe = p
    while not probe.exists():  # the nearest existing ancestor decides
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{what} {str(path)!r} cannot be created ({probe} is a file); choose a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{what} {str(path)!r} is not writable by this user ({probe}); choose a writable directory")


def _nan_as_none(_constant: str) -> None:
    return None


def read_text(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_JSON_BYTES, lenient: bool = False,
              error: type[UserError] = UserError) -> str:
    """A text file trainperf reads (JSON, YAML): missing, a directory, too large, binary (NUL) or not UTF-8
    is ``error`` (a UserError) naming the file and what it should be, unless ``lenient`` (a log whose last
    block a crash may have left zero-filled or cut inside a character: its lines are judged one by one)."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such file ({what})")
    if path.is_dir():
        raise error(f"{path}: is a directory, expected the {what} file")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror}); check its permissions") from None
    if len(raw) > max_bytes:
        raise error(f"{path}: larger than {max_bytes // 2**20} MiB, not a {what}; pass the right file")
    if lenient:
        return raw.decode("utf-8", errors="replace")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise error(f"{path}: binary content (a NUL byte at offset {nul}), not a {what}; "
                    "the file is corrupt or not the right one")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{path}: not UTF-8 text (byte {exc.start}, line {line}), not a {what}; re-save it as UTF-8 "
                    "or pass the right file") from None


_read_text = read_text


def read_json(path: str | os.PathLike, *, what: str = "JSON file", expect: type | None = dict) -> Any:
    """The JSON value in ``path`` (a dict unless ``expect`` says otherwise); NaN/Infinity read as None.
    Raises UserError naming the file for anything that is not such a value."""
    path = Path(path)
    text = _read_text(path, what)
    if not text.strip():
        raise UserError(f"{path}: empty, not a {what} (a write was interrupted?); delete it or rerun what wrote it")
    try:
        value = json.loads(text, parse_constant=_nan_as_none)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}), not a "
                        f"{what}; the file is cut off or corrupt: delete it or rerun what wrote it") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a {what}") from None
    if expect is not None and not isinstance(value, expect):
        raise UserError(f"{path}: holds a JSON {type(value).__name__}, expected a {expect.__name__} ({what})")
    return value


def read_jsonl(path: str | os.PathLike, *, what: str = "JSON-lines log", counts: dict | None = None) -> list[dict]:
    """The object records of a JSON-lines file, in order. Lines that do not parse are skipped; a non-empty
    file of which no line parses raises UserError naming it, unless all it holds is what a crash leaves:
    a last line without its newline that began a record (``{``: a write cut by kill -9), or zero-filled
    blocks. Such a file (a run killed before its first whole record) reads as no records. ``counts``, when
    given, receives ``skipped``: the lines skipped that a crash does not explain (garbage, a JSON value that
    is not an object), for a reader to say so."""
    path = Path(path)
    text = _read_text(path, what, lenient=True)
    out: list[dict] = []
    bad = 0
    lines = text.splitlines()
    torn = len(lines) if text.endswith(("\n", "\r")) else len(lines) - 1  # the unterminated last line, if any
    for i, line in enumerate(lines):
        if not line.strip() or not line.strip("\0"):  # blank, or zero-filled by a crash
            continue
        if i == torn and line.lstrip("\0 \t").startswith("{"):
            try:
                rec = json.loads(line, parse_constant=_nan_as_none)
            except (json.JSONDecodeError, RecursionError):
                continue  # the record a kill cut in half: not garbage
            if isinstance(rec, dict):
                out.append(rec)
            continue
        try:
            rec = json.loads(line, parse_constant=_nan_as_none)
        except (json.JSONDecodeError, RecursionError):
            bad += 1
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            bad += 1
    if bad and not out:
        raise UserError(f"{path}: none of its {bad} line(s) is a JSON object, not a {what}; "
                        "the file is corrupt or not the right one")
    if counts is not None:
        counts["skipped"] = bad
    return out


def yaml_unique_keys_load(text: str, what: str, error: type[UserError] = UserError) -> Any:
    """``yaml.safe_load`` (the same safe constructors) that refuses a mapping holding one key twice: PyYAML keeps
    the last silently, so a config with two ``steps:`` would run with whichever came last."""
    import yaml

    class _Unique(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *base" then an override of one of its keys is YAML's own way, not a repeat
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # an unhashable key: the base constructor words that error
            if key in seen:
                raise error(f"{what}: key {key!r} appears twice in one mapping (line {seen[key] + 1} and line "
                            f"{key_node.start_mark.line + 1}); YAML would keep only the last: remove one")
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    def integer(loader, node):
        # YAML 1.1 (PyYAML) reads 010 as octal 8 and 1:30 as base 60 (90): a config would run with a number
        # nobody wrote. Refused, with the plain number to write (YAML 1.2 and every other tool read 10).
        value = yaml.SafeLoader.construct_yaml_int(loader, node)
        text = str(node.value).replace("_", "")
        digits = text.lstrip("+-")
        where = f"{what}: {node.value!r} (line {node.start_mark.line + 1})"
        if ":" in digits:
            raise error(f"{where} is read by YAML 1.1 as a base-60 number ({value}); write {value} if that is "
                        f"meant, or quote it ('{node.value}') for text")
        if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXbBoO":
            raise error(f"{where} is read by YAML 1.1 as octal ({value}); write {int(digits, 10)} without the "
                        f"leading zero (or {value} if octal was meant)")
        return value

    _Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    _Unique.add_constructor("tag:yaml.org,2002:int", integer)
    return yaml.load(text, Loader=_Unique)  # noqa: S506 - a SafeLoader subclass: no Python objects


MAX_YAML_VALUES = 200_000
"""Values a YAML document may expand to (its aliases followed). A config or catalog holds hundreds."""


def load_yaml(text: str, what: str, *, error: type[UserError] = UserError, max_values: int = MAX_YAML_VALUES) -> Any:
    """``yaml.safe_load`` that refuses a document whose anchors and aliases expand it past ``max_values``
    values (the "billion laughs" document: nine aliases of nine aliases... once hung the config loader as it
    walked the expansion). The walk counts each alias each time it is reached and stops at the bound.
    YAML errors propagate for the caller to word."""
    data = yaml_unique_keys_load(text, what, error)
    seen, stack = 0, [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            seen += len(node)
            stack.extend(node.values())
            stack.extend(k for k in node if isinstance(k, (list, dict, tuple)))
        elif isinstance(node, (list, tuple)):
            seen += len(node)
            stack.extend(node)
        if seen > max_values:
            raise error(f"{what}: expands to more than {max_values:,} values (YAML anchors and aliases reused over "
                        "and over, the 'billion laughs' pattern); a real file holds a few hundred: remove the nested "
                        "aliases")
    return data


def previous_name(name: str) -> str:
    """``summary.json`` -> ``summary.previous.json``: where a run directory keeps another run's records."""
    stem, dot, ext = name.partition(".")
    return f"{stem}.previous{dot}{ext}"


def rank_of(path: Path) -> int:
    """``metrics.jsonl`` -> 0, ``metrics.rank3.jsonl`` -> 3."""
    for p in path.name.split("."):
        if p.startswith("rank") and p[4:].isdigit():
            return int(p[4:])
    return 0

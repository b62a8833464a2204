"""Loading: YAML (safe_load) + ``--set`` overrides -> validated :class:`Config`.

Errors name the field path, the value, the constraint and the fix, and are
raised as :class:`ConfigError` (the CLI exits with code 2).
"""

from __future__ import annotations

import difflib
import math
import os
import typing
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from trainperf.config.schema import Config
from trainperf.errors import ConfigError

MAX_CONFIG_BYTES = 4 * 2**20  # a config is a few KiB; more is a wrong file


def _read_yaml(path: str) -> dict:
    """The mapping in a YAML config file; any unreadable content (binary, not UTF-8, cut mid-way,
    nested too deep) is a ConfigError naming the file and where."""
    from trainperf.runio import read_text

    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass the path of a YAML file (see configs/)")
    text = read_text(path, "YAML config (see configs/)", max_bytes=MAX_CONFIG_BYTES, error=ConfigError)
    from trainperf.runio import load_yaml

    try:
        data = load_yaml(text, path, error=ConfigError)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem}; fix the YAML there") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config; pass the YAML config (see configs/)") from None
    if data is None:  # an empty file (or only comments): a truncated config would otherwise run as all defaults
        import warnings

        warnings.warn(f"{path} holds no settings (empty, or only comments): every field is its default "
                      "(`trainperf config show` prints them)", UserWarning, stacklevel=3)
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (run:, model:, ...), not {type(data).__name__}"
        )
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"optimizer.lr=3e-4"`` -> (["optimizer", "lr"], 3e-4). Values are parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set optimizer.lr=3e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: the key {key!r} is not a dotted field path like optimizer.lr")
    from trainperf.runio import load_yaml

    try:
        value = load_yaml(raw, f"--set {key}", error=ConfigError) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"--set {item!r}: {'.'.join(path[: i + 1])} is a value ({child!r}), not a section"
                )
            node = child
        node[path[-1]] = value
    return data


def _field_at(loc: tuple) -> tuple[list[str], Any, type[BaseModel] | None]:
    """The field path in ``loc`` (a pydantic error location), its FieldInfo (None at the top) and, when
    the location is a section, its model. Union tags and tuple indices after the field are dropped."""
    model: type[BaseModel] | None = Config
    path: list[str] = []
    info = None
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        info = model.model_fields[part]
        path.append(part)
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return path, info, model


def _fields_at(loc: tuple) -> list[str]:
    """Valid keys of the section at ``loc``."""
    _, _, model = _field_at(loc)
    return list((model or Config).model_fields)


def _bounds(annotation: Any, metadata: list, out: dict) -> dict:
    """Collect ge/gt/le/lt and whether 'auto' / None are allowed, through Union/Annotated/tuple."""
    for m in metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(m, key, None) is not None:
                out.setdefault(key, getattr(m, key))
        if hasattr(m, "metadata"):  # a FieldInfo inside Annotated[...]
            _bounds(None, m.metadata, out)
    if annotation is None:
        return out
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        out.setdefault("choices", []).extend(args)
    elif origin is typing.Annotated or hasattr(annotation, "__metadata__"):
        _bounds(args[0] if args else None, list(getattr(annotation, "__metadata__", ())), out)
    elif annotation is type(None):
        out["none"] = True
    elif args:
        for a in args:
            if a is not Ellipsis:
                _bounds(a, [], out)
    elif isinstance(annotation, type) and annotation in (int, float, bool, str):
        out.setdefault("kinds", set()).add(annotation.__name__)
    return out


def _num(v: Any) -> str:
    if isinstance(v, int) and v > 2**20 and (v & (v - 1)) == 0:
        return f"2**{v.bit_length() - 1}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _range_text(b: dict) -> str:
    lo = f"[{_num(b['ge'])}" if "ge" in b else f"({_num(b['gt'])}" if "gt" in b else None
    hi = f"{_num(b['le'])}]" if "le" in b else f"{_num(b['lt'])})" if "lt" in b else None
    if lo and hi:
        return f"in {lo}, {hi}"
    if lo:
        return f">= {lo[1:]}" if lo[0] == "[" else f"> {lo[1:]}"
    if hi:
        return f"<= {hi[:-1]}" if hi[-1] == "]" else f"< {hi[:-1]}"
    return ""


def _fix(path: str, info: Any) -> str:
    """How to fix the field at ``path``: its type and range, 'auto' if allowed, and its default."""
    if info is None:
        return ""
    b = _bounds(info.annotation, list(info.metadata), {})
    kinds = b.get("kinds", set())
    what = ("a whole number" if kinds == {"int"} else "a number" if kinds & {"int", "float"} else
            "true or false" if "bool" in kinds else "a string" if "str" in kinds else "")
    if kinds == {"int"} and path.endswith("_bytes"):
        what = "a size (bytes, or with a unit like '512MB')"
    rng = _range_text(b)
    choices = [c for c in b.get("choices", []) if c != "auto" or not (what or rng)]
    parts = [" ".join(x for x in (what, rng) if x)] if (what or rng) else []
    if choices:
        parts.append("one of " + ", ".join(repr(c) for c in choices))
    if "auto" in b.get("choices", []) and (what or rng):
        parts.append("'auto'")
    if b.get("none"):
        parts.append("null")
    default = info.get_default(call_default_factory=True)
    dtext = "" if isinstance(default, BaseModel) else f" (default: {default!r})"
    return f"set {path} to " + " or ".join(p for p in parts if p) + dtext if parts else ""


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per field: path=value, what is wrong (the constraint), and the fix (range, default)."""
    lines: list[str] = []
    by_field: dict[str, list[dict]] = {}
    for err in exc.errors():
        loc = tuple(err["loc"])
        path_parts, info, model = _field_at(loc)
        path = ".".join(path_parts)
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}? " if close else ""
            lines.append(f"{'.'.join(map(str, loc))}: unknown key; {hint}valid keys here: {', '.join(valid)}")
        elif err["type"] == "invalid_key":
            where = ".".join(map(str, loc[:-1])) or "the top level"
            lines.append(f"{where}: key {loc[-1]!r} is not a field name; valid keys here: "
                         f"{', '.join(_fields_at(loc[:-1]))}")
        elif model is not None and err["type"] == "model_type":
            where = path or "the top level"
            lines.append(f"{where}={_describe(err.get('input'))}: must be a mapping of field names to values; "
                         f"valid keys here: {', '.join((model or Config).model_fields)}")
        else:
            by_field.setdefault(path, []).append({**err, "_info": info})
    for path, errs in by_field.items():
        # a Union["auto", int] field reports one error per member: keep the informative one
        main = [e for e in errs if not (e["type"] == "literal_error" and e.get("ctx", {}).get("expected") == "'auto'")]
        err = (main or errs)[0]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        msg = msg.replace("Input should be", "must be")
        ctx = err.get("ctx") or {}
        if "expected" in ctx and "expected" not in msg and "must be" not in msg:
            msg += f" (expected {ctx['expected']})"
        fix = _fix(path, err["_info"])
        raw = err.get("input")
        if isinstance(raw, str) and err["type"].startswith(("int_", "float_")) and _looks_numeric(raw) \
                and math.isfinite(float(raw)):  # 1e400 is no number to write instead: the range says what is
            # YAML 1.1 reads 1e3 (no dot) as text: say how to write the number
            fix = (f"write it as {_as_number_hint(raw)} (YAML reads {raw!r} as text; a number in exponent form "
                   "needs a dot, e.g. 1.0e3)" + (f"; {fix}" if fix else ""))
        lines.append(f"{path}={_describe(raw)}: {msg}" + (f"; {fix}" if fix else ""))
    head = f"invalid config ({source})" if source else "invalid config"
    return head + ":\n  " + "\n  ".join(lines)


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _as_number_hint(text: str) -> str:
    value = float(text)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def build_config(data: dict, *, source: str = "") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config: defaults < YAML file < ``--set`` overrides. Cross-field checks that need
    the world size or hardware happen in :func:`trainperf.train.resolve.resolve`."""
    data = _read_yaml(path) if path else {}
    data = apply_overrides(data, overrides)
    source = path or "defaults"
    if overrides:
        source += " + --set"
    return build_config(data, source=source)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

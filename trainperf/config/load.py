"""Loading: YAML (safe_load) + ``--set`` overrides -> validated :class:`Config`.

Errors name the field path, the value, the constraint and the fix, and are
raised as :class:`ConfigError` (the CLI exits with code 2).
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from trainperf.config.schema import Config
from trainperf.errors import ConfigError


def _read_yaml(path: str) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass the path of a YAML file (see configs/)")
    if os.path.isdir(path):
        raise ConfigError(f"config path {path!r} is a directory; pass a YAML file inside it (see configs/)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror}; check its permissions") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: YAML syntax error{where}: {problem}; fix the YAML there") from None
    if data is None:
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
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
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


def _fields_at(loc: tuple) -> list[str]:
    """Valid keys of the section at ``loc`` (a pydantic error location)."""
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            break
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            break
    return list(model.model_fields)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}? " if close else ""
            lines.append(f"{path}: unknown key; {hint}valid keys here: {', '.join(valid)}")
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            ctx = err.get("ctx") or {}
            if "expected" in ctx and "expected" not in msg:
                msg += f" (expected {ctx['expected']})"
            lines.append(f"{path}={_describe(err.get('input'))}: {msg}")
    head = f"invalid config ({source})" if source else "invalid config"
    return head + ":\n  " + "\n  ".join(lines)


def build_config(data: dict, *, source: str = "") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config: defaults < YAML file < ``--set`` overrides. Cross-field checks that need
    the world size or hardware happen in :func:`trainperf.config.resolve.resolve`."""
    data = _read_yaml(path) if path else {}
    data = apply_overrides(data, overrides)
    source = path or "defaults"
    if overrides:
        source += " + --set"
    return build_config(data, source=source)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

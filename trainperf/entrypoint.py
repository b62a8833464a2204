"""Load a user's ``"package.module:function"`` (model or dataset entry point), with clear errors."""

from __future__ import annotations

import importlib

from trainperf.errors import ConfigError, UserError


def load_entrypoint(spec: str | None, what: str = "model.entrypoint", error: type[UserError] = ConfigError):
    if not spec or ":" not in spec:
        raise error(f"{what}={spec!r}: write it as 'package.module:function'")
    mod_name, fn_name = spec.split(":", 1)
    if not mod_name.strip() or not fn_name.strip() or ":" in fn_name:
        raise error(f"{what}={spec!r}: write it as 'package.module:function' (one module, one function name)")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise error(f"{what}={spec!r}: cannot import {mod_name!r} ({exc}); check PYTHONPATH") from None
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        raise error(f"{what}={spec!r}: {mod_name!r} has no callable {fn_name!r}")
    return fn

"""Names a package hands on without importing them (PEP 562): importing ``trainperf`` (or one of its
packages) loads no torch until a name that needs it is used."""

from __future__ import annotations

import importlib


def lazy_names(package: str, namespace: dict, table: dict[str, tuple[str, str]]):
    """The package's module ``__getattr__``: ``table`` maps a name to (module, attribute), imported on first
    use and then kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str):
        if name in table:
            module, attr = table[name]
            value = getattr(importlib.import_module(module), attr)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

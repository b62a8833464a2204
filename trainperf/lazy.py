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


def moved_names(old: str, new: str | dict[str, str], names=None):
    """The ``__getattr__`` of a module whose names moved: ``new`` is the module they moved to (``names``:
    which), or a table name -> new module. Each use warns (DeprecationWarning) and hands on the new object;
    the old path is kept for one release."""
    table = dict(new) if isinstance(new, dict) else {n: new for n in names or ()}

    def __getattr__(name: str):
        if name in table:
            import warnings

            warnings.warn(f"{old}.{name} moved to {table[name]}.{name}; the old path goes in the next release",
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__

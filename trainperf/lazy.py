"""Names a package hands on without importing them (PEP 562): importing ``trainperf`` (or one of its
packages) loads no torch until a name that needs it is used. :func:`moved_names` does the same for the
names a module held before they moved to their own place, for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings


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


def moved_names(module: str, table: dict[str, str], *, removed_in: str):
    """The module ``__getattr__`` of an old import path: ``table`` maps each name that left ``module`` to the
    module that holds it now. ``from module import name`` keeps working (imported from its new place on use,
    so the old path imports nothing above it) and warns (DeprecationWarning) with the new path, which the
    old one stops offering in release ``removed_in``. tests/unit/test_imports.py reads these tables: each
    is an import of the old module, listed apart from the layers' own."""

    def __getattr__(name: str):
        if name in table:
            warnings.warn(f"{module}.{name} moved to {table[name]}.{name}; import it from there "
                          f"({module} stops offering it in trainperf {removed_in})", DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__

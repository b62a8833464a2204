"""The layers of trainperf/ import downwards only, and no module imports, directly or through others, a module
that imports it back. Every import statement counts, those inside functions too (a lazy import hides an order
problem at start-up, not a tie in the design), and so do the names a package's ``__getattr__`` loads on first
use (``lazy.lazy_names`` tables). A name kept at its old path for one release (``lazy.moved_names`` tables) is an
import of its own kind: listed apart, never used by trainperf's own code.

LAYERS is the order, from the ground up. A module may import its own package and the packages of the layers
below its own; packages that share a layer are independent (neither imports the other). UP lists the imports
allowed to run the other way, each with its reason; there are at most two.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "trainperf"

# Bottom to top: (layer, its packages or top-level modules, what the layer is). "" is the package's face
# (trainperf/__init__.py: names loaded on use).
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("ground", ("errors", "limits", "lazy", "interrupt"),
     "imports nothing of trainperf: user errors, bounds, names loaded on use, Ctrl-C"),
    ("files", ("runio", "entrypoint"),
     "a run's files: strict JSON and YAML, output directories; a user's pkg.mod:fn"),
    ("knowledge", ("analytic", "hardware", "trace"),
     "torch-free facts: a transformer's FLOPs and bytes, the machine and the GPU catalog, a profiler trace's figures"),
    ("fixtures", ("tracegen",),
     "generated traces with known answers, for tests and benchmarks (imported by bench/ only: FIXTURES)"),
    ("config", ("config",),
     "the typed tree, the autos the machine decides, the cross-field rules, the resume policy"),
    ("models", ("models",),
     "the reference GPT, presets, the configured model's shape, building a model"),
    ("mechanisms", ("memory", "planner"),
     "activation checkpointing and the memory estimate; the cluster planner (no torch)"),
    ("parts", ("data", "distributed"),
     "the input pipeline; parallelism applied in the fixed order, collectives, checkpoints, processes"),
    ("measures", ("monitor", "diagnosis"),
     "what runs inside training (phases, sinks, MFU, sampler) | what reads a run or a trace after it (findings, "
     "reports); neither imports the other"),
    ("backends", ("xla",),
     "the XLA device's backend for the trainer (its step figures go to monitor)"),
    ("train", ("train",),
     "the assembly (resolve -> build) and the one training step"),
    ("tools", ("integrations", "tune", "bench"),
     "other people's loops, the autotuner, the benchmarks: each drives the trainer or the monitor"),
    ("cli", ("cli",),
     "one module per subcommand: arguments and printing"),
    ("face", ("", "__main__"),
     "import trainperf (names loaded on use) and python -m trainperf"),
)

# Imports that run from a lower layer up: (importer, imported) -> why. At most two.
UP: dict[tuple[str, str], str] = {
    ("trainperf.memory.report", "trainperf.train.resolve"):
        "`trainperf memory` (and tune's memory fit) resolve the config they report on, as train does; the report "
        "is the memory package's top, above the checkpointing mechanism that distributed/parallelize applies",
}

# Packages of test fixtures: the only packages of trainperf that may import them (tests and benchmarks may).
FIXTURES: dict[str, set[str]] = {"tracegen": {"bench"}}

# What a package may import at most (besides its own modules).
ONLY: dict[str, set[str]] = {
    "diagnosis": {"errors", "limits", "lazy", "runio", "analytic", "hardware", "trace", "config"},
}

# Names trainperf's own code still imports from their old path, until their owner moves the import:
# (importer, old module, name) -> why.
PENDING: dict[tuple[str, str, str], str] = {
    ("trainperf.planner.calibrate", "trainperf.config.resolve", "model_shape"):
        "trainperf/planner/ is changed on the planner's branch; it imports trainperf.models.shape.model_shape there",
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    kind: str  # "import" (a statement), "lazy" (a lazy_names table), "moved" (a moved_names table)
    line: int
    where: str  # "module level" or the function it is in
    names: tuple[str, ...] = ()


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _table(tree: ast.Module, node: ast.AST) -> ast.Dict | None:
    """A dict literal, or the module-level dict literal a name is bound to."""
    if isinstance(node, ast.Dict):
        return node
    if isinstance(node, ast.Name):
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Dict):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                    return stmt.value
    return None


def _moved_table(tree: ast.Module, call: ast.Call, path: Path) -> dict[str, str]:
    """A moved_names call's names -> their new module: ``(old, {name: module})`` or ``(old, module, names)``."""
    table = _table(tree, call.args[1])
    if table is not None:
        return {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(table.keys, table.values)}
    names = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "names"), None)
    try:
        return {n: ast.literal_eval(call.args[1]) for n in ast.literal_eval(names)}
    except (ValueError, TypeError):
        raise AssertionError(f"{path}:{call.lineno}: give moved_names literals (a dict, or a module and a tuple of "
                             "names) so that this test can read them") from None


@functools.lru_cache(maxsize=8)
def edges(root: Path = ROOT) -> tuple[Edge, ...]:
    """Every import between trainperf modules (``from a.b import c`` counts a.b, or a.b.c when that is a
    module), with the tables of names loaded on use."""
    mods = _modules(root)
    out: list[Edge] = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        owner: dict[int, str] = {}  # node -> the innermost function it is in (ast.walk meets outer ones first)
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for child in ast.walk(fn):
                    if child is not fn:
                        owner[id(child)] = f"{fn.name}()"
        for node in ast.walk(tree):
            where = owner.get(id(node), "module level")
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.name != name:
                        out.append(Edge(name, a.name, "import", node.lineno, where))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != name:
                        out.append(Edge(name, target, "import", node.lineno, where,
                                        () if target.endswith("." + a.name) else (a.name,)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                fn_name = node.func.id
                if fn_name == "lazy_names" and len(node.args) >= 3:
                    table = _table(tree, node.args[2])
                    assert table is not None, f"{path}:{node.lineno}: lazy_names needs a dict literal to be read here"
                    for key, value in zip(table.keys, table.values):
                        module, attr = ast.literal_eval(value)
                        if module != name:
                            out.append(Edge(name, module, "lazy", node.lineno, where, (attr,)))
                elif fn_name == "moved_names" and len(node.args) >= 2:
                    for old_name, new in _moved_table(tree, node, path).items():
                        out.append(Edge(name, new, "moved", node.lineno, where, (old_name,)))
    return tuple(out)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module name -> the trainperf modules it imports (statements and lazy tables; not the moved names, which
    load only when an old path is used)."""
    graph: dict[str, set[str]] = {m: set() for m in _modules(root)}
    for e in edges(root):
        if e.kind != "moved" and e.dst in graph:
            graph[e.src].add(e.dst)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit(module: str) -> str:
    """The package or top-level module a module belongs to: trainperf.config.resolve -> config."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


LAYER_OF = {u: i for i, (_, units, _) in enumerate(LAYERS) for u in units}


def _name(u: str) -> str:
    return f"trainperf.{u}" if u else "trainperf"


def _at(e: Edge, root: Path = ROOT) -> str:
    rel = Path(*e.src.split(".")[1:]) if "." in e.src else Path()
    path = (root / rel / "__init__.py") if (root / rel).is_dir() else (root / rel).with_suffix(".py")
    return f"{path.relative_to(root.parent)}:{e.line} ({e.where})"


def upward(all_edges) -> list[Edge]:
    """Imports (statements and lazy tables) from a package to one of its own layer or of a layer above."""
    return [e for e in all_edges if e.kind != "moved" and unit(e.src) != unit(e.dst)
            and LAYER_OF[unit(e.dst)] >= LAYER_OF[unit(e.src)]]


def layers_text() -> str:
    return "\n".join(f"  {i:>2} {layer:<11} {', '.join(_name(u) for u in units)}" for i, (layer, units, _) in
                     reversed(list(enumerate(LAYERS))))


# ---------------------------------------------------------------------- the walker, on small made-up packages
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "trainperf"
    for rel, text in {"__init__.py": "", **files}.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for parent in p.relative_to(pkg).parents:
            (pkg / parent / "__init__.py").touch()
        p.write_text(text)
    return pkg


def test_the_walker_finds_a_cycle(tmp_path):
    pkg = _package(tmp_path, {"sub/a.py": "def f():\n    from trainperf.sub.b import g\n",
                              "sub/b.py": "from . import a\n", "c.py": "import trainperf.sub.a\n"})
    assert cycles(module_graph(pkg)) == [["trainperf.sub.a", "trainperf.sub.b"]]


def test_the_walker_sees_imports_inside_functions_and_tables_of_names_loaded_on_use(tmp_path):
    pkg = _package(tmp_path, {
        "errors.py": "def f():\n    from trainperf.config.schema import Config\n",
        "config/__init__.py": ("from trainperf.lazy import lazy_names\n"
                               "_LAZY = {'Config': ('trainperf.config.schema', 'Config'), 'go': ('trainperf.cli', 'go')}\n"
                               "__getattr__ = lazy_names(__name__, globals(), _LAZY)\n"),
        "config/schema.py": "class Config: ...\n", "cli/__init__.py": "def go(): ...\n", "lazy.py": "",
        "runio.py": ("from trainperf.lazy import moved_names\n"
                     "__getattr__ = moved_names(__name__, 'trainperf.cli', ('go',))\n"),
        "data.py": ("from trainperf.lazy import moved_names\n_MOVED = {'go': 'trainperf.cli'}\n"
                    "_moved = moved_names('trainperf.data', _MOVED)\n"),
    })
    got = {(e.src, e.dst, e.kind, e.where) for e in edges(pkg)}
    assert ("trainperf.errors", "trainperf.config.schema", "import", "f()") in got
    assert ("trainperf.config", "trainperf.cli", "lazy", "module level") in got
    assert ("trainperf.runio", "trainperf.cli", "moved", "module level") in got
    assert ("trainperf.data", "trainperf.cli", "moved", "module level") in got
    up = {(e.src, e.dst) for e in upward(edges(pkg))}
    assert up == {("trainperf.errors", "trainperf.config.schema"), ("trainperf.config", "trainperf.cli")}
    assert "trainperf.cli" not in module_graph(pkg)["trainperf.runio"]  # a moved name loads only when used


# ---------------------------------------------------------------------- trainperf
def test_trainperf_has_no_import_cycle():
    found = cycles(module_graph())
    assert not found, "import cycles (each line: modules that import each other, directly or not):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_every_package_has_its_layer():
    placed = [u for _, units, _ in LAYERS for u in units]
    assert len(placed) == len(set(placed)), "a package is placed in two layers"
    missing = sorted({unit(m) for m in _modules(ROOT)} - set(placed))
    assert not missing, (f"{', '.join(_name(u) for u in missing)} has no layer: add it to LAYERS in "
                         f"tests/unit/test_imports.py, above everything it imports and below everything that "
                         f"imports it. The layers, top first:\n{layers_text()}")


def test_imports_go_down():
    bad = [e for e in upward(edges()) if (e.src, e.dst) not in UP]
    assert not bad, (
        "imports that run up the layers (or between packages of one layer), with where each is:\n"
        + "\n".join(f"  {_at(e)}: {e.src} -> {e.dst} ({LAYERS[LAYER_OF[unit(e.src)]][0]} -> "
                    f"{LAYERS[LAYER_OF[unit(e.dst)]][0]})" for e in bad)
        + "\nMove the code where it belongs (to the lower package, or the importer up), or pass what it needs in. "
        "A name kept at its old path for one release is a lazy.moved_names table, not an import. The layers, "
        f"top first:\n{layers_text()}")


def test_the_imports_allowed_up_are_few_and_each_still_there():
    assert len(UP) <= 2, f"{len(UP)} imports allowed to run up the layers; the house allows two"
    assert all(len(why) > 40 for why in UP.values()), "each import allowed up says why"
    found = {(e.src, e.dst) for e in upward(edges())}
    gone = [pair for pair in UP if pair not in found]
    assert not gone, f"no longer imported: remove from UP in tests/unit/test_imports.py: {gone}"


def test_fixtures_are_imported_by_the_benchmarks_only():
    bad = [e for e in edges() if e.kind != "moved" and unit(e.dst) in FIXTURES
           and unit(e.src) != unit(e.dst) and unit(e.src) not in FIXTURES[unit(e.dst)]]
    assert not bad, "\n".join(f"{_at(e)}: {e.src} -> {e.dst}: test fixtures are not for the shipped code "
                              f"(only {sorted(FIXTURES[unit(e.dst)])} may import them)" for e in bad)


def test_packages_import_no_more_than_they_may():
    bad = [e for e in edges() if e.kind != "moved" and unit(e.src) in ONLY
           and unit(e.dst) != unit(e.src) and unit(e.dst) not in ONLY[unit(e.src)]]
    assert not bad, "\n".join(f"{_at(e)}: {e.src} -> {e.dst}: {_name(unit(e.src))} imports at most "
                              f"{sorted(ONLY[unit(e.src)])}" for e in bad)


def _defines(path: Path, name: str) -> bool:
    """Whether ``name`` is bound at the top level of the module at ``path`` (def, class, assignment, import)."""
    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return True
        if isinstance(stmt, ast.Assign) and any(isinstance(n, ast.Name) and n.id == name  # also W, H = 680, 320
                                                for t in stmt.targets for n in ast.walk(t)):
            return True
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            return True
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in stmt.names):
            return True
    return False


def test_a_moved_name_lives_where_its_old_path_says_and_nowhere_else():
    mods = _modules(ROOT)
    moved = [e for e in edges() if e.kind == "moved"]
    assert moved, "no moved_names table found: the walker no longer reads them"
    bad = []
    for e in moved:
        (name,) = e.names
        if e.dst not in mods or not _defines(mods[e.dst], name):
            bad.append(f"{_at(e)}: {e.src}.{name} points at {e.dst}, which does not define {name}")
        if _defines(mods[e.src], name):
            bad.append(f"{_at(e)}: {e.src} still defines {name} beside its moved_names entry")
    assert not bad, "\n".join(bad)


def test_trainperf_imports_no_name_from_the_path_it_left():
    old = {(e.src, e.names[0]): e.dst for e in edges() if e.kind == "moved"}
    used = {(e.src, e.dst, n): e for e in edges() if e.kind == "import" for n in e.names if (e.dst, n) in old}
    bad = [f"{_at(e)}: imports {n} from {dst}; import it from {old[(dst, n)]}"
           for (src, dst, n), e in used.items() if (src, dst, n) not in PENDING]
    assert not bad, "\n".join(bad)
    stale = [k for k in PENDING if k not in used]
    assert not stale, f"no longer imported from the old path: remove from PENDING: {stale}"


@pytest.mark.parametrize("old,name", [
    ("trainperf.config.resolve", "resolve"), ("trainperf.config.resolve", "model_shape"),
    ("trainperf.distributed.harness", "run_trainer"), ("trainperf.distributed.harness", "spawn"),
    ("trainperf.cli._common", "ensure_dir"),
])
def test_an_old_path_still_gives_the_moved_name_and_says_where_it_went(old, name):
    import importlib

    new = next(e.dst for e in edges() if e.kind == "moved" and e.src == old and e.names == (name,))
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        got = getattr(importlib.import_module(old), name)
    assert got is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        getattr(importlib.import_module(old), "not_a_name")

"""The package's import graph keeps the layout rules of ARCHITECTURE.md.

The graph is built statically with :mod:`ast` from every ``import greenctl.x`` and
``from greenctl.x import y`` in the library folders, wherever it sits: at module
level, inside a function, or under ``if TYPE_CHECKING:`` (a deferred or type-only
import is still a dependency, and hiding an import inside a function does not break
a circle). Three rules are checked:

- no import circles among greenctl modules;
- the layer rules of the layout table (``data`` imports only ``data``; ``profiler``
  and ``planner`` import ``data``; ``executor`` imports ``data``, ``profiler`` and
  ``planner``; ``cli`` imports everything), and inside ``executor`` the rules of its rooms
  (``kinds``, ``runtime``, ``deploy``, ``control``);
- no module imports another module's private name (``from greenctl.a import _x``).

Violations not yet fixed are listed below, each exactly; a new one fails the test,
and a listed one that is gone fails it too, so the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Folder at the repository root -> its layer (the ``greenctl.<layer>`` subpackage).
LAYERS = ("data", "profiler", "planner", "executor", "cli")

# What each layer may import besides itself (ARCHITECTURE.md, "Layout").
ALLOWED_LAYERS: dict[str, frozenset[str]] = {
    "data": frozenset(),
    "profiler": frozenset({"data"}),
    "planner": frozenset({"data"}),
    "executor": frozenset({"data", "profiler", "planner"}),
    "cli": frozenset({"data", "profiler", "planner", "executor"}),
}

# Import circles still to break, each as the sorted tuple of the modules on it (a
# strongly connected component of the graph).
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()

# Layer rules still broken: (importing module, imported module).
KNOWN_LAYER_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()

# Private names still used across modules: (using module, "module._name"), imported by
# name or reached as ``module._name``.
KNOWN_PRIVATE_IMPORTS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import of a greenctl module (or a name in it) by another."""

    importer: str
    imported: str
    names: tuple[str, ...]
    line: int


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["greenctl", *parts])


def _library_files() -> Iterator[Path]:
    for layer in LAYERS:
        yield from sorted((REPO / layer).rglob("*.py"))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _library_files()}


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join(base + ([module] if module else []))


def _edges(modules: dict[str, Path]) -> list[Edge]:
    edges: list[Edge] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("greenctl."):
                        edges.append(Edge(name, _owner(alias.name, modules), (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = (
                    _resolve_relative(name, is_package, node.level, node.module)
                    if node.level
                    else node.module or ""
                )
                if not (target == "greenctl" or target.startswith("greenctl.")):
                    continue
                for alias in node.names:
                    # ``from greenctl.planner.mig import solve`` imports the module solve.
                    sub = f"{target}.{alias.name}"
                    if sub in modules:
                        edges.append(Edge(name, sub, (), node.lineno))
                    else:
                        edges.append(
                            Edge(name, _owner(target, modules), (alias.name,), node.lineno)
                        )
        edges.extend(_private_attribute_uses(name, tree, modules))
    return [e for e in edges if e.imported != e.importer]


def _private_attribute_uses(name: str, tree: ast.AST, modules: dict[str, Path]) -> list[Edge]:
    """``mod._x`` where ``mod`` is a greenctl module bound by an import in this file."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    bound[alias.asname or alias.name] = sub
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    bound[alias.asname] = alias.name
    uses: list[Edge] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
        ):
            uses.append(Edge(name, bound[node.value.id], (node.attr,), node.lineno))
    return uses


def _owner(dotted: str, modules: dict[str, Path]) -> str:
    """The longest known module that ``dotted`` names or sits in."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return dotted


def _layer(module: str) -> str:
    return module.split(".")[1]


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return _modules()


@pytest.fixture(scope="module")
def edges(modules: dict[str, Path]) -> list[Edge]:
    return _edges(modules)


def test_graph_sees_the_package(modules: dict[str, Path], edges: list[Edge]) -> None:
    # Guard against a walker that silently finds nothing.
    assert {_layer(m) for m in modules} == set(LAYERS)
    assert len(modules) > 50
    assert any(
        e.importer == "greenctl.planner.mig.model" and e.imported == "greenctl.data.mig_geometry"
        for e in edges
    )
    # Imports inside functions count.
    assert any(
        e.importer == "greenctl.planner.mig.solve" and e.imported == "greenctl.planner.mig.exact"
        for e in edges
    )


def test_no_import_cycles(modules: dict[str, Path], edges: list[Edge]) -> None:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if e.imported in modules:
            graph[e.importer].add(e.imported)
    cycles = _cycles(graph)
    assert cycles - KNOWN_CYCLES == set(), "new import circles"
    assert KNOWN_CYCLES - cycles == set(), "circles broken: drop them from KNOWN_CYCLES"


def test_layer_rules(edges: list[Edge]) -> None:
    violations = {
        (e.importer, e.imported)
        for e in edges
        if _layer(e.imported) != _layer(e.importer)
        and _layer(e.imported) not in ALLOWED_LAYERS[_layer(e.importer)]
    }
    assert violations - KNOWN_LAYER_VIOLATIONS == set(), "imports across layers"
    assert KNOWN_LAYER_VIOLATIONS - violations == set(), "fixed: drop from the list"


# The executor's rooms (ARCHITECTURE.md, "Layout"): the registry of plan kinds, what serves,
# making a plan real, keeping it right. A room imports the rooms it may (besides data,
# profiler and planner), never one above it.
EXECUTOR_ROOMS: dict[str, frozenset[str]] = {
    "kinds": frozenset(),
    "runtime": frozenset(),
    "deploy": frozenset({"kinds", "runtime"}),
    "control": frozenset({"kinds", "runtime", "deploy"}),
}

# Room rules still broken: (importing module, imported module).
KNOWN_ROOM_VIOLATIONS: frozenset[tuple[str, str]] = frozenset(
    {
        # the registry reads measured serving overheads (its shared helpers, for every kind);
        # the plan offers read the registry
        ("greenctl.executor.kinds.base", "greenctl.executor.runtime.serving"),
        ("greenctl.executor.runtime.offers", "greenctl.executor.kinds"),
        # the dispatcher restarts an executor on its MIG slice (the slice's UUID)
        ("greenctl.executor.runtime.dispatcher", "greenctl.executor.deploy.partition"),
        # the geo router's online step is a replan: the replan lock, the decision record
        ("greenctl.executor.deploy.georouter", "greenctl.executor.control.replan"),
    }
)


def _room(module: str) -> str | None:
    """The executor room a module sits in (``kinds`` for the registry package: its shared
    ``base`` and one module per kind), else None."""
    bits = module.split(".")
    if bits[:2] != ["greenctl", "executor"] or len(bits) < 3:
        return None
    return bits[2] if bits[2] in EXECUTOR_ROOMS else None


def test_executor_rooms(modules: dict[str, Path], edges: list[Edge]) -> None:
    """kinds and runtime import no other room; deploy imports kinds and runtime; control
    imports kinds, runtime and deploy."""
    rooms = {_room(m) for m in modules} - {None}
    assert rooms == set(EXECUTOR_ROOMS), rooms
    loose = sorted(
        m
        for m in modules
        if m.startswith("greenctl.executor.") and m.count(".") == 2 and _room(m) is None
    )
    assert loose == [], "modules of executor/ outside its rooms"
    violations = {
        (e.importer, e.imported)
        for e in edges
        if (here := _room(e.importer)) is not None
        and (there := _room(e.imported)) is not None
        and here != there
        and there not in EXECUTOR_ROOMS[here]
    }
    assert violations - KNOWN_ROOM_VIOLATIONS == set(), "an executor room imports one above it"
    assert KNOWN_ROOM_VIOLATIONS - violations == set(), "fixed: drop from the list"


KIND_MODULES = ("mix", "mig", "glet", "geo")

# Kind modules still reaching another kind: (importer, imported), the list only shrinks.
KNOWN_KIND_CROSSINGS: frozenset[tuple[str, str]] = frozenset()
#: the registry package's modules every kind shares (they import no kind)
SHARED_KIND_MODULES = ("base", "replaying", "serving_replay")


def _kind_of_module(module: str) -> str | None:
    """The kind a module of the registry package belongs to (``glet`` for ``glet`` and its
    replay step ``glet_replay``), None for the shared ones (:data:`SHARED_KIND_MODULES`)."""
    name = module.rpartition(".")[2]
    return name.removesuffix("_replay") if name not in SHARED_KIND_MODULES else None


def test_kind_modules_stand_alone(modules: dict[str, Path], edges: list[Edge]) -> None:
    """The registry package: ``base`` holds what every kind shares and imports no kind,
    ``replaying`` (the replay step's interface) and ``serving_replay`` (the replay the serving
    kinds share) import only the shared modules; a kind's modules (its record ``mix`` and its
    replay step ``mix_replay``) import those and each other, never another kind or the
    package that registers them."""
    package = "greenctl.executor.kinds"
    shared = {f"{package}.{name}" for name in SHARED_KIND_MODULES}
    assert {f"{package}.{k}" for k in ("base", *KIND_MODULES)} <= set(modules)
    crossing = {
        (e.importer, e.imported)
        for e in edges
        if e.importer.startswith(f"{package}.")
        and (e.imported == package or e.imported.startswith(f"{package}."))
        and e.imported != f"{package}.base"
        and not (e.imported in shared and e.importer != f"{package}.base")
        and not (
            _kind_of_module(e.importer) is not None
            and _kind_of_module(e.importer) == _kind_of_module(e.imported)
        )
    }
    assert crossing - KNOWN_KIND_CROSSINGS == set(), "a kind module imports another kind"
    assert KNOWN_KIND_CROSSINGS - crossing == set(), "fixed: drop from the list"


PLANNERS = ("mix", "mig", "glet", "geo")


def test_planner_subpackages_stand_alone(edges: list[Edge]) -> None:
    """planner/core is the evaluation core every planner shares: it imports no planner, and
    a planner (mix, mig, glet, geo) imports core, data and itself, never another planner."""

    def part(module: str) -> str | None:
        bits = module.split(".")
        return bits[2] if len(bits) > 3 and bits[:2] == ["greenctl", "planner"] else None

    crossing = {
        (e.importer, e.imported)
        for e in edges
        if part(e.importer) is not None
        and part(e.imported) in PLANNERS
        and part(e.imported) != part(e.importer)
    }
    assert crossing == set(), "a planner part imports another planner"
    assert {part(e.importer) for e in edges} >= {"core", *PLANNERS}


def test_no_private_names_across_modules(edges: list[Edge]) -> None:
    private = {
        (e.importer, f"{e.imported}.{n}")
        for e in edges
        for n in e.names
        if n.startswith("_") and not n.startswith("__")
    }
    assert private - KNOWN_PRIVATE_IMPORTS == set(), "private names imported"
    assert KNOWN_PRIVATE_IMPORTS - private == set(), "fixed: drop from the list"


def test_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {("a", "b", "c")}


# -- the store's tables are reached through named functions in data/ ---------------------------
#: sqlite-utils / sqlite3 calls that reach a table, a query or the connection
RAW_STORE_CALLS = frozenset(
    {"table", "tables", "table_names", "query", "execute", "executescript", "conn", "view"}
)


#: the store's own raw accessors (plain SQL, the sqlite3 connection), for data/ alone
RAW_STORE_ACCESSORS = frozenset({"rows", "has_table", "conn"})


def _store_names(tree: ast.AST) -> set[str]:
    """Names a module binds to a store: parameters and variables annotated ``Store``, and
    what ``open_store(...)`` is assigned to (``x = open_store()``, ``with ... as x``)."""

    def is_store_type(node: ast.expr | None) -> bool:
        return node is not None and any(
            (isinstance(n, ast.Name) and n.id == "Store")
            or (isinstance(n, ast.Attribute) and n.attr == "Store")
            or (isinstance(n, ast.Constant) and n.value in ("Store", "Store | None"))
            for n in ast.walk(node)
        )

    def opens(node: ast.expr | None) -> bool:
        func = node.func if isinstance(node, ast.Call) else None
        return isinstance(func, ast.Name | ast.Attribute) and (
            getattr(func, "id", None) == "open_store" or getattr(func, "attr", None) == "open_store"
        )

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and is_store_type(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and is_store_type(node.annotation):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Assign) and opens(node.value):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.withitem) and opens(node.context_expr) and node.optional_vars:
            names |= {n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)}
    return names


def _is_store(node: ast.expr, names: set[str]) -> bool:
    """Whether ``node`` reads as a store: a name bound to one, or any name or attribute
    called ``*store*`` (``store``, ``self.store``, ``ctx.store``)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and (name in names or "store" in name.lower())


def _raw_store_calls(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``x.db.table(...)``-style uses: a raw-store attribute of ``<anything>.db`` or of a
    name ``db``; the store's raw accessors (``store.rows(...)``, ``store.has_table(...)``,
    ``store.conn``); imports of sqlite3 / sqlite_utils."""
    names = _store_names(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in RAW_STORE_ACCESSORS
            and _is_store(node.value, names)
        ):
            yield node.lineno, f"store.{node.attr}"
        if isinstance(node, ast.Attribute) and node.attr in RAW_STORE_CALLS:
            inner = node.value
            if (isinstance(inner, ast.Attribute) and inner.attr == "db") or (
                isinstance(inner, ast.Name) and inner.id == "db"
            ):
                yield node.lineno, f"db.{node.attr}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("sqlite3", "sqlite_utils"):
                    yield node.lineno, f"import {alias.name}"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] in ("sqlite3", "sqlite_utils")
        ):
            yield node.lineno, f"from {node.module} import"


def test_only_data_touches_the_store_tables(modules: dict[str, Path]) -> None:
    """Every query sits behind a named function in data/ (ARCHITECTURE.md): the executor's
    state (:mod:`greenctl.data.deployments`), the control loop's
    (:mod:`greenctl.data.loop_state`), the serving runs (:mod:`greenctl.data.serving_rows`)."""
    found = sorted(
        f"{path.relative_to(REPO)}:{line}: {what}"
        for name, path in modules.items()
        if _layer(name) != "data"
        for line, what in _raw_store_calls(ast.parse(path.read_text(encoding="utf-8")))
    )
    assert found == [], "raw store calls outside data/ (put them behind a data/ function)"


def test_the_raw_store_call_finder_finds_them() -> None:
    tree = ast.parse(
        "store.db.table('x').insert({})\n"
        "rows = store.db.query('select 1')\n"
        "db.execute('update x set y = 1')\n"
        "import sqlite3\n"
        "open_store(self.db)\n"  # a path called db is not a store call
        "args.db\n"
        "store.rows('select 1')\n"
        "self.store.has_table('x')\n"
        "scratch = open_store(path)\n"
        "scratch.conn.commit()\n"
        "def f(s: Store, t: 'Store | None') -> None:\n"
        "    s.rows('select 1'), t.conn\n"
        "with open_store() as st:\n"
        "    st.has_table('x')\n"
        "table.rows, faults.rows(), sock.conn\n"  # rows of something else are not the store's
    )
    assert sorted(_raw_store_calls(tree)) == [
        (1, "db.table"),
        (2, "db.query"),
        (3, "db.execute"),
        (4, "import sqlite3"),
        (7, "store.rows"),
        (8, "store.has_table"),
        (10, "store.conn"),
        (12, "store.conn"),
        (12, "store.rows"),
        (14, "store.has_table"),
    ]

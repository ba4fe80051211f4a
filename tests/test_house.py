"""The house stays easy to carry on: small modules and functions, short parameter lists, no
folder holding too much, docstrings without history, the registry as the only list of plan
kinds, and ``greenctl --help`` free of the heavy imports (ARCHITECTURE.md, "Rules that keep
the house easy to live in").

Each rule is measured statically with :mod:`ast` over the library folders; the few long
functions that stay are listed below with the reason each keeps its length, and the list
may only shrink.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("cli", "data", "planner", "profiler", "executor")

MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 100
MAX_PARAMS = 12
MAX_COMMAND_PARAMS = 25
MAX_FOLDER_SHARE = 0.2

#: Functions allowed past :data:`MAX_FUNCTION_LINES` ("module:function" -> why); at most ten.
LONG_FUNCTIONS: dict[str, str] = {
    "planner/core/batch_latency.py:_pipelined_batching": "one fixed-point solve of a pipelined"
    " batch queue; its steps share the iterate",
    "planner/core/batch_latency.py:_eager_batching": "one fixed-point solve of an eager batch"
    " queue; its steps share the iterate",
}

#: The modules a heavy import must stay out of the top level of (``greenctl --help`` and
#: every command that does not use them pay for them otherwise).
HEAVY = (
    "torch",
    "pynvml",
    "ray",
    "matplotlib",
    "scipy",
    "pandas",
    "highspy",
    "kubernetes",
    "onnxruntime",
)

KIND_NAMES = frozenset({"mix", "mig", "glet", "geo"})

#: Modules outside executor/kinds/ and planner/ that still compare a value with a plan kind's
#: name ("module:line" of each comparison); the list may only shrink.
KNOWN_KIND_SWITCHES: frozenset[str] = frozenset()

ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)", re.IGNORECASE)


def _modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for folder in LIBRARY:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            yield rel, path, ast.parse(path.read_text(), filename=rel)


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)


def _is_command(rel: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command: a function of cli/ whose parameters are declared as typer options."""
    if not rel.startswith("cli/"):
        return False
    a = fn.args
    annotations = [x.annotation for x in (*a.args, *a.kwonlyargs) if x.annotation is not None]
    return any("Opt" in ast.unparse(ann) or "typer." in ast.unparse(ann) for ann in annotations)


def test_no_module_over_the_limit() -> None:
    big = {
        rel: n
        for rel, path, _ in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concept"


def test_long_functions_are_few_and_said_why() -> None:
    assert len(LONG_FUNCTIONS) <= 10
    long = {
        f"{rel}:{fn.name}"
        for rel, _, tree in _modules()
        for fn in _functions(tree)
        if fn.end_lineno is not None and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long - set(LONG_FUNCTIONS) == set(), "a function over 100 lines: split it"
    assert set(LONG_FUNCTIONS) - long == set(), "no longer long: drop it from the list"


def test_parameter_lists_stay_short() -> None:
    over = {
        f"{rel}:{fn.name}": n
        for rel, _, tree in _modules()
        for fn in _functions(tree)
        if (n := _params(fn)) > (MAX_COMMAND_PARAMS if _is_command(rel, fn) else MAX_PARAMS)
    }
    assert over == {}, "more parameters than the limit: a type is missing"


def test_no_folder_holds_more_than_a_fifth() -> None:
    lines: dict[str, int] = {}
    for rel, path, _ in _modules():
        folder = rel.rsplit("/", 1)[0]
        lines[folder] = lines.get(folder, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    heavy = {f: round(n / total, 3) for f, n in lines.items() if n > MAX_FOLDER_SHARE * total}
    assert heavy == {}


def test_no_history_in_docstrings_or_comments() -> None:
    cited = []
    for rel, path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                if ISSUE_REFERENCE.search(doc):
                    cited.append(f"{rel}:{getattr(node, 'name', '<module>')}")
        for no, line in enumerate(path.read_text().splitlines(), 1):
            comment = line.partition("#")[2] if "#" in line else ""
            if ISSUE_REFERENCE.search(comment):
                cited.append(f"{rel}:{no}")
    assert cited == [], "issue numbers belong in commit messages"


def test_no_heavy_import_at_the_top_of_a_module() -> None:
    top = [
        f"{rel}:{node.lineno}"
        for rel, _, tree in _modules()
        for node in tree.body
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        if name.split(".")[0] in HEAVY
    ]
    assert top == [], "import heavy modules inside the functions that use them"


def test_help_imports_no_heavy_module() -> None:
    """``greenctl --help`` (the entry point itself) loads none of the heavy modules."""
    code = (
        "import sys\n"
        "sys.argv = ['greenctl', '--help']\n"
        "from greenctl.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "Usage" in out.stdout
    assert out.stderr.strip().splitlines()[-1:] in ([], [""]), out.stderr


def test_the_registry_is_the_only_list_of_kinds() -> None:
    """No tuple, list, set or dict outside executor/kinds/ names two plan kinds: the kinds,
    their policy defaults and which of them replay come from the registry."""
    lists = []
    for rel, _, tree in _modules():
        if rel.startswith("executor/kinds/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                items: list[ast.expr | None] = list(node.elts)
            elif isinstance(node, ast.Dict):
                items = list(node.keys)
            else:
                continue
            names = {i.value for i in items if isinstance(i, ast.Constant)} & KIND_NAMES
            if len(names) >= 2:
                lists.append(f"{rel}:{node.lineno}")
    assert lists == []


def _kind_names_in(node: ast.expr) -> set[str]:
    """The plan kinds' names ``node`` is (a string) or holds (a tuple, list or set of them)."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant)} & KIND_NAMES


def _kind_switches(tree: ast.Module) -> Iterator[int]:
    """The lines of ``tree`` that compare a value with a kind's name: ``x == "geo"``,
    ``x != "mix"``, ``x in ("glet", ...)`` or a ``match`` case ``"mig"``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            pairs = zip(
                [node.left, *node.comparators[:-1]], node.ops, node.comparators, strict=True
            )
            for left, op, right in pairs:
                if isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) and (
                    _kind_names_in(left) or _kind_names_in(right)
                ):
                    yield node.lineno
                    break
        elif isinstance(node, ast.MatchValue) and _kind_names_in(node.value):
            yield node.lineno


def test_no_switch_on_a_kind_name_outside_the_kinds_and_planners() -> None:
    """What differs by kind comes from the kind's module (a field of its record, of its replay
    step or of what it writes: ``meta.layout``, a plan's ``extra.sites``): no module outside
    executor/kinds/ and planner/ compares a value with a kind's name."""
    found = {
        f"{rel}:{line}"
        for rel, _, tree in _modules()
        if not rel.startswith(("executor/kinds/", "planner/"))
        for line in _kind_switches(tree)
    }
    assert found - KNOWN_KIND_SWITCHES == set(), "a kind-name switch: let the kind say it"
    assert KNOWN_KIND_SWITCHES - found == set(), "gone: drop it from the list"


def test_the_kind_switch_finder_finds_them() -> None:
    tree = ast.parse(
        'if plan.kind == "geo": pass\n'
        'ok = kind in ("mix", "mig")\n'
        'same = "glet" != meta["kind"]\n'
        'match kind:\n    case "mix":\n        pass\n'
        'fine = action == "change" or kind == name\n'
    )
    assert sorted(_kind_switches(tree)) == [1, 2, 3, 5]

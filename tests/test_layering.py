"""The house's floors: every import arrow points down, no import cycle at module level, and
no module reaches into another module's private names.

    telemetry ◄── executor (executor.model: model, engine, recovery) ◄── chaos ◄── faultlab (app)

Read from the source (``ast``), so a violation names its file and line.  The debts that
remain are listed below by name, each with the issue that pays it; a new violation fails,
and so does a listed one that was paid (keep the list honest).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"telemetry": 0, "executor": 1, "chaos": 2, "faultlab": 3}
PACKAGES = {"telemetry", "executor", "executor.model", "chaos", "chaos.targets",
            "chaos.planted_judges", "faultlab"}
# Known debts, each named with the issue that pays it (none left).
UPWARD_DEBT: set[tuple[str, str]] = set()
CYCLE_DEBT: set[frozenset[str]] = set()
REACH_IN_DEBT: set[str] = set()
# Planted bugs patch executor internals on purpose (chaos/mutants.py says so), and planted
# judges the judges' internals (chaos/planted_judges/__init__.py).
REACH_IN_ALLOWED = {"chaos/mutants.py"}
REACH_IN_ALLOWED_UNDER = ("chaos/planted_judges/",)


def _modules() -> dict[str, Path]:
    found = {}
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(tree: ast.Module, top_level_only: bool) -> list[str]:
    nodes: list[ast.AST] = []
    for stmt in tree.body if top_level_only else [tree]:
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.dump(stmt.test):
            continue  # never executed: not an import at run time
        nodes += ast.walk(stmt) if not top_level_only or isinstance(stmt, (ast.If, ast.Try)) \
            else [stmt]
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return out


def test_every_import_arrow_points_down() -> None:
    upward = set()
    for name, path in MODULES.items():
        floor = FLOORS[name.split(".")[0]]
        for target in _imports(ast.parse(path.read_text()), top_level_only=False):
            top = target.split(".")[0]
            if top in FLOORS and FLOORS[top] > floor and target in MODULES:
                upward.add((name, target))
    assert upward - UPWARD_DEBT == set(), "imports that point up a floor"
    assert UPWARD_DEBT - upward == set(), "paid debts: drop them from UPWARD_DEBT"


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_at_module_level() -> None:
    """Package ``__init__`` files are facades (they re-export), not nodes of the graph."""
    graph = {name: {t for t in _imports(ast.parse(path.read_text()), top_level_only=True)
                    if t in MODULES and t != name and t not in PACKAGES}
             for name, path in MODULES.items()}
    cycles = set(_cycles(graph))
    assert cycles - CYCLE_DEBT == set(), "module-level import cycles"
    assert CYCLE_DEBT - cycles == set(), "paid debts: drop them from CYCLE_DEBT"


def _private_definitions() -> dict[str, set[Path]]:
    """Private names (methods, functions, ``self._x`` fields) and the files defining them."""
    defined: dict[str, set[Path]] = defaultdict(set)
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                defined[name].add(path)
    return defined


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """``obj._name`` (obj not ``self``/``cls``) where ``_name`` is defined in another of our
    modules: a friend module, coupled to internals it does not own."""
    defined = _private_definitions()
    reach_ins: dict[str, list[str]] = defaultdict(list)
    for path in MODULES.values():
        rel = str(path.relative_to(ROOT))
        if rel in REACH_IN_ALLOWED or rel.startswith(REACH_IN_ALLOWED_UNDER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            owners = defined.get(node.attr, set())
            if owners and path not in owners:
                reach_ins[rel].append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    new = {rel: hits for rel, hits in reach_ins.items() if rel not in REACH_IN_DEBT}
    assert new == {}, "reach-ins into other modules' private names"
    assert REACH_IN_DEBT - set(reach_ins) == set(), "paid debts: drop them from REACH_IN_DEBT"

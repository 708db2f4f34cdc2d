"""The import graph of a package, read statically (``ast``), and the floors its modules stand on.

A module's *floor* is computed from its imports: 0 for a module that imports none of its package's
modules, else one more than the highest floor it imports. Every import counts, at the top of a file or
inside a function (a lazy import is still an arrow), except those under ``if TYPE_CHECKING:``. A cycle
has no floor. Each package also declares its *storeys*: named groups of modules, bottom first; an arrow
from a module to a module of a higher storey is an *upward import*. ``tests/test_import_floors.py``
holds the declared storeys and fails on either fault.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Mapping, Sequence


def module_name(package_dir: Path, path: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, skipping ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package_dir: str | Path) -> dict[str, set[str]]:
    """Module -> the package's own modules it imports (``from pkg import sub`` is an arrow to ``pkg.sub``;
    ``from pkg import name`` one to ``pkg``, whose ``__init__`` defines or re-exports ``name``)."""
    package_dir = Path(package_dir)
    files = {module_name(package_dir, p): p for p in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        arrows: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                arrows.update(a.name for a in node.names)
                continue
            base = node.module or ""
            if node.level:
                prefix = here[:len(here) - (node.level - 1)]
                base = ".".join(prefix + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
            arrows.update(subs)
            if len(subs) < len(node.names):
                arrows.add(base)
        graph[name] = {a for a in arrows if a in files and a != name}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floors(graph: Mapping[str, set[str]]) -> dict[str, int]:
    """Each module's floor (see the module docstring); modules on or above a cycle get none."""
    out: dict[str, int] = {}
    remaining = dict(graph)
    while remaining:
        ready = [m for m, deps in remaining.items() if all(d in out for d in deps)]
        if not ready:
            break
        for m in ready:
            out[m] = 1 + max((out[d] for d in remaining[m]), default=-1)
            del remaining[m]
    return out


def storey_of(module: str, storeys: Sequence[tuple[str, Sequence[str]]]) -> int | None:
    """Index of the storey whose longest matching pattern names ``module`` (a pattern names a module and,
    ending in ``.*``, everything under a package)."""
    best, best_len = None, -1
    for i, (_, patterns) in enumerate(storeys):
        for pattern in patterns:
            stem = pattern[:-2] if pattern.endswith(".*") else pattern
            hit = module == stem or (pattern.endswith(".*") and module.startswith(stem + "."))
            if hit and len(pattern) > best_len:
                best, best_len = i, len(pattern)
    return best


def faults(graph: Mapping[str, set[str]], storeys: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """One line per fault: a cycle, a module no storey names, an upward import."""
    out = [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    where = {m: storey_of(m, storeys) for m in graph}
    out += [f"{m} is on no declared storey" for m, s in sorted(where.items()) if s is None]
    for m in sorted(graph):
        for d in sorted(graph[m]):
            if where[m] is not None and where[d] is not None and where[d] > where[m]:
                out.append(f"upward import: {m} ({storeys[where[m]][0]}) imports {d} ({storeys[where[d]][0]})")
    return out

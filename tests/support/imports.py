"""The imports of a package's modules, read from their source (``ast``): one parser for the architecture
tests (layers, the ORT door) and the import-cycle test.

Each import statement is resolved to the package's modules it loads (relative imports included;
``from pkg import sub`` names the submodule when there is one, else ``pkg`` itself) and tagged with
where it sits: at module level (also inside ``if``/``try``/``with`` blocks there) or inside a function
or class body, and whether it is under ``if TYPE_CHECKING``. :func:`strongly_connected` finds the
groups of modules that import each other (Tarjan's algorithm) in a graph built from them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Statements whose blocks still run when the module is imported.
_MODULE_LEVEL_BLOCKS = (ast.Module, ast.If, ast.Try, ast.TryStar, ast.With, ast.ExceptHandler)


@dataclass(frozen=True)
class Import:
    """One module of the package that an import statement loads."""

    target: str
    line: int
    #: at module level (or in an ``if``/``try``/``with`` block there): loaded when the module is
    module_level: bool
    #: inside an ``if TYPE_CHECKING:`` body: read by type checkers only
    type_checking: bool


def package_modules(root: Path) -> dict[str, Path]:
    """``{dotted module name: path}`` for every ``.py`` file under package directory ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _statements(
    node: ast.AST, module_level: bool, type_checking: bool
) -> list[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """The import statements under ``node`` in source order, with (module level, TYPE_CHECKING)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
    inner_level = module_level and isinstance(node, _MODULE_LEVEL_BLOCKS)
    guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    for field, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        for child in children:
            if not isinstance(child, ast.AST):
                continue
            checking = type_checking or (guarded and field == "body")
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, inner_level, checking))
            else:
                found += _statements(child, inner_level, checking)
    return found


def module_imports(module: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every module of ``modules`` that ``module`` (at ``path``) imports, one entry per statement and target."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node, module_level, type_checking in _statements(tree, True, False):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = node.module or ""
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
            targets = subs if len(subs) == len(node.names) else [source, *subs]
        for target in targets:
            while target and target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != module:
                found.append(Import(target, node.lineno, module_level, type_checking))
    return found


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The groups of two or more nodes of ``graph`` (node -> the nodes it points to) that reach
    each other (Tarjan's strongly connected components, iteratively, in sorted order).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(graph.get(node, ())))

    for root in sorted(graph):
        if root in index:
            continue
        work = [visit(root)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append(visit(child))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.add(top)
                    if top == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups

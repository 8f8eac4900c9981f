"""No two modules of the package import each other, at module level, by any path.

``test_architecture.py`` reads every import, including those inside functions, and
leaves out those under ``TYPE_CHECKING``. Here the graph is the modules' own import
statements: those at module level, in ``if``/``try`` blocks there too, and those under
``TYPE_CHECKING`` (an import for an annotation still says that the module cannot be
read without the other); imports inside functions are left out (they load on first
use). A cycle in that graph means two concepts that cannot be understood apart (for
instance, a session that persists its weight average and an average callback that
annotates the session). The test names each cycle, in import order, with the line of
each import.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from support.imports import module_imports, package_modules, strongly_connected

PACKAGE = Path(__file__).resolve().parents[2] / "onnxblocks"


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` over the module-level imports of package ``root``."""
    modules = package_modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for found in module_imports(module, path, modules):
            if found.module_level:
                edges.setdefault(found.target, found.line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules, as a closed path."""
    return [_path_through(graph, group) for group in strongly_connected(graph)]


def _path_through(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """The shortest closed path from the group's first module back to itself, inside the group."""
    start = min(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in group:
                    continue
                if child == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = previous[node]
                    return [start, *reversed(path[1:]), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return sorted(group)


def _describe(graph: dict[str, dict[str, int]], path: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(path)]
    return " -> ".join([*steps, path[-1]])


def test_the_package_has_no_module_level_import_cycle():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "module-level import cycles (TYPE_CHECKING imports included):\n" + "\n".join(
        _describe(graph, path) for path in found
    )


def test_the_checker_finds_a_cycle_through_a_type_checking_import(tmp_path):
    """The checker itself: the circle the session once had (a TYPE_CHECKING edge closing it)
    is found and named; an import inside a function is no edge."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "session.py").write_text("from pkg.ema import Average\n")
    (root / "ema.py").write_text("from pkg import callbacks\n")
    (root / "callbacks.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.fit import Run\n"
    )
    (root / "fit.py").write_text("import pkg.session\n")
    (root / "lazy.py").write_text("def f():\n    from pkg import session\n")
    (root / "uses_lazy.py").write_text("from pkg import lazy\n")
    graph = import_graph(root)
    assert graph["pkg.lazy"] == {}
    found = cycles(graph)
    assert found == [["pkg.callbacks", "pkg.fit", "pkg.session", "pkg.ema", "pkg.callbacks"]]
    assert _describe(graph, found[0]) == (
        "pkg.callbacks (line 3) -> pkg.fit (line 1) -> pkg.session (line 1) -> pkg.ema (line 1)"
        " -> pkg.callbacks"
    )

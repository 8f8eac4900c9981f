"""Deferring the import of onnx-ir's symbolic-shape algebra (sympy) until a symbolic dimension is
computed with.

``onnx_ir`` imports ``sympy`` (about 0.2 s) when it is imported, for arithmetic on
symbolic dimensions that graph edits here never do. Importing this module first
makes ``sympy`` and ``onnx_ir._symbolic_shapes`` lazy modules
(:class:`importlib.util.LazyLoader`): they load on first attribute access, so
whoever does compute with symbolic dimensions (or imports sympy itself, as torch
does) gets the real modules, and nobody else pays for them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

#: The modules loaded lazily.
DEFERRED = frozenset({"sympy", "onnx_ir._symbolic_shapes"})


class _DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`DEFERRED` as the path finder does, with a lazy loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer_heavy_imports() -> None:
    """Install the deferring finder once (a no-op when the modules are already imported)."""
    if any(isinstance(f, _DeferringFinder) for f in sys.meta_path):
        return
    if all(name in sys.modules for name in DEFERRED):
        return
    sys.meta_path.insert(0, _DeferringFinder())


defer_heavy_imports()

"""One table of torch's ONNX translations per opset, shared by this process's dynamo exports.

``torch.onnx.export(dynamo=True)`` starts every call by building its registry of ATen-to-ONNX
functions from torchlib: it parses the source of about 500 onnxscript functions to infer their
signatures, 2-5 s of CPU per export, often more than the rest of a small module's export. The table
depends only on the installed torch and onnxscript and on the opset, so :func:`shared_registry`
builds it once per opset and hands each export a copy of its own (an export adds the call's custom
translations to its copy, and must not add them to the next call's). The graph exported is the
same. Where torch's exporter has no such registry (another torch version), exports run unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

#: Held for the whole export: the registry's builder is swapped on torch's class meanwhile.
_LOCK = threading.RLock()
_TABLES: dict[Any, Any] = {}


def _registry_class() -> Any:
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:  # pragma: no cover - a torch without the dynamo exporter
        return None
    registry: Any = getattr(_registration, "ONNXRegistry", None)
    built = None if registry is None else registry.__dict__.get("from_torchlib")
    if not isinstance(built, classmethod) or not hasattr(registry(), "functions"):
        return None  # pragma: no cover - another torch: its exporter builds its own table
    return registry


def _copy(table: Any) -> Any:
    fresh = copy.copy(table)
    fresh.functions = {target: list(functions) for target, functions in table.functions.items()}
    return fresh


@contextlib.contextmanager
def shared_registry() -> Iterator[None]:
    """Run a block of dynamo exports with torchlib's table built once per opset for the process."""
    registry = _registry_class()
    if registry is None:  # pragma: no cover - another torch
        yield
        return
    with _LOCK:
        original = registry.__dict__["from_torchlib"]
        build = original.__func__

        def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
            if cls is not registry:  # a subclass builds its own
                return build(cls, *args, **kwargs)
            key = (args, tuple(sorted(kwargs.items())))
            if key not in _TABLES:
                _TABLES[key] = build(cls, *args, **kwargs)
            return _copy(_TABLES[key])

        registry.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            registry.from_torchlib = original

"""Opening a build: ``base(model)`` and ``empty_base()``, and finding the active one.

The active accessor sits in the context-scoped slot of :mod:`onnxblocks._core.active_build`,
so builds in two threads (or two asyncio tasks) never see each other, and a nested
build restores the outer one when it ends.

``base`` works on a copy of the caller's model in which large initializers are
stubs (see :mod:`onnxblocks._core.weights`): the caller's ModelProto is never
mutated and its weights are never copied while the graph is built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core import active_build as _context
from onnxblocks._core import limits as _limits
from onnxblocks._core import weights as _weights
from onnxblocks._core.active_build import custom_op_libraries, custom_op_library
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks._core.proto import copy_fields
from onnxblocks.blocks.accessor import ModelAccessor

__all__ = [
    "active",
    "base",
    "current",
    "custom_op_libraries",
    "custom_op_library",
    "empty_base",
    "working_copy",
]


def current() -> ModelAccessor:
    """The accessor of the build this code runs in.

    Raises:
        NoActiveModelError: outside ``onnxblocks.base(...)`` / ``onnxblocks.empty_base()``.
    """
    accessor: ModelAccessor = _context.current()
    return accessor


def active() -> ModelAccessor | None:
    """The active accessor, or None outside a build."""
    accessor: ModelAccessor | None = _context.active()
    return accessor


def working_copy(
    model: onnx.ModelProto,
    model_path: str | os.PathLike | None = None,
    hold_threshold: int | None = None,
) -> tuple[onnx.ModelProto, _weights.WeightStore]:
    """Copy a model's structure, holding large initializers aside as stubs.

    The caller's model is not mutated, and held initializers' bytes are not copied.
    """
    store = _weights.WeightStore()
    base_dir = Path(model_path).parent if model_path is not None else None
    copy = onnx.ModelProto()
    copy_fields(model, copy, skip={"graph"})
    copy_fields(model.graph, copy.graph, skip={"initializer"})
    for init in model.graph.initializer:
        if _weights.should_hold(init, hold_threshold):
            copy.graph.initializer.append(store.hold(init, base_dir))
        else:
            copy.graph.initializer.append(init)
    return copy, store


@contextmanager
def base(
    model: onnx.ModelProto, model_path: str | os.PathLike | None = None
) -> Iterator[ModelAccessor]:
    """Open a build on top of ``model``.

    Example:
        >>> with onnxblocks.base(model) as accessor:
        ...     loss = onnxblocks.losses.MSELoss()("output")
        >>> finished = accessor.model

    Args:
        model: The base model. It is not mutated; its large initializers are not copied.
        model_path: The file the model was loaded from; needed when the model keeps
            its weights in external data files (loaded with ``load_external_data=False``).

    Yields:
        The :class:`ModelAccessor` of the build.

    The build works on a copy that onnxblocks fixes where it can: a model above the
    opset onnxruntime-training 1.19.2 implements (21) is converted down with onnx's
    version converter, and nodes out of topological order are sorted.

    Raises:
        TypeError: if ``model`` is not an ``onnx.ModelProto`` or ``model_path`` not a path.
        ValueError: if the model has no ai.onnx opset import, needs a newer opset than
            onnxruntime-training 1.19.2 supports and cannot be converted (the message names
            the ops that block it), its nodes form a cycle, or it defines a value twice or
            reads one that nothing defines (the message names the value and the node).
    """
    if not isinstance(model, onnx.ModelProto):
        hint = (
            " Load it first with onnx.load(path), or pass the path as model_path."
            if isinstance(model, (str, os.PathLike))
            else ""
        )
        raise InvalidTypeError(
            f"onnxblocks.base() takes an onnx.ModelProto, not {type(model).__name__}.{hint}"
        )
    if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
        raise InvalidTypeError(
            f"model_path must be the path (str or os.PathLike) of the model's .onnx file, not "
            f"{type(model_path).__name__}: {model_path!r}."
        )
    from onnxblocks.gradient.intake import (
        fit_model,
    )  # a lower layer, loaded on first use (import time)
    from onnxblocks.ir import wellformed

    wellformed.check_model(
        model, model_path
    )  # a value defined twice or never: named before the build reads it
    working, store = working_copy(model, model_path)
    working = fit_model(working, "the base model")
    with _activate(ModelAccessor(working, model_path, store)) as accessor:
        yield accessor


@contextmanager
def empty_base(opset_version: int | None = None) -> Iterator[ModelAccessor]:
    """Open a build on a new, empty model.

    Args:
        opset_version: The ai.onnx opset to import, 1 to 21; defaults to the highest that
            onnxruntime-training 1.19.2 supports (21).

    Raises:
        TypeError: if ``opset_version`` is not an int.
        ValueError: if ``opset_version`` is below 1 or above what the runtime supports.
    """
    if isinstance(opset_version, np.integer):
        opset_version = int(opset_version)
    if opset_version is not None and (
        isinstance(opset_version, bool) or not isinstance(opset_version, int)
    ):
        raise InvalidTypeError(
            f"empty_base(opset_version=...) takes an int (1 to {_limits.MAX_ONNX_OPSET}) or "
            "None, not "
            f"{type(opset_version).__name__}: {opset_version!r}."
        )
    if opset_version is not None and opset_version < 1:
        raise InvalidValueError(
            f"empty_base(opset_version={opset_version}): ai.onnx opsets start at 1. Pass a "
            "version from 1 to "
            f"{_limits.MAX_ONNX_OPSET}, or None for {_limits.MAX_ONNX_OPSET}."
        )
    version = opset_version or _limits.MAX_ONNX_OPSET
    model = helper.make_model(
        helper.make_graph([], "graph", [], []),
        opset_imports=[
            helper.make_opsetid("", version),
            helper.make_opsetid(_limits.MS_DOMAIN, _limits.MS_OPSET),
        ],
        producer_name="onnxblocks",
    )
    _limits.check_opset_supported(model, f"opset_version={version}")
    _limits.stamp_versions(model)
    empty = ir.Model(
        ir.Graph([], [], nodes=[], opset_imports={o.domain: o.version for o in model.opset_import}),
        ir_version=model.ir_version,
        producer_name=model.producer_name,
    )
    empty.graph.name = model.graph.name
    with _activate(ModelAccessor(empty)) as accessor:
        yield accessor


@contextmanager
def _activate(accessor: ModelAccessor) -> Iterator[ModelAccessor]:
    try:
        with _context.activate(accessor):
            yield accessor
    finally:
        accessor.close()

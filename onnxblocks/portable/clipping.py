"""Gradient clipping in standard ops: ONNX Runtime's ``InplaceClipGradNorm`` (torch's
``clip_grad_norm_``) over all gradients, then by each parameter group's ``max_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from onnxblocks.portable import groups as _groups
from onnxblocks.portable.lowering_context import Writer

if TYPE_CHECKING:
    from onnxblocks.portable.optimizer_spec import OptimizerSpec

#: ``InplaceClipGradNorm``'s epsilon: ``coefficient = min(max_norm / (norm + 1e-6), 1)``.
CLIP_EPSILON = 1e-6


def clip_gradients(
    w: Writer, gradients: Sequence[ir.Value], max_norm: float, dtype: np.dtype
) -> list[ir.Value]:
    """Scale ``gradients`` by ``min(max_norm / (global L2 norm + 1e-6), 1)``."""
    squares = [w.reduce("ReduceSumSquare", g, None, keepdims=0) for g in gradients]
    total = w.op("Sqrt", [w.op("Sum", squares) if len(squares) > 1 else squares[0]])
    ratio = w.op(
        "Div", [w.scalar(max_norm, dtype), w.op("Add", [total, w.scalar(CLIP_EPSILON, dtype)])]
    )
    coefficient = w.op("Min", [ratio, w.scalar(1.0, dtype)])
    return [w.op("Mul", [g, coefficient]) for g in gradients]


def clip(
    w: Writer, spec: OptimizerSpec, gradients: Sequence[ir.Value], names: Sequence[str]
) -> list[ir.Value]:
    """The gradients clipped by the global norm (``spec.max_norm``), then by each group's
    ``max_norm``, as asked.
    """
    grads = (
        clip_gradients(w, gradients, spec.max_norm, spec.dtype)
        if spec.max_norm is not None
        else list(gradients)
    )
    return _groups.clip_by_group(
        spec.layout(), names, grads, lambda gs, m: clip_gradients(w, gs, m, spec.dtype)
    )


__all__ = ["CLIP_EPSILON", "clip", "clip_gradients"]

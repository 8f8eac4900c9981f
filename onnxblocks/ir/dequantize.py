"""Reading a quantized initializer: ``DequantizeLinear`` delayed until its reader is about to run.

:func:`onnxblocks.ir.edit.cast_initializers` reads a weight stored as int8 or int4 (blockwise
scales, no zero point) through the nodes :func:`delayed_dequantize` makes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority

__all__ = ["delayed_dequantize"]


def delayed_dequantize(
    graph: ir.Graph,
    value: ir.Value,
    to: ir.DataType,
    trigger: ir.Value | None,
    decode: tuple[ir.Value, int],
    node: Callable[..., ir.Node],
    names: NameAuthority,
    hint: str,
    zero_point: ir.Value | None = None,
    axis: int = -1,
) -> list[ir.Node]:
    """``DequantizeLinear(value, scale[, zero_point])`` once ``trigger`` is ready: the scale is read
    through a
    ``Reshape`` computed from the trigger (ONNX Runtime 1.19 has no int4 ``Reshape`` for the
    weight itself), and the result goes through a ``Reshape`` too (no copy): ONNX Runtime 1.19's
    transpose optimizer would move a ``Transpose`` of it through the blocked dequantization
    with a wrong scale layout.

    ``decode`` is ``(scale, block_size)``: blocks along ``axis``, or, with a block size of 0,
    one scale per tensor (a scalar) or per element of ``axis`` (a vector; opset 13).
    """
    scale, block = decode
    blocked = {"axis": axis, "block_size": block} if block else {"axis": axis}
    extra = [zero_point] if zero_point is not None else []
    shape = value.shape
    static = shape is not None and all(isinstance(d, int) for d in shape)
    if trigger is None or not static or scale.shape is None:
        dq = node("DequantizeLinear", [value, scale, *extra], **blocked)
        dq.outputs[0].dtype, dq.outputs[0].shape = to, shape
        return [dq]
    assert shape is not None
    empty = node("Shape", [trigger], start=0, end=0)
    nodes = [empty]

    def reshaped(x: ir.Value, dims: ir.Shape) -> ir.Value:
        constant = ir.Value(
            name=names.fresh(f"{hint}.dims"),
            const_value=ir.tensor(np.asarray(dims.numpy(), np.int64), name=""),
        )
        constant.const_value.name = constant.name  # type: ignore[union-attr]
        graph.register_initializer(constant)
        joined = node("Concat", [empty.outputs[0], constant], axis=0)
        out = node("Reshape", [x, joined.outputs[0]])
        nodes.extend([joined, out])
        return out.outputs[0]

    read_scale = reshaped(scale, scale.shape)
    dq = node("DequantizeLinear", [value, read_scale, *extra], **blocked)
    dq.outputs[0].dtype, dq.outputs[0].shape = to, shape
    nodes.append(dq)
    result = reshaped(dq.outputs[0], shape)
    result.dtype, result.shape = to, shape
    return nodes

"""Reading a quantized initializer: ``DequantizeLinear`` delayed until its reader is about to run.

:func:`onnxblocks.ir.edit.cast_initializers` reads a weight stored as int8 or int4 (blockwise
scales, no zero point) through the nodes :func:`delayed_dequantize` makes.
"""

from __future__ import annotations

from collections.abc import Callable

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
) -> list[ir.Node]:
    """``DequantizeLinear(value, scale)`` once ``trigger`` is ready: the scale is read through a
    ``Reshape`` computed from the trigger (ONNX Runtime 1.19 has no int4 ``Reshape`` for the
    weight itself), and the result goes through a ``Reshape`` too (no copy): ONNX Runtime 1.19's
    transpose optimizer would move a ``Transpose`` of it through the blocked dequantization
    with a wrong scale layout.
    """
    scale, block = decode
    shape = value.shape
    static = shape is not None and all(isinstance(d, int) for d in shape)
    if trigger is None or not static or scale.shape is None:
        dq = node("DequantizeLinear", [value, scale], axis=-1, block_size=block)
        dq.outputs[0].dtype, dq.outputs[0].shape = to, shape
        return [dq]
    assert shape is not None
    empty = node("Shape", [trigger], start=0, end=0)
    nodes = [empty]

    def reshaped(x: ir.Value, dims: ir.Shape) -> ir.Value:
        constant = ir.Value(
            name=names.fresh(f"{hint}.dims"), const_value=ir.tensor(list(dims.numpy()), name="")
        )
        constant.const_value.name = constant.name  # type: ignore[union-attr]
        graph.register_initializer(constant)
        joined = node("Concat", [empty.outputs[0], constant], axis=0)
        out = node("Reshape", [x, joined.outputs[0]])
        nodes.extend([joined, out])
        return out.outputs[0]

    read_scale = reshaped(scale, scale.shape)
    dq = node("DequantizeLinear", [value, read_scale], axis=-1, block_size=block)
    dq.outputs[0].dtype, dq.outputs[0].shape = to, shape
    nodes.append(dq)
    result = reshaped(dq.outputs[0], shape)
    result.dtype, result.shape = to, shape
    return nodes

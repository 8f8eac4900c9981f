"""Quantized Linear layers rewritten into frozen float bases that LoRA adapts (docs/lora.md).

Each MatMulNBits or MatMulInteger layer :mod:`onnxblocks.peft.quantized` finds becomes a standard
``DequantizeLinear`` (opset 21) of its weight, kept as stored, and a float ``MatMul``: the packed
nibbles of MatMulNBits' ``B`` ``[N, blocks, block_size / 2]`` are the bytes of a ``uint4`` tensor
``[N, blocks * block_size]``, so they are read as that, not copied. The dequantization waits for the
layer's input (:func:`onnxblocks.ir.dequantize.delayed_dequantize`), so each float copy lives only
while its MatMul runs. MatMulInteger's run-time quantization of the activation is not kept: the
float activation meets the dequantized weight, the form gradients flow through.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.peft.quantized import MS_DOMAIN, Match, dims_of, quantized_matches, weight_scale
from onnxblocks.peft.targets import LinearSite

if TYPE_CHECKING:
    from onnxblocks.ir.writer import Writer

__all__ = [
    "QUANT_OPSET",
    "dequantize_linears",
    "needs_rewrite",
    "rewrite_quantized",
    "to_quant_opset",
]

#: The opset of ``DequantizeLinear`` with ``block_size`` and of ``uint4``.
QUANT_OPSET = 21


def dequantize_linears(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose MatMulNBits and MatMulInteger layers are standard-op
    ``DequantizeLinear`` + float ``MatMul`` (opset 21), the quantized weights kept as stored.

    A model without them comes back as it is.

    Raises:
        InvalidValueError: a layer's form is not supported (g_idx, a bias input, 2-bit, float16
            scales), or the model cannot be converted to opset 21 (naming the ops).
    """
    from onnxblocks.ir import serde

    if not needs_rewrite(model) and not any(
        n.op_type == "DequantizeLinear" for n in model.graph.node
    ):
        return model
    working = serde.from_proto(to_quant_opset(model))  # the IR edits never reach the caller's proto
    rewrite_quantized(working.graph)
    return serde.to_proto(working)


def needs_rewrite(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has MatMulNBits or MatMulInteger layers (cheap: op types only)."""
    from onnxblocks.ir.walk import proto_nodes

    return any(
        (n.op_type == "MatMulNBits" and n.domain == MS_DOMAIN)
        or (n.op_type == "MatMulInteger" and n.domain in ("", "ai.onnx"))
        for n in proto_nodes(model.graph)
    )


def to_quant_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` converted to opset 21 when it has layers to rewrite below it; else itself."""
    if not needs_rewrite(model) or (_limits.onnx_opset(model) or 0) >= QUANT_OPSET:
        return model
    from onnxblocks.ir.opset import convert_opset

    return convert_opset(model, QUANT_OPSET, "a model with quantized Linear layers")


def rewrite_quantized(graph: ir.Graph) -> dict[ir.Node, LinearSite]:
    """Rewrite, in place, the quantized Linear layers of ``graph`` (opset 21 already); return the
    LoRA site of each (its float MatMul), the QDQ form's included.
    """
    from onnxblocks.ir.edit import remove_unused_nodes
    from onnxblocks.ir.names import graph_names
    from onnxblocks.ir.writer import Writer

    matches, misses = quantized_matches(graph)
    if misses:
        raise InvalidValueError(
            f"quantized Linear layers of a form onnxblocks does not read: {preview(misses)}. "
            "Quantize with onnxruntime's MatMulNBitsQuantizer (4 or 8 bits, no g_idx) or "
            "quantize_dynamic, or train on the float file (onnx/model.onnx)."
        )
    names = graph_names(graph)
    sites: dict[ir.Node, LinearSite] = {}
    for match in matches:
        record = match.record
        w = Writer(names, QUANT_OPSET, f"{record.module}.dequantized")
        if record.kind == "MatMulNBits":
            node, layout = _rewrite_nbits(graph, w, match), "out_in"
        elif record.kind == "MatMulInteger":
            node, layout = _rewrite_integer(graph, w, match), "in_out"
        else:
            node, layout = _delay_qdq(graph, w, match), "in_out"
        sites[node] = LinearSite(
            record.module,
            node,
            graph.initializers[record.weight],
            layout,
            record.in_features,
            record.out_features,
            quantized=True,
        )
    if matches:  # the quantized ops, now dead, and the constants only they read
        read = {n: [v for v in n.inputs if v is not None] for n in graph}
        remove_unused_nodes(graph)
        kept = set(graph)
        orphans = {v for n, vs in read.items() if n not in kept for v in vs if not v.uses()}
        for value in orphans:
            if graph.initializers.get(value.name or "") is value and not value.is_graph_output():
                graph.initializers.pop(value.name or "")
    return sites


def _delayed(
    w: Writer,
    graph: ir.Graph,
    weight: ir.Value,
    trigger: ir.Value,
    decode: tuple[ir.Value, int],
    zero_point: ir.Value | None,
    axis: int = -1,
) -> ir.Value:
    from onnxblocks.ir.dequantize import delayed_dequantize

    def node(op: str, inputs: list[ir.Value], **attributes: int) -> ir.Node:
        w.ops(op, inputs, [w.fresh(op.lower())], "", **attributes)
        return w.nodes[-1]

    nodes = delayed_dequantize(
        graph,
        weight,
        ir.DataType.FLOAT,
        trigger,
        decode,
        node,
        w.names,
        w.hint,
        zero_point=zero_point,
        axis=axis,
    )
    assert nodes[-1] is w.nodes[-1]
    return nodes[-1].outputs[0]


def _retyped(graph: ir.Graph, value: ir.Value, dtype: ir.DataType, dims: list[int]) -> ir.Value:
    """The initializer ``value`` read as ``dtype`` of shape ``dims`` (the same bytes, not read)."""
    name = value.name or ""
    value = graph.initializers.get(name, value)  # a weight two layers share: retyped once
    if dtype == value.dtype and list(dims) == dims_of(value):
        return value
    tensor = value.const_value
    assert tensor is not None
    new: ir.TensorProtocol
    if isinstance(tensor, ir.ExternalTensor):
        new = ir.ExternalTensor(
            tensor.location,
            tensor.offset,
            tensor.length,
            dtype,
            shape=ir.Shape(dims),
            name=name,
            base_dir=tensor.base_dir,
        )
    else:
        raw = tensor.tobytes()
        proto = onnx.TensorProto(name=name, data_type=dtype.value, dims=dims, raw_data=raw)
        new = ir.serde.TensorProtoTensor(proto)
    graph.initializers.pop(name)
    out = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims), const_value=new)
    graph.register_initializer(out)
    return out


def _rewrite_nbits(graph: ir.Graph, w: Writer, match: Match) -> ir.Node:
    node, record = match.node, match.record
    n, k, bits, block = record.out_features, record.in_features, record.bits, record.block_size
    blocks = math.ceil(k / block)
    stored = ir.DataType.UINT4 if bits == 4 else ir.DataType.UINT8
    weight = _retyped(graph, match.weight, stored, [n, blocks * block])
    scales_in = node.inputs[2]
    assert scales_in is not None
    scales = _retyped(graph, scales_in, ir.DataType.FLOAT, [n, blocks])
    zp = _zero_points(
        graph, w, node.inputs[3] if len(node.inputs) > 3 else None, stored, n, blocks, bits
    )
    dq = _delayed(w, graph, weight, match.x, (scales, block), zp)
    if blocks * block != k:
        dq = w.slice(dq, [0], [k], [1])
    transposed = w.op("Transpose", [dq], perm=[1, 0])
    transposed.dtype, transposed.shape = ir.DataType.FLOAT, ir.Shape([k, n])
    return _replace(graph, w, match, transposed)


def _zero_points(
    graph: ir.Graph,
    w: Writer,
    zp: ir.Value | None,
    stored: ir.DataType,
    n: int,
    blocks: int,
    bits: int,
) -> ir.Value:
    """MatMulNBits' zero points as a ``[N, blocks]`` tensor of the weight's type (default
    ``2^(bits-1)``); the packed bytes themselves where each row fills whole bytes.
    """
    if zp is not None and (bits == 8 or blocks % 2 == 0):
        return _retyped(graph, zp, stored, [n, blocks])
    if zp is None:
        values = np.full((n, blocks), 1 << (bits - 1), dtype=np.uint8)
    else:  # 4-bit, an odd number of blocks: each row's last byte holds one nibble
        assert zp.const_value is not None
        raw = zp.const_value.numpy().reshape(n, -1)
        values = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    return w.named_const(w.fresh("zero_points"), values.astype(stored.numpy()))


def _rewrite_integer(graph: ir.Graph, w: Writer, match: Match) -> ir.Node:
    node = match.node
    cast = next(iter(node.outputs[0].uses())).node
    mul = next(iter(cast.outputs[0].uses())).node
    quant = node.inputs[0].producer()  # type: ignore[union-attr]
    assert quant is not None
    scale = weight_scale(graph, mul, cast.outputs[0], quant.outputs[1])
    assert scale is not None
    zp = node.inputs[3] if len(node.inputs) > 3 else None
    dq = _delayed(w, graph, match.weight, match.x, (scale, 0), zp)
    dq.shape = match.weight.shape
    match = Match(match.record, mul, match.x, match.weight)
    return _replace(graph, w, match, dq)


def _replace(graph: ir.Graph, w: Writer, match: Match, weight: ir.Value) -> ir.Node:
    """A float ``MatMul(x, weight)`` in place of the quantized layer's last node."""
    from onnxblocks.ir.edit import replace_node

    old = match.node
    y = w.op("MatMul", [match.x, weight])
    matmul = w.nodes[-1]
    matmul.name = w.names.fresh(f"{match.record.node or match.record.module}.float")
    matmul.metadata_props.update(match.node.metadata_props)
    replace_node(old, w.nodes, [y, *[None] * (len(old.outputs) - 1)])
    y.dtype = ir.DataType.FLOAT
    return matmul


def _delay_qdq(graph: ir.Graph, w: Writer, match: Match) -> ir.Node:
    """The QDQ form's ``DequantizeLinear`` of a constant, made to wait for the layer's input.

    Read at once, ONNX Runtime (1.19 and 1.32 alike, extended optimizations) fuses it with the
    MatMul into a MatMulNBits that quantizes the activation to int8 (accuracy level 4), 0.7% off
    the float forward on a tiny LLaMA; and every float copy would be made first.
    """
    node = match.node
    dq = node.inputs[1].producer() if node.inputs[1] is not None else None
    scale = dq.inputs[1] if dq is not None and dq.op_type == "DequantizeLinear" else None
    if dq is None or scale is None or not scale.is_initializer():
        return node  # already read through moves (a model this module rewrote)
    zp = dq.inputs[2] if len(dq.inputs) > 2 else None
    decode = (scale, int_attribute(dq, "block_size", 0))
    axis = int_attribute(dq, "axis", 1)
    value = _delayed(w, graph, match.weight, match.x, decode, zp, axis=axis)
    value.shape = dq.outputs[0].shape or match.weight.shape
    graph.insert_before(node, w.nodes)
    node.replace_input_with(1, value)
    return node

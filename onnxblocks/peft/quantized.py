"""Quantized Linear layers of hub files (docs/lora.md, "Quantized hub files"), found by module path.

ONNX Runtime's quantizers write a Linear layer in one of three forms, each found by the module
path its nodes carry (``/model/layers.0/self_attn/q_proj/MatMul_Q4`` is
``model.layers.0.self_attn.q_proj``):

* ``com.microsoft.MatMulNBits`` (``model_q4.onnx``): ``B`` ``[N, blocks, block_size * bits / 8]``
  packed, ``scales`` and ``zero_points`` per block of ``block_size`` inputs of each output row;
* ``DynamicQuantizeLinear`` + ``MatMulInteger`` + ``Cast`` + ``Mul`` by ``x_scale * w_scale``
  (``model_quantized.onnx``): an int8 or uint8 weight ``[K, N]`` with one scale per tensor or per
  output, and the activation quantized to uint8 at run time;
* ``DequantizeLinear`` + ``MatMul`` (the quantizers' QDQ format): already standard ops.

:func:`onnxblocks.peft.dequantize.dequantize_linears` rewrites the first two into the third:
the quantized weight keeps its bytes, a standard ``DequantizeLinear`` (opset 21) makes the float
weight when its reader is about to run, and a float ``MatMul`` applies it. Gradients then flow
through every layer to LoRA's adapters. The activation quantization of ``MatMulInteger`` is not
kept: training runs the float activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.peft.targets import node_module

__all__ = [
    "QuantizedLinear",
    "find_quantized_linears",
    "quantized_matches",
    "refuse_full_fine_tuning",
]

MS_DOMAIN = "com.microsoft"
_INTEGER = {ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT4, ir.DataType.UINT4}
_BITS = {ir.DataType.INT8: 8, ir.DataType.UINT8: 8, ir.DataType.INT4: 4, ir.DataType.UINT4: 4}
_MOVERS = ("Transpose", "Reshape", "Slice", "Identity")
#: Suffixes ONNX Runtime's quantizers add to a weight's name.
_WEIGHT_SUFFIXES = ("_DQ_Q4", "_DQ_Q8", "_Q4", "_Q8", "_quantized")


@dataclass(frozen=True)
class QuantizedLinear:
    """A Linear layer whose weight is stored quantized.

    Attributes:
        module: The torch module path (``model.layers.0.self_attn.q_proj``).
        kind: ``"MatMulNBits"``, ``"MatMulInteger"`` or ``"DequantizeLinear"`` (the form found).
        node: The node's name (MatMulNBits, MatMulInteger or the MatMul after the dequantization).
        weight: The quantized weight initializer's name.
        bits: 4 or 8.
        block_size: Inputs sharing one scale; 0 for one scale per tensor or per output.
        in_features: The layer's input width.
        out_features: The layer's output width.
    """

    module: str
    kind: str
    node: str
    weight: str
    bits: int
    block_size: int
    in_features: int
    out_features: int


@dataclass
class Match:
    """A quantized layer found: its record, its last node, input and weight."""

    record: QuantizedLinear
    node: ir.Node
    x: ir.Value
    weight: ir.Value


def _init(graph: ir.Graph, value: ir.Value | None) -> ir.Value | None:
    """``value`` if it is an initializer of ``graph`` (not fed), else None."""
    if (
        value is None
        or value.is_graph_input()
        or graph.initializers.get(value.name or "") is not value
    ):
        return None
    return value


def _module(node: ir.Node, weight: ir.Value) -> str | None:
    module = node_module(node)
    if module:
        return module
    name = weight.name or ""
    for suffix in _WEIGHT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.removesuffix(".weight") if name.endswith(".weight") else None


def dims_of(value: ir.Value) -> list[int] | None:
    shape = value.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]  # type: ignore[arg-type]


def _nbits(graph: ir.Graph, node: ir.Node) -> tuple[Match | None, str]:
    inputs = list(node.inputs) + [None] * (6 - len(node.inputs))
    x, b, scales, zp, g_idx, bias = inputs[:6]
    bits, block = int_attribute(node, "bits", 4), int_attribute(node, "block_size", 0)
    k, n = int_attribute(node, "K", 0), int_attribute(node, "N", 0)
    if x is None or _init(graph, b) is None or _init(graph, scales) is None:
        return None, f"MatMulNBits {node.name!r} does not read a constant weight and scales"
    if g_idx is not None or bias is not None:
        return None, f"MatMulNBits {node.name!r} has g_idx or bias inputs (not supported)"
    if bits not in (4, 8) or block <= 0 or k <= 0 or n <= 0:
        return None, f"MatMulNBits {node.name!r} has bits={bits}, block_size={block}"
    if zp is not None and (_init(graph, zp) is None or zp.dtype != ir.DataType.UINT8):
        return None, f"MatMulNBits {node.name!r} has zero points that are not constant uint8"
    assert b is not None and scales is not None
    if scales.dtype != ir.DataType.FLOAT:
        return None, f"MatMulNBits {node.name!r} has {scales.dtype} scales, not float32"
    module = _module(node, b)
    if module is None:
        return None, f"MatMulNBits {node.name!r} carries no module path"
    record = QuantizedLinear(
        module, "MatMulNBits", node.name or "", b.name or "", bits, block, k, n
    )
    return Match(record, node, x, b), ""


def _integer(graph: ir.Graph, node: ir.Node) -> tuple[Match | None, str]:
    """``MatMulInteger(DynamicQuantizeLinear(x), w) -> Cast -> Mul(., x_scale * w_scale)``."""
    quant = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    weight = _init(graph, node.inputs[1] if len(node.inputs) > 1 else None)
    if quant is None or quant.op_type != "DynamicQuantizeLinear" or weight is None:
        return None, f"MatMulInteger {node.name!r} does not read a quantized input and weight"
    dims = dims_of(weight)
    if dims is None or len(dims) != 2 or weight.dtype not in (ir.DataType.INT8, ir.DataType.UINT8):
        return None, f"MatMulInteger {node.name!r} has weight {weight.name!r} that is not 2-D int8"
    uses = list(node.outputs[0].uses())
    cast = uses[0].node if len(uses) == 1 else None
    if cast is None or cast.op_type != "Cast":
        return None, f"MatMulInteger {node.name!r} is not followed by a Cast"
    muls = list(cast.outputs[0].uses())
    mul = muls[0].node if len(muls) == 1 else None
    scale = weight_scale(graph, mul, cast.outputs[0], quant.outputs[1]) if mul else None
    if mul is None or scale is None:
        return None, f"MatMulInteger {node.name!r} is not scaled by its weight's scale"
    zp = node.inputs[3] if len(node.inputs) > 3 else None
    if zp is not None and _init(graph, zp) is None:
        return None, f"MatMulInteger {node.name!r} has a weight zero point that is not constant"
    module = _module(node, weight)
    if module is None:
        return None, f"MatMulInteger {node.name!r} carries no module path"
    k, n = dims
    record = QuantizedLinear(
        module, "MatMulInteger", node.name or "", weight.name or "", 8, 0, k, n
    )
    x = quant.inputs[0]
    assert x is not None
    return Match(record, node, x, weight), ""


def weight_scale(
    graph: ir.Graph, mul: ir.Node, cast_out: ir.Value, x_scale: ir.Value
) -> ir.Value | None:
    """The weight scale of the ``Mul(cast_out, x_scale * w_scale)`` after a MatMulInteger."""
    if mul.op_type != "Mul" or cast_out not in mul.inputs:
        return None
    other = next((v for v in mul.inputs if v is not cast_out), None)
    scales = other.producer() if other is not None else None
    if scales is None or scales.op_type != "Mul" or x_scale not in scales.inputs:
        return None
    return _init(graph, next((v for v in scales.inputs if v is not x_scale), None))


def _dequantized(graph: ir.Graph, node: ir.Node) -> tuple[Match | None, str]:
    """A MatMul whose weight is ``DequantizeLinear`` of a constant, through moves of it."""
    value, transposed = node.inputs[1] if len(node.inputs) > 1 else None, False
    producer = value.producer() if value is not None else None
    while producer is not None and producer.op_type in _MOVERS and producer.domain == "":
        if producer.op_type == "Transpose":
            transposed = not transposed
        producer = producer.inputs[0].producer() if producer.inputs[0] is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or producer.domain != "":
        return None, ""
    weight = _init(graph, producer.inputs[0])
    if weight is None or weight.dtype not in _INTEGER or node.inputs[0] is None:
        return None, ""
    assert value is not None
    dims = dims_of(value) or dims_of(weight)
    if dims is None or len(dims) != 2:
        return None, f"MatMul {node.name!r} reads a dequantized weight that is not 2-D"
    module = _module(node, weight)
    if module is None:
        return None, f"MatMul {node.name!r} carries no module path"
    k, n = dims
    block = int_attribute(producer, "block_size", 0)
    bits = _BITS[weight.dtype]
    record = QuantizedLinear(
        module, "DequantizeLinear", node.name or "", weight.name or "", bits, block, k, n
    )
    return Match(record, node, node.inputs[0], weight), ""


def quantized_matches(graph: ir.Graph) -> tuple[list[Match], list[str]]:
    """The quantized layers of ``graph`` (top level), and why each near miss is not one."""
    found, misses = [], []
    for node in graph:
        if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN:
            match, why = _nbits(graph, node)
        elif node.op_type == "MatMulInteger" and node.domain == "":
            match, why = _integer(graph, node)
        elif node.op_type == "MatMul" and node.domain == "":
            match, why = _dequantized(graph, node)
        else:
            continue
        if match is not None:
            found.append(match)
        elif why:
            misses.append(why)
    return found, misses


def find_quantized_linears(model: onnx.ModelProto) -> list[QuantizedLinear]:
    """The Linear layers of ``model`` stored quantized, in graph order (none for a float model).

    Example:
        >>> [q.module for q in find_quantized_linears(onnx.load("onnx/model_q4.onnx"))][:2]
        ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj']
    """
    from onnxblocks.ir import serde

    return [m.record for m in quantized_matches(serde.from_proto(model).graph)[0]]


def refuse_full_fine_tuning(model: onnx.ModelProto) -> None:
    """Raise when ``model`` has quantized Linear layers: their weights cannot train.

    Raises:
        InvalidValueError: naming the quantized layers and what to train instead.
    """
    found = find_quantized_linears(model)
    if found:
        layers = [f"{q.module} ({q.kind}, {q.bits}-bit)" for q in found]
        raise InvalidValueError(
            f"the model's Linear layers are quantized: {preview(layers, 3)}. A quantized weight "
            "cannot be fine-tuned: train LoRA adapters on it (lora=LoraConfig(...)), or fine-tune "
            "the float file of the same export (onnx/model.onnx beside onnx/model_q4.onnx and "
            "onnx/model_quantized.onnx)."
        )

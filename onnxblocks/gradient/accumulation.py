"""Gradient accumulation: the graph contract ONNX Runtime's training API ``Module`` expects.

For each trainable parameter ``p`` the training model has:

* an input ``p_grad.accumulation.buffer`` (same type and shape as ``p``): the
  buffer ``Module`` keeps the gradient in;
* an ``InPlaceAccumulatorV2`` node (com.microsoft) that adds ``p_grad`` into the
  buffer, or overwrites it when ``lazy_reset_grad`` is true;
* an output ``p_grad.accumulation.out`` (bool ``[1]``): the node's "updated" flag.

and one more input, ``lazy_reset_grad`` (bool ``[1]``), after every buffer.
``Module`` recognises buffers by their suffix and ``lazy_reset_grad`` by its name.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import LAZY_RESET_GRAD, accumulated_name, buffer_name, gradient_name
from onnxblocks._core.contrib_ops import IN_PLACE_ACCUMULATOR_V2
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.serde import from_proto, to_proto

__all__ = [
    "ACCUMULATOR_TYPES",
    "LAZY_RESET_GRAD",
    "accumulated_name",
    "add_gradient_accumulation",
    "buffer_name",
    "check_accumulable",
    "gradient_name",
]

#: Element types ONNX Runtime 1.19.2's CPU InPlaceAccumulatorV2 kernel accepts.
ACCUMULATOR_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16})


def check_accumulable(params: Sequence[tuple[str, int]]) -> None:
    """Raise when a trainable parameter's gradient cannot be accumulated by ONNX Runtime's training
    API.

    Args:
        params: ``(name, element type)`` of each trainable parameter.

    Raises:
        TypeError: naming the parameters of other element types (double, bfloat16).
    """
    bad = [(name, elem) for name, elem in params if elem not in ACCUMULATOR_TYPES]
    if not bad:
        return
    kinds = sorted({onnx.TensorProto.DataType.Name(elem).lower() for _, elem in bad})
    listed = ", ".join(f"'{name}'" for name, _ in bad[:5]) + (" ..." if len(bad) > 5 else "")
    raise InvalidTypeError(
        f"Trainable parameters {listed} are {' / '.join(kinds)}, but ONNX Runtime 1.19.2's "
        "training API "
        "accumulates gradients with InPlaceAccumulatorV2, whose CPU kernel takes float32 and "
        "float16 only (its "
        "training kernels are float32 too). Convert the model to float32 before exporting it "
        "(model.float() in torch), or freeze these parameters."
    )


def add_gradient_accumulation(
    model: ir.Model | onnx.ModelProto, params: Sequence[tuple[str, int, Sequence[int]]]
) -> None:
    """Accumulate the gradient of each parameter in a buffer, in place.

    The ``<param>_grad`` graph outputs are replaced by ``<param>_grad.accumulation.out``
    (other outputs keep their place), the buffer inputs are appended in the order of
    ``params``, then ``lazy_reset_grad``.

    Args:
        model: A training model whose outputs include ``<param>_grad`` for each parameter: the
            IR the gradient builder's model became, or a ModelProto (converted in and out).
        params: ``(name, element type, dims)`` of each trainable parameter, in input order.

    Raises:
        ValueError: if a parameter's gradient is not a graph output.
    """
    if isinstance(model, onnx.ModelProto):
        working = from_proto(model)
        add_gradient_accumulation(working, params)
        model.CopyFrom(to_proto(working))
        return
    graph = model.graph
    outputs = {o.name: i for i, o in enumerate(graph.outputs)}
    names = graph_names(graph)
    reset = _tensor_value(LAZY_RESET_GRAD, onnx.TensorProto.BOOL, [1])
    for name, elem_type, dims in params:
        grad = gradient_name(name)
        if grad not in outputs:
            raise InvalidValueError(
                f"The training model has no gradient output '{grad}' for trainable parameter "
                f"'{name}'."
            )
        buffer = _tensor_value(buffer_name(name), elem_type, dims)
        graph.inputs.append(buffer)
        gradient = graph.outputs[outputs[grad]]
        node = ir.Node(
            IN_PLACE_ACCUMULATOR_V2.domain,
            IN_PLACE_ACCUMULATOR_V2.op_type,
            [buffer, gradient, reset],
            outputs=[_tensor_value(accumulated_name(name), onnx.TensorProto.BOOL, [1])],
            name=names.fresh("GradientAccumulator"),
        )
        graph.append(node)
        graph.outputs[outputs[grad]] = node.outputs[0]
        # its declaration went with the output, as ONNX Runtime's training API has it
        gradient.type, gradient.shape = None, None
    graph.inputs.append(reset)
    model.opset_imports.setdefault(IN_PLACE_ACCUMULATOR_V2.domain, _limits.MS_OPSET)


def _tensor_value(name: str, elem_type: int, dims: Sequence[int]) -> ir.Value:
    return ir.Value(
        name=name, type=ir.TensorType(ir.DataType(elem_type)), shape=ir.Shape(list(dims))
    )

"""Reduction op blocks: ReduceMean, ReduceSum, ReduceAllL2."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from onnxblocks._core.errors import InvalidTypeError
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value

# Opset from which each reduction takes its axes as an input instead of an attribute.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18}


class _Reduce(Block):
    def __init__(
        self, op_type: str, keepdims: bool = True, axes: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        self._op_type = op_type
        self._keepdims = keepdims
        self._axes = list(axes) if axes is not None else None

    def build(self, input_name: str) -> Value:
        """Reduce ``input_name`` over ``axes`` (all axes when None)."""
        acc = self.accessor
        acc.require(input_name)
        version = acc.domain_version("") or 1
        if self._axes is None:
            return acc.op(self._op_type, [input_name], keepdims=int(self._keepdims))
        if version >= _AXES_AS_INPUT_SINCE[self._op_type]:
            axes = acc.constant(self._axes, dtype=onnx.TensorProto.INT64, name_hint="axes")
            return acc.op(self._op_type, [input_name, axes], keepdims=int(self._keepdims))
        return acc.op(self._op_type, [input_name], keepdims=int(self._keepdims), axes=self._axes)


class ReduceMean(_Reduce):
    """Mean over ``axes`` (default: all)."""

    def __init__(self, keepdims: bool = True, axes: Sequence[int] | None = None) -> None:
        super().__init__("ReduceMean", keepdims, axes)


class ReduceSum(_Reduce):
    """Sum over ``axes`` (default: all)."""

    def __init__(self, keepdims: bool = True, axes: Sequence[int] | None = None) -> None:
        super().__init__("ReduceSum", keepdims, axes)


class ReduceAllL2(Block):
    """The L2 norm of all elements of all inputs together (com.microsoft ``ReduceAllL2``)."""

    def build(self, *reduce_node_input_names: str) -> Value:
        """Return ``sqrt(sum(x**2 for every x in every input))`` as a scalar."""
        acc = self.accessor
        if not reduce_node_input_names:
            raise InvalidTypeError("ReduceAllL2 needs at least one input.")
        elem = acc.elem_type(reduce_node_input_names[0]) or onnx.TensorProto.FLOAT
        return acc.op(
            "ReduceAllL2",
            list(reduce_node_input_names),
            domain="com.microsoft",
            output_types=[onnx.helper.make_tensor_type_proto(elem, [])],
        )

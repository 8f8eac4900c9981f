"""Element-wise op blocks: Add, Sub, Mul, Div, Pow, Sigmoid, Log, Neg, Abs, Exp, Sqrt, Clip,
Cast.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value


def _float_dtype(acc: Any, name: str) -> Any:
    """The numpy dtype of a value (for constants that must match it); float32 if unknown."""
    elem = acc.elem_type(name)
    if not elem:
        return np.float32
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(elem)


class Op(Block):
    """Any single ONNX op as a block: ``Op("Softmax", axis=-1)(x)``.

    Args:
        op_type: The operator type.
        domain: Its domain ("" for ai.onnx).
        num_outputs: How many outputs the node has.
        **attributes: Node attributes.
    """

    def __init__(
        self, op_type: str, domain: str = "", num_outputs: int = 1, **attributes: Any
    ) -> None:
        super().__init__()
        self._op_type = op_type
        self._domain = domain
        self._num_outputs = num_outputs
        self._attributes = attributes

    def build(self, *input_names: str | None) -> Any:
        """Add the node on ``input_names`` and return its output(s)."""
        return self.accessor.op(
            self._op_type,
            list(input_names),
            domain=self._domain,
            outputs=self._num_outputs,
            **self._attributes,
        )


class _Binary(Op):
    def __init__(self, op_type: str) -> None:
        super().__init__(op_type)

    def build(self, input_name1: str, input_name2: str) -> Value:  # type: ignore[override]  # Op.build(*names) fixed to two inputs
        """Add ``op(input_name1, input_name2)`` with numpy-style broadcasting."""
        return self.accessor.op(self._op_type, [input_name1, input_name2])


class Add(_Binary):
    """``a + b``."""

    def __init__(self) -> None:
        super().__init__("Add")


class Sub(_Binary):
    """``a - b``."""

    def __init__(self) -> None:
        super().__init__("Sub")


class Mul(_Binary):
    """``a * b``."""

    def __init__(self) -> None:
        super().__init__("Mul")


class Div(_Binary):
    """``a / b``."""

    def __init__(self) -> None:
        super().__init__("Div")


class _Unary(Op):
    def build(self, input_name: str) -> Value:  # type: ignore[override]  # Op.build(*names) fixed to one input
        """Apply the op to ``input_name``."""
        return self.accessor.op(self._op_type, [input_name], **self._attributes)


class Sigmoid(_Unary):
    """``1 / (1 + exp(-x))``."""

    def __init__(self) -> None:
        super().__init__("Sigmoid")


class Log(_Unary):
    """Natural logarithm."""

    def __init__(self) -> None:
        super().__init__("Log")


class Neg(_Unary):
    """``-x``."""

    def __init__(self) -> None:
        super().__init__("Neg")


class Abs(_Unary):
    """``|x|``."""

    def __init__(self) -> None:
        super().__init__("Abs")


class Exp(_Unary):
    """``e ** x``."""

    def __init__(self) -> None:
        super().__init__("Exp")


class Sqrt(_Unary):
    """Square root."""

    def __init__(self) -> None:
        super().__init__("Sqrt")


class Pow(Block):
    """``x ** exponent`` for a constant exponent (of the input's dtype)."""

    def __init__(self, exponent: float) -> None:
        super().__init__()
        self._exponent = exponent

    def build(self, pow_input_name: str) -> Value:
        """Raise ``pow_input_name`` to the exponent."""
        acc = self.accessor
        acc.require(pow_input_name)
        exponent = acc.constant(
            self._exponent, dtype=_float_dtype(acc, pow_input_name), name_hint="pow_exponent"
        )
        return acc.op("Pow", [pow_input_name, exponent])


class Clip(Block):
    """Clamp to ``[clip_min, clip_max]``; either bound may be None."""

    def __init__(self, clip_min: float | None = None, clip_max: float | None = None) -> None:
        super().__init__()
        self._min = clip_min
        self._max = clip_max

    def build(self, clip_input_name: str) -> Value:
        """Clip ``clip_input_name``."""
        acc = self.accessor
        acc.require(clip_input_name)
        dtype = _float_dtype(acc, clip_input_name)
        lo = (
            acc.constant(self._min, dtype=dtype, name_hint="clip_min")
            if self._min is not None
            else None
        )
        hi = (
            acc.constant(self._max, dtype=dtype, name_hint="clip_max")
            if self._max is not None
            else None
        )
        return acc.op("Clip", [clip_input_name, lo, hi])


class Cast(Block):
    """Cast to the ONNX element type ``to`` (e.g. ``onnx.TensorProto.FLOAT``)."""

    def __init__(self, to: int) -> None:
        super().__init__()
        self._to = int(to)

    def build(self, cast_input_name: str) -> Value:
        """Cast ``cast_input_name``."""
        return self.accessor.op("Cast", [cast_input_name], to=self._to)

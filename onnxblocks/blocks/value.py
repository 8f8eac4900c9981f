"""Value: the name of a value in the model being built, usable as a plain string.

Blocks return :class:`Value` objects. A Value *is* a ``str`` (so code that passes
names around keeps working) and also supports arithmetic that adds nodes to the
active build, so losses read like the maths::

    loss = 0.4 * mse(a, "t1") + 0.6 * mse(b, "t2")

Rules: an operator between a Value and a number, a numpy array, another Value
or a plain name adds a node. The one exception is ``Value + "text"``, which stays
string concatenation so names can still be built from names; wrap a plain name
with :func:`value` to add it in the graph.

Operands of different element types are promoted as torch promotes them
(:mod:`onnxblocks.blocks.promotion`): ``int64_labels * 0.5`` is float32, a
constant beside a float Value takes the Value's type, and ``/`` is true
division. numpy scalars and arrays work on either side (``np.float32(0.5) * v``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxblocks._core.context import current
from onnxblocks.blocks import promotion


class Value(str):
    """The name of a value in the graph being built, with graph arithmetic."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Value({str.__repr__(self)})"

    #: numpy defers to Value's reflected operators (``np.float32(0.5) * v`` calls ``v.__rmul__``).
    __array_ufunc__ = None

    # -- helpers -------------------------------------------------------------
    def _binary(self, op_type: str, other: Any, reverse: bool = False) -> Any:
        acc = current()
        own_type = acc.elem_type(self)
        array = None
        operand: Value | None = None
        if isinstance(other, str):  # a Value or a plain name (only + means concatenation, handled by the caller)
            operand = Value(other)
            other_type = acc.elem_type(operand)
            target = promotion.promote_types(own_type, other_type) if own_type and other_type else None
        else:
            array = promotion.as_constant_array(other)
            if array is None:
                return NotImplemented
            target = promotion.constant_type(own_type, array)
            other_type = target
        if op_type == "Div" and target is not None and promotion.kind_of_type(target) != promotion.FLOATING:
            target = promotion.DEFAULT_TYPE[promotion.FLOATING]  # true division, as Python and torch
        left = _cast(self, own_type, target)
        if array is not None:
            if target is None:  # unknown own type: integer arrays keep int64, other numbers are float32
                dtype: Any = np.int64 if promotion.kind_of_array(array) == promotion.INTEGER else np.float32
                array = array.astype(dtype)
            else:
                array = promotion.cast_constant(array, target, self)
            right: str = acc.constant(array, dtype=array.dtype, name_hint="scalar")
        else:
            assert operand is not None
            right = _cast(operand, other_type, target)
        inputs = [right, left] if reverse else [left, right]
        return acc.op(op_type, inputs)

    def _unary(self, op_type: str) -> Value:
        out = current().op(op_type, [self])
        assert isinstance(out, Value)
        return out

    # -- arithmetic ----------------------------------------------------------
    def __add__(self, other: Any) -> Any:
        if isinstance(other, str) and not isinstance(other, Value):
            return str(self) + other
        return self._binary("Add", other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str) and not isinstance(other, Value):
            return other + str(self)
        return self._binary("Add", other, reverse=True)

    def __sub__(self, other: Any) -> Any:
        return self._binary("Sub", other)

    def __rsub__(self, other: Any) -> Any:
        return self._binary("Sub", other, reverse=True)

    def __mul__(self, other: Any) -> Any:
        return self._binary("Mul", other)

    def __rmul__(self, other: Any) -> Any:
        return self._binary("Mul", other, reverse=True)

    def __truediv__(self, other: Any) -> Any:
        return self._binary("Div", other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._binary("Div", other, reverse=True)

    def __pow__(self, other: Any) -> Any:
        return self._binary("Pow", other)

    def __rpow__(self, other: Any) -> Any:
        return self._binary("Pow", other, reverse=True)

    def __matmul__(self, other: Any) -> Any:
        return self._binary("MatMul", other)

    def __rmatmul__(self, other: Any) -> Any:
        return self._binary("MatMul", other, reverse=True)

    def __neg__(self) -> Value:
        return self._unary("Neg")

    def __abs__(self) -> Value:
        return self._unary("Abs")

    # str defines __mod__ for %-formatting; keep it. Hashing and == stay str's.
    __hash__ = str.__hash__


def _cast(name: str, elem_type: int | None, target: int | None) -> str:
    """``name`` cast to ``target`` (a Cast node), or ``name`` itself when no cast is needed."""
    if target is None or elem_type is None or elem_type == target:
        return name
    out: str = current().op("Cast", [name], to=target)
    return out


def value(name: str) -> Value:
    """Wrap a plain name so it takes part in graph arithmetic (``value("target") * 2``)."""
    return name if isinstance(name, Value) else Value(name)


def as_values(out: Any) -> Any:
    """Turn what a block's ``build`` returned into Values (str -> Value, tuples kept)."""
    if isinstance(out, Value) or out is None:
        return out
    if isinstance(out, str):
        return Value(out)
    if isinstance(out, tuple):
        return tuple(as_values(o) for o in out)
    if isinstance(out, list):
        return [as_values(o) for o in out]
    return out

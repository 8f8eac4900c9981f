"""Value: the name of a value in the model being built, usable as a plain string.

Blocks return :class:`Value` objects. A Value *is* a ``str`` (so code that passes
names around keeps working) and also supports arithmetic that adds nodes to the
active build, so losses read like the maths::

    loss = 0.4 * mse(a, "t1") + 0.6 * mse(b, "t2")

Rules: an operator between a Value and a number, a numpy array or another Value
adds a node. Every operator between a Value and a plain ``str`` raises a
:class:`~onnxblocks.errors.ValueOperandError` (a ``TypeError``), in both operand
orders: ``v + "target"`` could mean a graph ``Add`` or a name, so neither is
guessed. Write ``value("target")`` (``ob.value``) for the graph value of that
name, or ``str(v) + "_suffix"`` to build a name.

Operands of different element types are promoted as torch promotes them
(:mod:`onnxblocks.blocks.promotion`): ``int64_labels * 0.5`` is float32, a
constant beside a float Value takes the Value's type, and ``/`` is true
division. numpy scalars and arrays work on either side (``np.float32(0.5) * v``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxblocks._core.active_build import current
from onnxblocks._core.errors import ValueOperandError
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
        if isinstance(other, str) and not isinstance(other, Value):
            raise _plain_string(self, op_type, other, reverse)
        if isinstance(other, Value):
            operand = other
            other_type = acc.elem_type(operand)
            target = (
                promotion.promote_types(own_type, other_type) if own_type and other_type else None
            )
        else:
            array = promotion.as_constant_array(other)
            if array is None:
                return NotImplemented
            target = promotion.constant_type(own_type, array)
            other_type = target
        if (
            op_type == "Div"
            and target is not None
            and promotion.kind_of_type(target) != promotion.FLOATING
        ):
            target = promotion.DEFAULT_TYPE[
                promotion.FLOATING
            ]  # true division, as Python and torch
        left = _cast(self, own_type, target)
        if array is not None:
            if (
                target is None
            ):  # unknown own type: integer arrays keep int64, other numbers are float32
                dtype: Any = (
                    np.int64 if promotion.kind_of_array(array) == promotion.INTEGER else np.float32
                )
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
        return self._binary("Add", other)

    def __radd__(self, other: Any) -> Any:
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


_SYMBOLS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Pow": "**", "MatMul": "@"}


def _plain_string(v: Value, op_type: str, other: str, reverse: bool) -> ValueOperandError:
    symbol = _SYMBOLS[op_type]
    written = f"{other!r} {symbol} {v!r}" if reverse else f"{v!r} {symbol} {other!r}"
    fixed = f"ob.value({other!r}) {symbol} v" if reverse else f"v {symbol} ob.value({other!r})"
    as_name = f"{other!r} + str(v)" if reverse else f"str(v) + {other!r}"
    return ValueOperandError(
        f"{written}: a Value and a plain str do not combine. For the graph value named {other!r} "
        "write "
        f"{fixed}; to build a name write {as_name}."
    )


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

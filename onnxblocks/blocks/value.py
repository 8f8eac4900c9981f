"""Value: the name of a value in the model being built, usable as a plain string.

Blocks return :class:`Value` objects. A Value *is* a ``str`` (so code that passes
names around keeps working) and also supports arithmetic that adds nodes to the
active build, so losses read like the maths::

    loss = 0.4 * mse(a, "t1") + 0.6 * mse(b, "t2")

Rules: an operator between a Value and a number, a numpy array, another Value
or a plain name adds a node. The one exception is ``Value + "text"``, which stays
string concatenation so names can still be built from names; wrap a plain name
with :func:`value` to add it in the graph.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from onnxblocks._core.context import current


class Value(str):
    """The name of a value in the graph being built, with graph arithmetic."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Value({str.__repr__(self)})"

    # -- helpers -------------------------------------------------------------
    def _operand(self, other: Any) -> str | None:
        if isinstance(other, Value):
            return other
        if isinstance(other, str):  # a plain name: only + means concatenation, handled by the caller
            return Value(other)
        if isinstance(other, (numbers.Number, np.ndarray, np.generic, list, tuple)):
            acc = current()
            dtype = acc.elem_type(self)
            return acc.constant(other, dtype=dtype if dtype else np.float32, name_hint="scalar")
        return None

    def _binary(self, op_type: str, other: Any, reverse: bool = False) -> Any:
        operand = self._operand(other)
        if operand is None:
            return NotImplemented
        inputs = [operand, self] if reverse else [self, operand]
        return current().op(op_type, inputs)

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

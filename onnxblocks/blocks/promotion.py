"""Type promotion for :class:`~onnxblocks.blocks.value.Value` arithmetic, as torch does it.

ONNX's arithmetic ops take operands of one element type, so ``labels * 0.5`` on
int64 labels needs a rule. onnxblocks follows torch, whose rules a user of a
training library expects, with the graph's types in charge:

* Kinds are ordered ``bool < integer < floating point``.
* A constant (a Python number, a numpy scalar or array, a list) of the Value's
  kind or a lower one takes the Value's element type: ``x * 2`` stays float16 on
  a float16 ``x``, ``counts + 1`` stays int32 on int32 counts. An integer constant
  that does not fit the Value's integer type is refused (``ValueError``).
* A constant of a higher kind promotes both to that kind's default type, as
  torch's default dtype: ``int64_labels * 0.5`` is float32 (not int64 0), and
  ``mask + 1`` on a bool mask is int64.
* Between two Values, the higher kind wins; within a kind, the wider type
  (``float16 + float32`` is float32, ``int32 + int64`` is int64, ``float16 +
  bfloat16`` is float32).
* ``/`` is true division: two integer (or bool) operands are divided as
  float32, as in Python and torch. Use ``onnxblocks.blocks.Div`` for ONNX's
  integer division.

A Value whose element type is unknown is not promoted (a constant beside it is
float32 unless it is an integer array).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

BOOL, INTEGER, FLOATING = 0, 1, 2

_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE}
_INTEGERS = {
    TensorProto.INT8,
    TensorProto.INT16,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.UINT8,
    TensorProto.UINT16,
    TensorProto.UINT32,
    TensorProto.UINT64,
}
#: The type a kind promotes to when a constant of that kind meets a Value of a lower kind (torch's
#: defaults).
DEFAULT_TYPE = {INTEGER: TensorProto.INT64, FLOATING: TensorProto.FLOAT}


def kind_of_type(elem_type: int) -> int | None:
    """The kind (:data:`BOOL`, :data:`INTEGER`, :data:`FLOATING`) of an ONNX element type, None
    for others.
    """
    if elem_type == TensorProto.BOOL:
        return BOOL
    if elem_type in _INTEGERS:
        return INTEGER
    if elem_type in _FLOATS:
        return FLOATING
    return None


def kind_of_array(array: np.ndarray) -> int | None:
    """The kind of a numpy array's dtype, None for strings, objects, complex numbers."""
    if array.dtype == np.bool_:
        return BOOL
    if np.issubdtype(array.dtype, np.integer):
        return INTEGER
    if np.issubdtype(array.dtype, np.floating):
        return FLOATING
    return None


def promote_types(a: int, b: int) -> int:
    """The element type two Values of types ``a`` and ``b`` are combined in."""
    if a == b:
        return a
    kind_a, kind_b = kind_of_type(a), kind_of_type(b)
    if kind_a is None or kind_b is None:
        return a  # strings and the like: no promotion, the op's own check reports the mismatch
    if kind_a != kind_b:
        return a if kind_a > kind_b else b
    if TensorProto.BFLOAT16 in (
        a,
        b,
    ):  # numpy has no bfloat16; torch: bfloat16 with float16 is float32
        other = b if a == TensorProto.BFLOAT16 else a
        return TensorProto.FLOAT if other == TensorProto.FLOAT16 else other
    dtype = np.promote_types(helper.tensor_dtype_to_np_dtype(a), helper.tensor_dtype_to_np_dtype(b))
    if dtype == np.float64 and kind_a == INTEGER:  # uint64 with a signed type: numpy gives float64
        return TensorProto.INT64
    return int(helper.np_dtype_to_tensor_dtype(dtype))


def constant_type(value_type: int | None, array: np.ndarray) -> int | None:
    """The element type a Value of ``value_type`` and a constant ``array`` are combined in.

    None when the Value's type is unknown (the caller keeps the constant's own type).
    """
    if value_type is None:
        return None
    value_kind, constant_kind = kind_of_type(value_type), kind_of_array(array)
    if value_kind is None or constant_kind is None or constant_kind <= value_kind:
        return value_type
    return DEFAULT_TYPE[constant_kind]


def as_constant_array(other: Any) -> np.ndarray | None:
    """A Python number, numpy scalar or array, list or tuple as a numpy array; None for anything
    else.

    Raises:
        TypeError: for a list or tuple that does not form a numeric array.
    """
    if isinstance(other, (bool, int, float, np.generic, np.ndarray)):
        array = np.asarray(other)
    elif isinstance(other, (list, tuple)):
        try:
            array = np.asarray(other)
        except ValueError:
            raise InvalidTypeError(
                f"Cannot use {type(other).__name__} {other!r} as a constant: it is not a "
                "rectangular array of "
                "numbers. Pass a numpy array."
            ) from None
    else:
        return None
    if kind_of_array(array) is None:
        return None
    return array


def cast_constant(array: np.ndarray, elem_type: int, value: str) -> np.ndarray:
    """``array`` in ``elem_type``'s numpy dtype.

    Raises:
        ValueError: if an integer constant does not fit ``elem_type`` (it would wrap around).
    """
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    if kind_of_array(array) == INTEGER and np.issubdtype(dtype, np.integer) and array.size:
        info = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise InvalidValueError(
                f"The constant {array.tolist() if array.size <= 8 else f'[{low} ... {high}]'} "
                "does not fit "
                f"{dtype} Value '{value}' (range [{info.min}, {info.max}]). Cast the Value to a "
                "wider type first: "
                "onnxblocks.blocks.Cast(onnx.TensorProto.INT64)."
            )
    return array.astype(dtype)

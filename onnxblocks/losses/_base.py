"""What every loss shares: option checks, input checks, target inputs and reductions.

A loss is a :class:`~onnxblocks.blocks.Block` whose ``build`` takes the name of a
model output (the *input* of the loss) and the name of what it is compared with
(the *target*, or the *labels* of a classification loss). When the target name is
not yet a value of the model, the loss creates a graph input of that name; when
it is (an existing graph input, or any other value), the loss uses it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value

#: The reductions every loss accepts.
REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")

#: Element types a loss input may have.
FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
)

#: Element types of class-index labels.
INDEX_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})

Shape = list[int | str | None]

# Opset from which an op takes ``axes`` as an input instead of an attribute.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "ReduceLogSumExp": 18}


def dtype_name(elem_type: int | None) -> str:
    """The ONNX name of an element type in lower case (``float``, ``int64`` ...)."""
    if not elem_type:
        return "unknown"
    return TensorProto.DataType.Name(elem_type).lower()


def check_reduction(owner: str, reduction: str, valid: Sequence[str] = REDUCTIONS) -> str:
    """Return ``reduction`` if it is one of ``valid``.

    Raises:
        ValueError: naming the reduction and listing the valid ones.
    """
    if reduction not in valid:
        raise InvalidValueError(
            f"{owner}: unknown reduction {reduction!r}. Use one of "
            + ", ".join(repr(r) for r in valid)
            + "."
        )
    return reduction


def check_ignore_index(where: str, ignore_index: int, elem: int, labels: str | None = None) -> None:
    """Check that ``ignore_index`` is a value of the labels' integer type (int32 cannot hold 2**40).

    Raises:
        ValueError: naming ignore_index, its value, the labels' dtype and its range.
    """
    info = np.iinfo(helper.tensor_dtype_to_np_dtype(elem))
    if int(info.min) <= ignore_index <= int(info.max):
        return
    whose = (
        f"labels '{labels}' of dtype {dtype_name(elem)}" if labels else f"{dtype_name(elem)} labels"
    )
    cast = (
        ""
        if elem == TensorProto.INT64
        else ", or cast the labels: onnxblocks.blocks.Cast(onnx.TensorProto.INT64)"
    )
    raise InvalidValueError(
        f"{where}ignore_index={ignore_index} does not fit {whose} (range [{info.min}, "
        f"{info.max}]). Use a label "
        f"value they can hold (e.g. -100, torch's){cast}."
    )


def as_float_array(owner: str, param: str, values: Any) -> np.ndarray | None:
    """Turn weights given as a list or numpy array into a float64 array (None stays None).

    Raises:
        ValueError: if the values are not numbers.
    """
    if values is None:
        return None
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidValueError(
            f"{owner}: {param} must be a list or numpy array of numbers, not "
            f"{type(values).__name__}."
        ) from None
    return array


def format_shape(shape: Shape | None) -> str:
    """``[N, 5, ?]`` for a shape with symbolic and unknown dims; ``unknown`` when the rank is
    unknown.
    """
    if shape is None:
        return "unknown"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class Loss(Block):
    """Base class of the losses: holds the reduction and offers shared checks and helpers.

    Args:
        reduction: How the per-element losses are combined: ``"mean"``, ``"sum"``
            (both give a scalar) or ``"none"`` (the per-element losses).
        reductions: The reductions this loss accepts.

    Raises:
        ValueError: if ``reduction`` is not one of ``reductions``.
    """

    def __init__(self, reduction: str = "mean", reductions: Sequence[str] = REDUCTIONS) -> None:
        super().__init__()
        self._reduction = check_reduction(type(self).__name__, reduction, reductions)

    @property
    def reduction(self) -> str:
        """The reduction this loss applies."""
        return self._reduction

    # ------------------------------------------------------------- checks
    def _require_float(self, name: str, role: str = "input") -> int | None:
        """Check that ``name`` exists and holds floating-point values; return its element type.

        Raises:
            UnknownNameError: if ``name`` is not a value of the model.
            TypeError: if its element type is known and not a floating-point type.
        """
        acc = self.accessor
        acc.require(name, role=role)
        elem = acc.elem_type(name)
        if elem is not None and elem not in FLOAT_TYPES:
            raise InvalidTypeError(
                f"{acc.where()}{role} '{name}' has dtype {dtype_name(elem)}, but "
                f"{type(self).__name__} needs "
                "floating-point values (float, double, float16 or bfloat16). Pass a float output "
                "of the model, "
                f"or cast it first: onnxblocks.blocks.Cast(onnx.TensorProto.FLOAT)('{name}')."
            )
        return elem

    def _target_like(self, input_name: str, target_name: str) -> Value:
        """The target compared with ``input_name``: an existing value, or a new graph input like the
        input.

        A new input has the input's element type and shape (symbolic dims are kept).

        Raises:
            TypeError: if an existing target's element type differs from the input's.
            ValueError: if a new target is needed but the input's dtype or rank is unknown.
        """
        acc = self.accessor
        elem = self._require_float(input_name)
        if acc.has_value(target_name):
            target_elem = acc.elem_type(target_name)
            if elem is not None and target_elem is not None and target_elem != elem:
                raise InvalidTypeError(
                    f"{acc.where()}target '{target_name}' has dtype {dtype_name(target_elem)} "
                    "but input "
                    f"'{input_name}' has dtype {dtype_name(elem)}; they must match. Cast the "
                    "target first: "
                    f"onnxblocks.blocks.Cast({elem})('{target_name}'), or pass another target "
                    "name to create "
                    "a new graph input."
                )
            return Value(target_name)
        shape = acc.shape_of(input_name)
        if elem is None or shape is None:
            raise InvalidValueError(
                f"{acc.where()}cannot create the target input '{target_name}': the dtype or rank "
                "of input "
                f"'{input_name}' is unknown. Add the target yourself, e.g. "
                f"accessor.add_input('{target_name}', "
                "onnx.TensorProto.FLOAT, [...]), and pass its name."
            )
        return acc.add_input(target_name, elem, shape)

    def _check_broadcast(self, param: str, array: np.ndarray, input_name: str) -> None:
        """Check that an elementwise weight broadcasts against the input without growing it (as
        torch's).

        Dims of the input that are not numbers (symbolic, unknown) accept any size.

        Raises:
            ValueError: naming ``param``, its shape and the input's size on the dim that does not
            fit.
        """
        acc = self.accessor
        shape = acc.shape_of(input_name)
        if shape is None:
            return
        owner = f"{acc.where() or type(self).__name__ + ': '}"
        if array.ndim > len(shape):
            raise InvalidValueError(
                f"{owner}{param} has shape {list(array.shape)}, more dims than input "
                f"'{input_name}' of shape "
                f"{format_shape(shape)}: it would broadcast the loss beyond the input. Give "
                f"{param} at most "
                f"{len(shape)} dims (usually one value per class, the input's last dim)."
            )
        for offset in range(1, array.ndim + 1):
            size, dim = array.shape[-offset], shape[-offset]
            if size != 1 and isinstance(dim, int) and size != dim:
                what = f"{size} values" if array.ndim == 1 else f"shape {list(array.shape)}"
                if offset == 1:
                    has, fix = f"{dim} classes (its last axis)", f"one value per class ({dim})"
                else:
                    has, fix = (
                        f"{dim} on axis {len(shape) - offset}",
                        f"{dim} or 1 values on that axis",
                    )
                raise InvalidValueError(
                    f"{owner}{param} has {what} but input '{input_name}' of shape "
                    f"{format_shape(shape)} has "
                    f"{has}. Give {param} {fix}, or a single value to broadcast."
                )

    # ------------------------------------------------------------- helpers
    def _const(self, value: Any, like: str, name_hint: str = "loss_const") -> Value:
        """A constant with the element type of ``like`` (float32 when unknown)."""
        acc = self.accessor
        elem = acc.elem_type(like) or TensorProto.FLOAT
        return acc.constant(value, dtype=helper.tensor_dtype_to_np_dtype(elem), name_hint=name_hint)

    def _reduce(self, per_element: str, name_hint: str, reduction: str | None = None) -> Value:
        """Apply the reduction to the per-element losses (``none`` returns them as they are)."""
        reduction = reduction or self._reduction
        if reduction == "none":
            return Value(per_element)
        acc = self.accessor
        if reduction == "mean" and acc.elem_type(per_element) == TensorProto.DOUBLE:
            # ONNX Runtime differentiates ReduceMean with its Scale op, whose factor 1/N is a
            # float32 in every
            # dtype: a double mean's gradient would be off by float32's rounding of 1/N. Div's is
            # double.
            total = reduce_all(acc, "ReduceSum", per_element)
            out = acc.op(
                "Div",
                [total, element_count(acc, per_element)],
                outputs=[acc.names.fresh(name_hint)],
            )
            assert isinstance(out, Value)
            return out
        op_type = "ReduceMean" if reduction == "mean" else "ReduceSum"
        return reduce_all(acc, op_type, per_element, acc.names.fresh(name_hint))


class PointwiseLoss(Loss):
    """Base class of the losses that compare an input with a target of the same shape, element by
    element.

    Subclasses set ``output_hint`` and implement :meth:`_per_element`.
    """

    output_hint = "loss"

    def build(self, loss_input_name: str, target_name: str = "target") -> Value:
        """Add the loss on ``loss_input_name`` and return its output.

        Args:
            loss_input_name: The model output (floating point) to compare with the target.
            target_name: The target. If the model has no value of that name, a graph
                input with the dtype and shape of ``loss_input_name`` is created.

        Raises:
            TypeError: if the input is not floating point, or the target's dtype differs.
        """
        target = self._target_like(loss_input_name, target_name)
        return self._reduce(self._per_element(Value(loss_input_name), target), self.output_hint)

    def _per_element(self, x: Value, target: Value) -> Value:
        """The unreduced loss of each element."""
        raise NotImplementedError


def reduce_all(acc: ModelAccessor, op_type: str, x: str, name: str | None = None) -> Value:
    """``op_type`` (ReduceSum, ReduceMean) over every axis: a scalar, typed as one even when x's
    rank is unknown.
    """
    elem = acc.elem_type(x)
    out = acc.op(
        op_type,
        [x],
        keepdims=0,
        outputs=[name] if name else 1,
        output_types=[helper.make_tensor_type_proto(elem, [])] if elem else None,
    )
    assert isinstance(out, Value)
    return out


def axes_op(
    acc: ModelAccessor, op_type: str, x: str, axes: Sequence[int], **attributes: Any
) -> Value:
    """Add ``op_type`` (ReduceSum, ReduceLogSumExp, Squeeze, Unsqueeze) over ``axes`` (input or
    attribute by opset).
    """
    version = acc.domain_version("") or 1
    if version >= _AXES_AS_INPUT_SINCE[op_type]:
        axes_value = acc.constant(list(axes), dtype=np.int64, name_hint="axes")
        out = acc.op(op_type, [x, axes_value], **attributes)
    else:
        out = acc.op(op_type, [x], axes=list(axes), **attributes)
    assert isinstance(out, Value)
    return out


def static_dim(acc: ModelAccessor, x: str, axis: int) -> int | None:
    """The size of ``x`` along ``axis`` when it is a known number, else None."""
    shape = acc.shape_of(x)
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) else None


def element_count(acc: ModelAccessor, x: str) -> Value:
    """The number of elements of ``x`` as a scalar of its element type (a constant when the shape
    is static).
    """
    elem = acc.elem_type(x) or TensorProto.FLOAT
    shape = acc.shape_of(x)
    dims = [d for d in shape or [] if isinstance(d, int)]
    if shape is not None and len(dims) == len(shape):
        count = int(np.prod(dims, dtype=np.int64))
        return acc.constant(count, dtype=helper.tensor_dtype_to_np_dtype(elem), name_hint="count")
    size = acc.op("Size", [x])
    assert isinstance(size, Value)
    out = acc.op("Cast", [size], to=elem)
    assert isinstance(out, Value)
    return out


def dim_size(acc: ModelAccessor, x: str, axis: int, like: str) -> Value:
    """The size of ``x`` along ``axis`` as a scalar of ``like``'s element type (a constant when
    static).
    """
    elem = acc.elem_type(like) or TensorProto.FLOAT
    static = static_dim(acc, x, axis)
    if static is not None:
        return acc.constant(static, dtype=helper.tensor_dtype_to_np_dtype(elem), name_hint="dim")
    dims = acc.op("Shape", [x])
    index = acc.constant(axis, dtype=np.int64, name_hint="axis")
    assert isinstance(dims, Value)
    gathered = acc.op("Gather", [dims, index], axis=0)
    assert isinstance(gathered, Value)
    out = acc.op("Cast", [gathered], to=elem)
    assert isinstance(out, Value)
    return out

"""What the class-index losses (cross entropy, NLL) share: the class axis, labels, and the weighted
NLL.

Layout: the scores (logits or log-probabilities) have a *class axis*. By default it
is axis 1, as in torch: ``[N, C]`` or ``[N, C, d1, d2, ...]``. Sequence models
whose classes are the last axis (``[B, T, V]``) pass ``class_axis=-1``. The labels
have the scores' shape without the class axis and hold class indices (int64 by
default). A 1-D score vector ``[C]`` is one unbatched example whose label is a
scalar, whatever ``class_axis`` says (as in torch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import (
    FLOAT_TYPES,
    INDEX_TYPES,
    Loss,
    Shape,
    as_float_array,
    axes_op,
    check_ignore_index,
    dim_size,
    dtype_name,
    format_shape,
    reduce_all,
    static_dim,
)


def shapes_fit(expected: Shape | None, actual: Shape | None) -> bool:
    """False only when two shapes certainly differ (rank, or two static dims)."""
    if expected is None or actual is None:
        return True
    if len(expected) != len(actual):
        return False
    pairs = zip(expected, actual, strict=True)
    return not any(isinstance(e, int) and isinstance(a, int) and e != a for e, a in pairs)


class ClassLoss(Loss):
    """Base of losses over class scores with class-index labels.

    Args:
        weight: Weight of each class, shape ``[C]`` (list or numpy array), a constant
            of the graph. None: every class weighs 1.
        reduction: ``"mean"`` (weighted mean over the non-ignored labels), ``"sum"`` or ``"none"``.
        ignore_index: A label value that contributes neither to the loss nor to the
            mean's denominator. None (default): no label is ignored.
        class_axis: The axis of the scores that holds the classes (1 by default, as
            torch; -1 for ``[B, T, V]`` sequence logits).

    Raises:
        ValueError: if ``reduction`` is unknown, ``weight`` is not a 1-D numeric array or
            ``ignore_index`` does not fit int64 (at build: does not fit the labels' dtype;
            ``weight``
            has not one value per class).
        TypeError: if ``ignore_index`` or ``class_axis`` is not an int.
    """

    #: Name hint of the loss output.
    _name_hint = "class_loss"

    def __init__(
        self,
        weight: Any = None,
        reduction: str = "mean",
        ignore_index: int | None = None,
        class_axis: int = 1,
    ) -> None:
        super().__init__(reduction)
        owner = type(self).__name__
        self._weight = as_float_array(owner, "weight", weight)
        if self._weight is not None and self._weight.ndim != 1:
            raise InvalidValueError(
                f"{owner}: weight must be 1-D, one value per class, but has shape "
                f"{list(self._weight.shape)}."
            )
        if ignore_index is not None and (
            isinstance(ignore_index, (bool, np.bool_))
            or not isinstance(ignore_index, (int, np.integer))
        ):
            raise InvalidTypeError(
                f"{owner}: ignore_index must be an int (a label value) or None, not "
                f"{type(ignore_index).__name__}: "
                f"{ignore_index!r}."
            )
        if ignore_index is not None:
            check_ignore_index(f"{owner}: ", int(ignore_index), TensorProto.INT64)
        if isinstance(class_axis, (bool, np.bool_)) or not isinstance(
            class_axis, (int, np.integer)
        ):
            raise InvalidTypeError(
                f"{owner}: class_axis must be an int (1, or -1 for [B, T, V]), not "
                f"{type(class_axis).__name__}: "
                f"{class_axis!r}."
            )
        self._ignore_index = None if ignore_index is None else int(ignore_index)
        self._class_axis = int(class_axis)

    # ------------------------------------------------------------ layout
    def _axis(self, scores: str) -> int:
        """The class axis of ``scores``, normalized to be >= 0 when the rank is known.

        Raises:
            ValueError: if the scores are scalars or the axis is out of range.
        """
        acc = self.accessor
        shape = acc.shape_of(scores)
        if shape is None:
            return self._class_axis
        rank = len(shape)
        if rank == 0:
            raise InvalidValueError(
                f"{acc.where()}scores '{scores}' are a scalar; {type(self).__name__} needs class "
                "scores of "
                "shape [C], [N, C] or [N, C, d1, ...]."
            )
        if rank == 1:
            return 0
        if not -rank <= self._class_axis < rank:
            raise InvalidValueError(
                f"{acc.where()}class_axis={self._class_axis} is out of range for scores "
                f"'{scores}' of shape "
                f"{format_shape(shape)}. Use an axis in [{-rank}, {rank - 1}] (1 for [N, C, "
                "...], -1 for [B, T, V])."
            )
        return self._class_axis % rank

    def _check_weight(self, scores: str, axis: int) -> None:
        shape = self.accessor.shape_of(scores)
        if self._weight is None or shape is None or not isinstance(shape[axis], int):
            return
        if self._weight.shape[0] != shape[axis]:
            raise InvalidValueError(
                f"{self.accessor.where()}weight has {self._weight.shape[0]} values but scores "
                f"'{scores}' of shape "
                f"{format_shape(shape)} have {shape[axis]} classes on axis {axis}. Give one "
                "weight per class."
            )

    def _labels(
        self, scores: str, labels_name: str, axis: int, allow_probabilities: bool = False
    ) -> tuple[Value, bool]:
        """The labels: an existing value (checked), or a new int64 graph input.

        Returns:
            ``(labels, are_probabilities)``; probabilities are float labels shaped like
            the scores (only when ``allow_probabilities``).

        Raises:
            ValueError: if the labels' shape does not fit the scores', or new labels are
                needed but the scores' rank is unknown.
            TypeError: if the labels' dtype is neither an index type nor (when allowed) the scores'
            float type.
        """
        acc = self.accessor
        shape = acc.shape_of(scores)
        expected = None if shape is None or axis < 0 else shape[:axis] + shape[axis + 1 :]
        if not acc.has_value(labels_name):
            if expected is None:
                raise InvalidValueError(
                    f"{acc.where()}cannot create the labels input '{labels_name}': the rank of "
                    f"scores '{scores}' is "
                    f"unknown. Add the labels yourself, e.g. accessor.add_input('{labels_name}', "
                    "onnx.TensorProto.INT64, ['batch']), and pass its name."
                )
            return acc.add_input(labels_name, TensorProto.INT64, expected), False
        labels = Value(labels_name)
        elem = acc.elem_type(labels_name)
        actual = acc.shape_of(labels_name)
        if allow_probabilities and elem in FLOAT_TYPES and shapes_fit(shape, actual):
            scores_elem = acc.elem_type(scores)
            if scores_elem is not None and elem != scores_elem:
                raise InvalidTypeError(
                    f"{acc.where()}probability labels '{labels_name}' have dtype "
                    f"{dtype_name(elem)} but scores "
                    f"'{scores}' have dtype {dtype_name(scores_elem)}; cast the labels to "
                    f"{dtype_name(scores_elem)}."
                )
            if self._ignore_index is not None:
                raise InvalidValueError(
                    f"{acc.where()}ignore_index applies to class-index labels only, but labels "
                    f"'{labels_name}' are "
                    "float class probabilities. Leave ignore_index=None, or pass int64 class "
                    "indices."
                )
            return labels, True
        if elem in INDEX_TYPES and self._ignore_index is not None:
            check_ignore_index(acc.where(), self._ignore_index, elem, labels_name)
        if elem is not None and elem not in INDEX_TYPES:
            probs = (
                f" or float class probabilities of the scores' shape {format_shape(shape)}"
                if allow_probabilities
                else ""
            )
            raise InvalidTypeError(
                f"{acc.where()}labels '{labels_name}' have dtype {dtype_name(elem)}; "
                f"{type(self).__name__} needs "
                f"int64 (or int32) class indices{probs}. Cast them: "
                "onnxblocks.blocks.Cast(onnx.TensorProto.INT64)."
            )
        if not shapes_fit(expected, actual):
            raise InvalidValueError(
                f"{acc.where()}labels '{labels_name}' have shape {format_shape(actual)}, but "
                f"scores '{scores}' of "
                f"shape {format_shape(shape)} need labels of shape {format_shape(expected)} (the "
                "scores' shape "
                f"without the class axis {axis}). Pass labels of that shape, or set class_axis "
                "to the axis that "
                "holds the classes (class_axis=-1 for [batch, sequence, classes] scores)."
            )
        return labels, False

    def _weight_const(self, like: str, shape: list[int] | None = None) -> Value:
        assert self._weight is not None
        array = self._weight if shape is None else self._weight.reshape(shape)
        return self._const(array, like, "class_weight")

    def _class_weight_broadcast(self, scores: str, axis: int) -> Value:
        """The class weights shaped ``[C, 1, ..., 1]`` so that they broadcast along ``axis`` of the
        scores.

        Raises:
            ValueError: if the class axis is not the last one and the scores' rank is unknown.
        """
        assert self._weight is not None
        shape = self.accessor.shape_of(scores)
        if axis == -1 or (shape is not None and axis == len(shape) - 1):
            return self._weight_const(scores)
        if shape is None or axis < 0:
            raise InvalidValueError(
                f"{self.accessor.where()}scores '{scores}' have an unknown rank, so the class "
                "weights cannot be "
                "broadcast along the class axis. Give the scores a known rank (e.g. with a "
                "value_info or a typed "
                "graph output), or use class_axis=-1."
            )
        return self._weight_const(scores, [-1] + [1] * (len(shape) - 1 - axis))

    # ------------------------------------------------------------ the loss
    def _unbatched(self, scores: str) -> bool:
        """True for one unbatched example: scores of shape ``[C]`` (a scalar label)."""
        shape = self.accessor.shape_of(scores)
        return shape is not None and len(shape) == 1

    def _as_batch(self, scores: str, labels: str) -> tuple[Value, Value]:
        """``[C]`` scores and a scalar label as a batch of one: ``[1, C]`` and ``[1]`` (class axis
        1).

        ONNX Runtime's gradients of ``GatherElements`` and of the masks cannot take
        rank-0 labels; the loss of a batch of one is the example's loss.
        """
        acc = self.accessor
        return axes_op(acc, "Unsqueeze", scores, [0]), axes_op(acc, "Unsqueeze", labels, [0])

    def _unbatch(self, loss: Value) -> Value:
        """The ``"none"`` loss of a batch of one (``[1]``) as the scalar of its example; others
        as they are.
        """
        if self.reduction != "none":
            return loss
        return axes_op(
            self.accessor,
            "Squeeze",
            loss,
            [0],
            outputs=[self.accessor.names.fresh(self._name_hint)],
        )

    def _label_mask(self, labels: str) -> tuple[Value | None, Value | None, Value]:
        """``(keep, ignored, safe)``: which labels count, which are ignored, and labels with ignored
        ones set to 0.

        Without an ``ignore_index``, ``keep`` and ``ignored`` are None and ``safe`` is the labels.
        """
        acc = self.accessor
        if self._ignore_index is None:
            return None, None, Value(labels)
        label_dtype = helper.tensor_dtype_to_np_dtype(acc.elem_type(labels) or TensorProto.INT64)
        ignore_index = acc.constant(self._ignore_index, dtype=label_dtype, name_hint="ignore_index")
        ignored = acc.op("Equal", [labels, ignore_index])
        keep = acc.op("Not", [ignored])
        safe = acc.op(
            "Where", [keep, labels, acc.constant(0, dtype=label_dtype, name_hint="zero_label")]
        )
        assert isinstance(keep, Value) and isinstance(ignored, Value) and isinstance(safe, Value)
        return keep, ignored, safe

    def _class_weight_of(self, safe: Value, like: str) -> Value | None:
        """``weight[y_i]`` for each (safe) label, or None without class weights."""
        if self._weight is None:
            return None
        out = self.accessor.op("Gather", [self._weight_const(like), safe], axis=0)
        assert isinstance(out, Value)
        return out

    def _label_weights(
        self, keep: Value | None, class_weight: Value | None, like: str
    ) -> Value | None:
        """``w_i``: the weight of each label (``weight[y_i]``, 0 when ignored); None when every
        label weighs 1.
        """
        acc = self.accessor
        if keep is None:
            return class_weight
        mask = acc.op("Cast", [keep], to=acc.elem_type(like) or TensorProto.FLOAT)
        return mask if class_weight is None else class_weight * mask

    def _weighted_mean(self, per_element: str, weight_i: str) -> Value:
        """``sum_i loss_i / sum_i w_i``, NaN when no label counts (``sum_i w_i == 0``), as torch.

        The quotient divides by 1 where the denominator is 0 and NaN is selected
        instead, so the gradient there is 0 (torch's), not ``inf * 0``.
        """
        acc = self.accessor
        total = reduce_all(acc, "ReduceSum", per_element)
        denominator = reduce_all(acc, "ReduceSum", weight_i)
        empty = acc.op("Equal", [denominator, self._const(0.0, per_element, "zero")])
        safe = acc.op("Where", [empty, self._const(1.0, per_element, "one"), denominator])
        nan = self._const(float("nan"), per_element, "nan")
        quotient = acc.op("Div", [total, safe])
        return acc.op("Where", [empty, nan, quotient], outputs=[acc.names.fresh(self._name_hint)])

    def _log_softmax(self, scores: str, axis: int) -> Value:
        """``log_softmax(scores)`` along ``axis``.

        In double it is ``scores - logsumexp(scores)``: ONNX Runtime 1.19.2 has no
        double kernel for ``LogSoftmax``'s gradient, and the gradient of
        ``ReduceLogSumExp`` is written in ops it has double kernels for.
        """
        acc = self.accessor
        if acc.elem_type(scores) != TensorProto.DOUBLE:
            out = acc.op("LogSoftmax", [scores], axis=axis)
            assert isinstance(out, Value)
            return out
        return Value(scores) - axes_op(acc, "ReduceLogSumExp", scores, [axis], keepdims=1)

    def _weighted_nll(
        self, log_probs: str, labels: str, axis: int, label_smoothing: float = 0.0
    ) -> Value:
        """Weighted negative log-likelihood (with optional label smoothing), reduced, from ops ORT
        differentiates.

        Per element ``i`` with label ``y_i``, weight ``w_i = weight[y_i]`` (0 when ignored)::

            nll_i    = -w_i * log_probs[i, y_i]
            smooth_i = -sum_c weight[c] * log_probs[i, c]          (0 when ignored)
            loss_i   = (1 - eps) * nll_i + eps / C * smooth_i

        "mean" divides the sum by ``sum_i w_i`` (the count of non-ignored labels when unweighted).
        """
        acc = self.accessor
        keep, ignored, safe = self._label_mask(labels)
        index = axes_op(acc, "Unsqueeze", safe, [axis])
        picked = axes_op(
            acc, "Squeeze", acc.op("GatherElements", [log_probs, index], axis=axis), [axis]
        )
        class_weight = self._class_weight_of(safe, log_probs)
        per_element = -picked if class_weight is None else -(picked * class_weight)
        if label_smoothing > 0:
            weighted = (
                log_probs
                if self._weight is None
                else log_probs * self._class_weight_broadcast(log_probs, axis)
            )
            smooth = -axes_op(acc, "ReduceSum", weighted, [axis], keepdims=0)
            classes = static_dim(acc, log_probs, axis) or dim_size(acc, log_probs, axis, log_probs)
            per_element = (1 - label_smoothing) * per_element + (label_smoothing / classes) * smooth
        if ignored is not None:
            # An ignored element is +0.0, as torch: not -(x * 0), which is -0.0 for x >= 0 and NaN
            # for x = -inf.
            # The kept values are Where's last input: ONNX Runtime's Where turns a -0.0 it takes
            # from X into +0.0.
            per_element = acc.op(
                "Where", [ignored, self._const(0.0, log_probs, "ignored"), per_element]
            )
        weight_i = self._label_weights(keep, class_weight, log_probs)
        if self.reduction != "mean" or weight_i is None:
            return self._reduce(per_element, self._name_hint)
        return self._weighted_mean(per_element, weight_i)

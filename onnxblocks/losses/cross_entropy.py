"""Cross entropy between class scores (logits) and class labels."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import axes_op, dim_size, static_dim
from onnxblocks.losses._class_scores import ClassLoss
from onnxblocks.losses.chunked_build import build_chunked, check_chunking


class CrossEntropyLoss(ClassLoss):
    """Cross entropy of ``softmax(scores)`` and the labels, like ``torch.nn.CrossEntropyLoss``.

    The scores are unnormalized logits with the classes on ``class_axis``: ``[N, C]``,
    ``[N, C, d1, ...]`` (``class_axis=1``, the default, as torch), or ``[B, T, V]``
    (``class_axis=-1``). The labels are class indices shaped like the scores
    without the class axis (``[N]``, ``[N, d1, ...]``, ``[B, T]``).

    An existing float value shaped like the scores may be passed as labels instead:
    it then holds class probabilities, and the loss is
    ``-sum_c weight[c] * p[c] * log_softmax(scores)[c]`` (mean: over the examples).

    Without label smoothing and with index labels, the loss is ONNX's fused
    ``SoftmaxCrossEntropyLoss`` (class-last scores are flattened to ``[N*T, V]``
    for it, without a copy). Otherwise it is composed from ``LogSoftmax``,
    ``GatherElements`` and reductions. ONNX Runtime differentiates both.

    Args:
        weight: Weight of each class, shape ``[C]`` (list or numpy array), a constant
            of the graph. None: every class weighs 1.
        reduction: ``"mean"`` (default: the weighted mean over non-ignored labels,
            ``sum_i w[y_i] * loss_i / sum_i w[y_i]``), ``"sum"`` or ``"none"`` (shaped
            like the labels).
        ignore_index: A label value that adds nothing to the loss and to the mean's
            denominator. None (default): none is ignored. (torch's default, -100,
            ignores labels of -100; pass ``ignore_index=-100`` to do the same.)
        label_smoothing: ``eps`` in ``[0, 1]``: the target mixes the one-hot label
            (weight ``1 - eps``) with the uniform distribution (weight ``eps``).
        class_axis: The scores' axis holding the classes: 1 (default) or -1 for
            ``[B, T, V]``; any axis works.
        chunk_size: Rows (tokens) per chunk: the log-softmax and its gradient are computed
            over the classes in chunks of this many rows (:mod:`onnxblocks.losses.chunked`),
            never for all rows at once. Needs the classes on the last axis, index labels,
            ``reduction`` ``"mean"`` or ``"sum"`` and no label smoothing. None (default):
            the whole batch at once.
        head_weight: With ``chunk_size``: the name of the LM head's weight (``[V, H]``, as
            ``nn.Linear``, or ``[H, V]``), a frozen weight. The loss then computes the logits
            itself, chunk by chunk, from the hidden states ``[B, T, H]``: pass the hidden
            states, or the logits the head computes from them (the head's input is taken).
            Rows labelled ``ignore_index`` are dropped before the head.

    Raises:
        ValueError: if ``reduction`` is unknown, ``label_smoothing`` is outside
            ``[0, 1]`` or ``weight`` is not 1-D.
        TypeError: if ``label_smoothing`` is not a number, ``chunk_size`` not an int or
            ``head_weight`` not a string.
    """

    _name_hint = "cross_entropy_loss"

    def __init__(
        self,
        weight: Any = None,
        reduction: str = "mean",
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        class_axis: int = 1,
        chunk_size: int | None = None,
        head_weight: str | None = None,
    ) -> None:
        super().__init__(weight, reduction, ignore_index, class_axis)
        if isinstance(label_smoothing, bool) or not isinstance(
            label_smoothing, (int, float, np.integer, np.floating)
        ):
            raise InvalidTypeError(
                "CrossEntropyLoss: label_smoothing must be a number in [0, 1], not "
                f"{type(label_smoothing).__name__}: "
                f"{label_smoothing!r}."
            )
        if not 0.0 <= label_smoothing <= 1.0:
            raise InvalidValueError(
                f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing!r}."
            )
        self._label_smoothing = float(label_smoothing)
        self._chunking = check_chunking(self, chunk_size, head_weight, self._label_smoothing)

    def build(self, scores_input_name: str, labels_name: str = "labels") -> Value:
        """Add the loss on the logits ``scores_input_name`` and return its output.

        Args:
            scores_input_name: The logits (floating point) with classes on ``class_axis``.
            labels_name: The labels. If the model has no value of that name, an int64
                graph input shaped like the scores without the class axis is created
                (symbolic dims are kept).

        Raises:
            TypeError: if the scores are not floating point or the labels' dtype is wrong.
            ValueError: if the labels' shape does not fit the scores'.
        """
        self._require_float(scores_input_name, role="scores")
        axis = self._axis(scores_input_name)
        if self._chunking is not None:
            return build_chunked(self, self._chunking, scores_input_name, labels_name, axis)
        self._check_weight(scores_input_name, axis)
        labels, probabilities = self._labels(
            scores_input_name, labels_name, axis, allow_probabilities=True
        )
        if probabilities:
            return self._soft_targets(scores_input_name, labels, axis)
        scores: str = scores_input_name
        unbatched = self._unbatched(scores)
        if unbatched:
            scores, labels = self._as_batch(scores, labels)
            axis = 1
        fused = self._fused_layout(scores, axis)
        if self._label_smoothing == 0 and fused is not None:
            loss = self._fused(scores, labels, fused)
        else:
            loss = self._weighted_nll(
                self._log_softmax(scores, axis), labels, axis, self._label_smoothing
            )
        return self._unbatch(loss) if unbatched else loss

    def _fused_layout(self, scores: str, axis: int) -> str | None:
        """``"direct"`` for ``[N, C, ...]``, ``"flatten"`` for class-last ``[..., C]``, None
        otherwise.
        """
        shape = self.accessor.shape_of(scores)
        if shape is None:
            return {1: "direct", -1: "flatten"}.get(axis)
        if len(shape) < 2:
            return None
        if axis == 1:
            return "direct"
        return "flatten" if axis == len(shape) - 1 else None

    def _fused(self, scores: str, labels: str, layout: str) -> Value:
        """ONNX ``SoftmaxCrossEntropyLoss``; ORT's gradient needs its second output
        (log-probabilities).

        A weighted or masked ``"mean"`` is the op's ``"none"`` losses summed and divided
        here: ONNX Runtime 1.19.2's kernel gives 0 when no label counts (every label
        ignored, or weighing 0), where torch (and later ONNX Runtimes) give NaN.
        """
        acc = self.accessor
        if layout == "flatten":
            scores = acc.op("Flatten", [scores], axis=-1)
            flat_shape = acc.constant([-1], dtype=np.int64, name_hint="flat_shape")
            labels_2d, labels = labels, acc.op("Reshape", [labels, flat_shape])
        inputs = [scores, labels] + (
            [self._weight_const(scores)] if self._weight is not None else []
        )
        own_mean = self.reduction == "mean" and (
            self._ignore_index is not None or self._weight is not None
        )
        reduction = "none" if own_mean else self.reduction
        loss_name = acc.names.fresh(self._name_hint)
        loss, _ = acc.op(
            "SoftmaxCrossEntropyLoss",
            inputs,
            outputs=[
                loss_name
                if layout == "direct" or reduction != "none"
                else acc.names.fresh("flat_loss"),
                acc.names.fresh("log_prob"),
            ],
            reduction=reduction,
            ignore_index=self._ignore_index,
        )
        if own_mean:
            keep, _, safe = self._label_mask(labels)
            weight_i = self._label_weights(keep, self._class_weight_of(safe, scores), scores)
            assert weight_i is not None
            return self._weighted_mean(loss, weight_i)
        if layout == "flatten" and reduction == "none":
            loss = acc.op("Reshape", [loss, acc.op("Shape", [labels_2d])], outputs=[loss_name])
        return loss

    def _soft_targets(self, scores: str, probabilities: str, axis: int) -> Value:
        """``-sum_c weight[c] * p[c] * log_softmax(scores)[c]``, optionally smoothed; mean over
        examples.
        """
        acc = self.accessor
        log_probs = self._log_softmax(scores, axis)
        target = Value(probabilities)
        if self._label_smoothing > 0:
            eps = self._label_smoothing
            classes = static_dim(acc, scores, axis) or dim_size(acc, scores, axis, scores)
            target = (1 - eps) * target + eps / classes
        weighted = log_probs * target
        if self._weight is not None:
            weighted = weighted * self._class_weight_broadcast(scores, axis)
        per_example = -axes_op(acc, "ReduceSum", weighted, [axis], keepdims=0)
        return self._reduce(per_example, self._name_hint)

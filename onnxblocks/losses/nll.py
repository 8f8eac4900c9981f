"""Negative log-likelihood of class labels under log-probabilities."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._class_scores import ClassLoss


class NLLLoss(ClassLoss):
    """Negative log-likelihood, like ``torch.nn.NLLLoss``: the input holds log-probabilities.

    Per element ``i`` with label ``y_i``: ``-weight[y_i] * input[i, y_i]``. Use it after
    a ``LogSoftmax``; on raw logits use :class:`CrossEntropyLoss`.

    It is composed from ``GatherElements`` and reductions, because ONNX Runtime
    1.19 cannot differentiate ONNX's ``NegativeLogLikelihoodLoss`` op.

    Args:
        weight: Weight of each class, shape ``[C]`` (list or numpy array), a constant
            of the graph. None: every class weighs 1.
        reduction: ``"mean"`` (default: ``sum_i w[y_i] * loss_i / sum_i w[y_i]`` over
            non-ignored labels), ``"sum"`` or ``"none"`` (shaped like the labels).
        ignore_index: A label value that adds nothing to the loss and to the mean's
            denominator. None (default): none is ignored.
        class_axis: The input's axis holding the classes: 1 (default, as torch:
            ``[N, C, d1, ...]``) or -1 for ``[B, T, V]``; any axis works.

    Raises:
        ValueError: if ``reduction`` is unknown or ``weight`` is not 1-D.
    """

    _name_hint = "nll_loss"

    def build(self, loss_input_name: str, labels_name: str = "labels") -> Value:
        """Add the loss on the log-probabilities ``loss_input_name`` and return its output.

        Args:
            loss_input_name: Log-probabilities (floating point) with classes on ``class_axis``.
            labels_name: The labels. If the model has no value of that name, an int64
                graph input shaped like the input without the class axis is created.

        Raises:
            TypeError: if the input is not floating point or the labels are not integers.
            ValueError: if the labels' shape does not fit the input's.
        """
        self._require_float(loss_input_name)
        axis = self._axis(loss_input_name)
        self._check_weight(loss_input_name, axis)
        labels, _ = self._labels(loss_input_name, labels_name, axis)
        if not self._unbatched(loss_input_name):
            return self._weighted_nll(loss_input_name, labels, axis)
        log_probs, labels = self._as_batch(loss_input_name, labels)
        return self._unbatch(self._weighted_nll(log_probs, labels, 1))

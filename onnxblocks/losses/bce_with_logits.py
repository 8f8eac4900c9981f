"""Binary cross entropy on logits (sigmoid and BCE in one, numerically stable)."""

from __future__ import annotations

from typing import Any

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss, as_float_array


class BCEWithLogitsLoss(Loss):
    """Binary cross entropy of ``sigmoid(input)`` and ``target``, like
    ``torch.nn.BCEWithLogitsLoss``.

    Per element, with ``x`` the logit and ``y`` the target (a probability)::

        loss = w * ((1 - y) * x + (1 + (p - 1) * y) * softplus(-x))

    which equals ``-w * (p * y * log(sigmoid(x)) + (1 - y) * log(1 - sigmoid(x)))``
    without overflow for large ``|x|``. ``softplus(-x)`` is computed as
    ``(|x| - x) / 2 + log(1 + exp(-|x|))`` (``(|x| - x) / 2`` is ``relu(-x)``), ops that
    ONNX Runtime differentiates in float32, float16 and double; at ``x = 0`` the
    gradient is torch's ``sigmoid(0) - y``.

    Args:
        weight: Rescaling weight ``w`` of each element, broadcast against the input
            (e.g. shape ``[C]`` for an input ``[N, C]``); a list or numpy array that
            becomes a constant of the graph. None: no rescaling.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        pos_weight: Weight ``p`` of the positive examples, broadcast against the
            input (usually one value per class, shape ``[C]``). None: 1.

    Raises:
        ValueError: if ``reduction`` is unknown, or a weight is not numeric.
    """

    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None) -> None:
        super().__init__(reduction)
        self._weight = as_float_array("BCEWithLogitsLoss", "weight", weight)
        self._pos_weight = as_float_array("BCEWithLogitsLoss", "pos_weight", pos_weight)

    def build(self, loss_input_name: str, target_name: str = "target") -> Value:
        """Add the loss on the logits ``loss_input_name`` and return its output.

        Args:
            loss_input_name: The logits (floating point), any shape.
            target_name: The targets in ``[0, 1]``. If the model has no value of that
                name, a graph input with the dtype and shape of the logits is created.

        Raises:
            TypeError: if the logits are not floating point, or the target's dtype differs.
            ValueError: if ``weight`` or ``pos_weight`` does not broadcast against the logits (e.g.
            a
                ``pos_weight`` whose length is not the number of classes, the logits' last dim).
        """
        acc = self.accessor
        target = self._target_like(loss_input_name, target_name)
        for param, array in (("weight", self._weight), ("pos_weight", self._pos_weight)):
            if array is not None:
                self._check_broadcast(param, array, loss_input_name)
        x = Value(loss_input_name)
        magnitude = abs(x)
        log_one_plus = acc.op("Log", [1 + acc.op("Exp", [-magnitude])])
        softplus_neg = (
            0.5 * (magnitude - x) + log_one_plus
        )  # relu(-x), in ops with double gradient kernels
        if self._pos_weight is not None:
            pos_weight = self._const(self._pos_weight, x, "bce_pos_weight")
            softplus_neg = (1 + (pos_weight - 1) * target) * softplus_neg
        per_element = (1 - target) * x + softplus_neg
        if self._weight is not None:
            per_element = per_element * self._const(self._weight, x, "bce_weight")
        return self._reduce(per_element, "bce_with_logits_loss")

"""Kullback-Leibler divergence between a target distribution and log-probabilities."""

from __future__ import annotations

import numpy as np

from onnxblocks._core.errors import InvalidTypeError
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import REDUCTIONS, Loss, dim_size

#: KLDivLoss also accepts "batchmean" (the sum divided by the batch size).
KL_REDUCTIONS: tuple[str, ...] = (*REDUCTIONS, "batchmean")


class KLDivLoss(Loss):
    """KL divergence ``KL(target || exp(input))``, like ``torch.nn.KLDivLoss``.

    The input holds log-probabilities (e.g. a LogSoftmax output). Per element::

        loss = target * (log(target) - input)          # log_target=False; 0 where target == 0
        loss = exp(target) * (target - input)          # log_target=True

    Args:
        reduction: ``"mean"`` (default; the mean over *all* elements, as torch),
            ``"batchmean"`` (the sum divided by the size of the first dimension:
            the mathematical KL divergence per example), ``"sum"`` or ``"none"``.
        log_target: Whether the target holds log-probabilities instead of probabilities.

    Raises:
        ValueError: if ``reduction`` is unknown.
        TypeError: if ``log_target`` is not a bool.
    """

    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(reduction, KL_REDUCTIONS)
        if not isinstance(log_target, (bool, np.bool_)):
            raise InvalidTypeError(
                f"KLDivLoss: log_target must be True or False, not {type(log_target).__name__}: "
                f"{log_target!r}."
            )
        self._log_target = bool(log_target)

    def build(self, loss_input_name: str, target_name: str = "target") -> Value:
        """Add the loss on the log-probabilities ``loss_input_name`` and return its output.

        Args:
            loss_input_name: Log-probabilities (floating point), any shape.
            target_name: The target distribution (or its log with ``log_target=True``). If
                the model has no value of that name, a graph input with the dtype and
                shape of the input is created.

        Raises:
            TypeError: if the input is not floating point, or the target's dtype differs.
        """
        acc = self.accessor
        target = self._target_like(loss_input_name, target_name)
        x = Value(loss_input_name)
        if self._log_target:
            per_element = acc.op("Exp", [target]) * (target - x)
        else:
            # target * log(target) is 0 where target == 0: take log(1) there, which keeps
            # both the value and its gradient finite.
            zero = self._const(0, x, "kl_zero")
            one = self._const(1, x, "kl_one")
            safe = acc.op("Where", [acc.op("Greater", [target, zero]), target, one])
            per_element = target * (acc.op("Log", [safe]) - x)
        if self.reduction != "batchmean":
            return self._reduce(per_element, "kl_div_loss")
        total = self._reduce(per_element, "kl_div_sum", reduction="sum")
        shape = acc.shape_of(loss_input_name)
        if shape is not None and len(shape) == 0:
            return total
        return acc.op(
            "Div",
            [total, dim_size(acc, loss_input_name, 0, x)],
            outputs=[acc.names.fresh("kl_div_loss")],
        )

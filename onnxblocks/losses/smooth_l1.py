"""Smooth L1 loss: squared error (divided by ``beta``) near zero, absolute error beyond."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss
from onnxblocks.losses.huber import clipped_abs_error


class SmoothL1Loss(Loss):
    """Smooth L1 loss, like ``torch.nn.SmoothL1Loss``.

    Per element, with ``d = input - target``: ``0.5 * d**2 / beta`` where
    ``|d| < beta``, else ``|d| - 0.5 * beta``. With ``beta=0`` it is the L1 loss.
    It equals ``HuberLoss(delta=beta) / beta``.

    Args:
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        beta: Where the loss changes from quadratic to linear; must be >= 0.

    Raises:
        ValueError: if ``reduction`` is unknown or ``beta`` is negative.
    """

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        if not beta >= 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0, got {beta!r}.")
        self._beta = float(beta)

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
        if self._beta == 0:
            return self._reduce(abs(Value(loss_input_name) - target), "smooth_l1_loss")
        a, m = clipped_abs_error(self, loss_input_name, target, self._beta)
        per_element = 0.5 / self._beta * m * m + (a - m)
        return self._reduce(per_element, "smooth_l1_loss")

"""Smooth L1 loss: squared error (divided by ``beta``) near zero, absolute error beyond."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import PointwiseLoss
from onnxblocks.losses.huber import clipped_abs_error


class SmoothL1Loss(PointwiseLoss):
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

    output_hint = "smooth_l1_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        if self._beta == 0:
            return abs(x - target)
        a, m = clipped_abs_error(self, x, target, self._beta)
        return 0.5 / self._beta * m * m + (a - m)

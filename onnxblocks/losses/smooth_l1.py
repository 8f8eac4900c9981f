"""Smooth L1 loss: squared error (divided by ``beta``) near zero, absolute error beyond."""

from __future__ import annotations

import math

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import PointwiseLoss
from onnxblocks.losses.huber import clipped_abs_error, positive_number


class SmoothL1Loss(PointwiseLoss):
    """Smooth L1 loss, like ``torch.nn.SmoothL1Loss``.

    Per element, with ``d = input - target``: ``0.5 * d**2 / beta`` where
    ``|d| < beta``, else ``|d| - 0.5 * beta``. With ``beta=0`` it is the L1 loss.
    It equals ``HuberLoss(delta=beta) / beta``.

    Args:
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        beta: Where the loss changes from quadratic to linear; must be >= 0.
            ``float("inf")`` gives 0 everywhere, as torch.

    Raises:
        ValueError: if ``reduction`` is unknown or ``beta`` is negative.
        TypeError: if ``beta`` is not a real number.
    """

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self._beta = positive_number("SmoothL1Loss", "beta", beta, allow_zero=True)

    output_hint = "smooth_l1_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        if self._beta == 0:
            return abs(x - target)
        if math.isinf(self._beta):  # 0.5 * d**2 / inf: zero (torch), without inf * 0
            return 0.0 * abs(x - target)
        a, m = clipped_abs_error(self, x, target, self._beta)
        return 0.5 / self._beta * m * m + (a - m)

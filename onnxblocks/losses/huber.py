"""Huber loss: squared error near zero, absolute error (scaled by ``delta``) beyond."""

from __future__ import annotations

from onnxblocks.blocks.elementwise import Clip
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss, PointwiseLoss


def clipped_abs_error(loss: Loss, loss_input_name: str, target: str, limit: float) -> tuple[Value, Value]:
    """Return ``(a, m)`` with ``a = |input - target|`` and ``m = min(a, limit)``.

    Both Huber and smooth L1 are ``0.5 * m**2 / s + c * (a - m)`` for some ``s`` and
    ``c``: this form has no branch (no ``Where``), and ONNX Runtime can
    differentiate every op in it.
    """
    a = abs(Value(loss_input_name) - target)
    return a, Clip(clip_max=limit)(a)


class HuberLoss(PointwiseLoss):
    """Huber loss, like ``torch.nn.HuberLoss``.

    Per element, with ``d = input - target``: ``0.5 * d**2`` where ``|d| < delta``,
    else ``delta * (|d| - 0.5 * delta)``.

    Args:
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        delta: Where the loss changes from quadratic to linear; must be positive.

    Raises:
        ValueError: if ``reduction`` is unknown or ``delta`` is not positive.
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta!r}.")
        self._delta = float(delta)

    output_hint = "huber_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        a, m = clipped_abs_error(self, x, target, self._delta)
        return 0.5 * m * m + self._delta * (a - m)

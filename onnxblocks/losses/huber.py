"""Huber loss: squared error near zero, absolute error (scaled by ``delta``) beyond."""

from __future__ import annotations

from onnxblocks.blocks.elementwise import Clip
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss


def clipped_abs_error(loss: Loss, loss_input_name: str, target: str, limit: float) -> tuple[Value, Value]:
    """Return ``(a, m)`` with ``a = |input - target|`` and ``m = min(a, limit)``.

    Both Huber and smooth L1 are ``0.5 * m**2 / s + c * (a - m)`` for some ``s`` and
    ``c``: this form has no branch (no ``Where``), and ONNX Runtime can
    differentiate every op in it.
    """
    a = abs(Value(loss_input_name) - target)
    return a, Clip(clip_max=limit)(a)


class HuberLoss(Loss):
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
        a, m = clipped_abs_error(self, loss_input_name, target, self._delta)
        per_element = 0.5 * m * m + self._delta * (a - m)
        return self._reduce(per_element, "huber_loss")

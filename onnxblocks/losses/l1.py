"""Mean absolute error."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import PointwiseLoss


class L1Loss(PointwiseLoss):
    """Absolute error ``|input - target|``, reduced; like ``torch.nn.L1Loss``.

    Args:
        reduction: ``"mean"`` (default) or ``"sum"`` give a scalar; ``"none"`` gives
            the per-element errors, shaped like the input.

    Raises:
        ValueError: if ``reduction`` is unknown.
    """

    output_hint = "l1_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        return abs(x - target)

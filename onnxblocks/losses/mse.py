"""Mean squared error."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import PointwiseLoss


class MSELoss(PointwiseLoss):
    """Squared error ``(input - target) ** 2``, reduced; like ``torch.nn.MSELoss``.

    Args:
        reduction: ``"mean"`` (default) or ``"sum"`` give a scalar; ``"none"`` gives
            the per-element errors, shaped like the input.

    Example:
        >>> with onnxblocks.base(model):
        ...     loss = MSELoss()("output")  # creates the graph input "target" like "output"

    Raises:
        ValueError: if ``reduction`` is unknown.
    """

    output_hint = "mse_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        diff = x - target
        return diff * diff

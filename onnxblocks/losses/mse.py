"""Mean squared error."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss


class MSELoss(Loss):
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
        diff = Value(loss_input_name) - target
        return self._reduce(diff * diff, "mse_loss")

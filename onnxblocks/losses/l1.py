"""Mean absolute error."""

from __future__ import annotations

from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss


class L1Loss(Loss):
    """Absolute error ``|input - target|``, reduced; like ``torch.nn.L1Loss``.

    Args:
        reduction: ``"mean"`` (default) or ``"sum"`` give a scalar; ``"none"`` gives
            the per-element errors, shaped like the input.

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
        return self._reduce(abs(Value(loss_input_name) - target), "l1_loss")

"""Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_ does it."""

from __future__ import annotations

import math

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value
from onnxblocks.optim import contrib_ops as contrib


def check_max_norm(max_norm: float) -> float:
    """Return ``max_norm`` as a float after checking it is a positive finite number.

    Raises:
        TypeError: if it is not a real number.
        ValueError: if it is not positive and finite.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
        raise InvalidTypeError(
            f"ClipGradNorm max_norm must be a number, not {type(max_norm).__name__} ({max_norm!r})."
        )
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise InvalidValueError(
            f"ClipGradNorm max_norm must be a positive finite number, got {max_norm}."
        )
    return float(max_norm)


class ClipGradNorm(Block):
    """Scale a sequence of gradients so that their global L2 norm is at most ``max_norm``.

    Emits ONNX Runtime's ``InplaceClipGradNorm``: with ``total = sqrt(sum ||g||^2)``
    over all gradients, every gradient is multiplied by ``min(1, max_norm / (total + 1e-6))``,
    which is what ``torch.nn.utils.clip_grad_norm_`` does.

    Args:
        max_norm: The largest global norm allowed.

    Raises:
        ValueError: if ``max_norm`` is not a positive finite number.

    Example:
        >>> optimizer = onnxblocks.optim.AdamW(clip_grad=ClipGradNorm(1.0))
    """

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.max_norm = check_max_norm(max_norm)

    def build(self, gradients_name: str) -> Value:
        """Clip the gradient sequence ``gradients_name`` and return the clipped sequence."""
        acc = self.accessor
        acc.require(gradients_name, role="gradient sequence")
        out = contrib.INPLACE_CLIP_GRAD_NORM.emit(
            [gradients_name],
            outputs=[acc.names.fresh("clip_grad_norm_output")],
            max_norm=self.max_norm,
        )
        assert isinstance(out, Value)
        return out

    def __repr__(self) -> str:
        return f"ClipGradNorm(max_norm={self.max_norm})"

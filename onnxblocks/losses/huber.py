"""Huber loss: squared error near zero, absolute error (scaled by ``delta``) beyond."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.elementwise import Clip
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import Loss, PointwiseLoss


def positive_number(owner: str, name: str, value: object, allow_zero: bool = False) -> float:
    """``value`` as a float, checked to be a real number > 0 (>= 0 with ``allow_zero``); inf is
    allowed.

    Raises:
        TypeError: if ``value`` is not a real number.
        ValueError: if it is NaN or not positive.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(
            f"{owner}: {name} must be a real number, not {type(value).__name__}: {value!r}."
        )
    number = float(value)
    if not (number >= 0 if allow_zero else number > 0):
        raise InvalidValueError(
            f"{owner}: {name} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}."
        )
    return number


def overflows(loss: Loss, like: str, number: float) -> bool:
    """True when ``number`` is infinite in the element type of ``like`` (float32 when unknown)."""
    elem = loss.accessor.elem_type(like) or TensorProto.FLOAT
    with np.errstate(over="ignore"):
        return bool(np.isinf(np.asarray(number).astype(helper.tensor_dtype_to_np_dtype(elem))))


def clipped_abs_error(
    loss: Loss, loss_input_name: str, target: str, limit: float
) -> tuple[Value, Value]:
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
            ``float("inf")`` gives ``0.5 * d**2`` everywhere, as torch (also when
            ``delta`` only overflows the input's float type, e.g. 1e5 in float16).

    Raises:
        ValueError: if ``reduction`` is unknown or ``delta`` is not positive.
        TypeError: if ``delta`` is not a real number.
    """

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self._delta = positive_number("HuberLoss", "delta", delta)

    output_hint = "huber_loss"

    def _per_element(self, x: Value, target: Value) -> Value:
        if overflows(
            self, x, self._delta
        ):  # no linear part; delta * (a - m) would be inf * 0 = NaN
            d = x - target
            return 0.5 * d * d
        a, m = clipped_abs_error(self, x, target, self._delta)
        return 0.5 * m * m + self._delta * (a - m)

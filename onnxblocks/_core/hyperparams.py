"""The one validation of optimizer hyperparameters and step counters, on every path that sets them.

A learning rate reaches ONNX Runtime from the session's setter, a checkpoint, a
web state file, the command line and a schedule; a step counter from a
checkpoint, a state file and the session. Each path calls these checks, so a
value one path refuses cannot come in through another:

* :func:`learning_rate`: a real number (not a bool or a str), finite, ``>= 0``,
  and finite as float32 (ONNX Runtime stores it as float32: ``1e40`` would become
  ``inf`` and the parameters non-finite after one step);
* :func:`beta`, :func:`eps`, :func:`weight_decay`: ``torch.optim``'s ranges
  (``0 <= beta < 1``, ``eps >= 0``, ``weight_decay >= 0``), finite;
* :func:`step`: an int (not a bool) in ``[0, MAX_STEP]``, so that the next step
  still fits in int64 and in a JavaScript number;
* :func:`count`: an int (not a bool) at least some bound (steps of a schedule, batch sizes,
  byte thresholds).

Each error names ``what`` (the argument, option or file field) and the valid range.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

#: Largest step counter accepted: the largest integer a JavaScript number holds exactly (2**53 - 1).
MAX_STEP = 2**53 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _real(value: object, what: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        raise InvalidTypeError(
            f"{what} must be a number, not {type(value).__name__} {value!r:.60}."
        )
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise InvalidValueError(f"{what} must be a finite number, got {value!r:.60}.") from None


def learning_rate(value: object, what: str = "learning_rate") -> float:
    """``value`` as a learning rate ONNX Runtime can use: finite, ``>= 0``, finite as float32.

    Raises:
        InvalidTypeError: for a value that is not a real number.
        InvalidValueError: for NaN, an infinity, a negative value or one past float32's range.
    """
    number = _real(value, what)
    if not math.isfinite(number) or number < 0:
        raise InvalidValueError(f"{what} must be a finite number >= 0, got {number!r}.")
    if number > _FLOAT32_MAX:
        raise InvalidValueError(
            f"{what} {number!r} is past float32's largest value ({_FLOAT32_MAX:.4g}); ONNX "
            "Runtime stores the "
            "learning rate as float32, where it would be infinite. Pass a smaller learning rate."
        )
    return number


def nonnegative(value: object, what: str) -> float:
    """``value`` as a finite number ``>= 0`` (``eps``, ``weight_decay``, a schedule's final rate).

    Raises:
        InvalidTypeError: for a value that is not a real number.
        InvalidValueError: for NaN, an infinity or a negative value.
    """
    number = _real(value, what)
    if not math.isfinite(number) or number < 0:
        raise InvalidValueError(f"{what} must be a finite number >= 0, got {number!r}.")
    return number


def eps(value: object, what: str = "eps") -> float:
    """``value`` as an ``eps`` (``torch.optim``: ``0 <= eps``), finite."""
    return nonnegative(value, what)


def weight_decay(value: object, what: str = "weight_decay") -> float:
    """``value`` as a ``weight_decay`` (``torch.optim``: ``0 <= weight_decay``), finite."""
    return nonnegative(value, what)


def beta(value: object, what: str) -> float:
    """``value`` as a moment's decay rate (``torch.optim``: ``0 <= beta < 1``).

    Raises:
        InvalidTypeError: for a value that is not a real number.
        InvalidValueError: for a value outside ``[0, 1)``.
    """
    number = _real(value, what)
    if not 0.0 <= number < 1.0:
        raise InvalidValueError(f"{what} must be a number in [0, 1), got {number!r}.")
    return number


def step(value: object, what: str = "step") -> int:
    """``value`` as an optimizer step counter: an int in ``[0, MAX_STEP]``.

    Raises:
        InvalidTypeError: for a value that is not an int (a bool, a float, a str).
        InvalidValueError: for a negative value or one past :data:`MAX_STEP`.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise InvalidTypeError(f"{what} must be an int, not {type(value).__name__} {value!r:.60}.")
    number = int(value)
    if not 0 <= number <= MAX_STEP:
        raise InvalidValueError(
            f"{what} must be an int in [0, {MAX_STEP}] (2**53 - 1), got {number}."
        )
    return number


def count(value: object, what: str, least: int = 0) -> int:
    """``value`` as a count: an int (not a bool) ``>= least``.

    Raises:
        InvalidValueError: for anything else, naming ``what`` and ``least``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidValueError(f"{what} must be an int >= {least}, got {value!r}.")
    return value

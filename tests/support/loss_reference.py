"""The magnitude of a loss's operands, for the floor of ``support.numerics.assert_close`` on loss values.

A loss is a reduction of per-element losses ``l_i``, each computed from operands (scores, targets, a
log-sum-exp) that may be much larger than ``l_i`` itself: a sum of terms that cancel is rounded at the
terms' magnitude, not at the result's. The scale is the loss's own reduction of ``|l_i| + operand``, where
``operand`` bounds the weighted magnitude of what each element is computed from.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def loss_scale(
    each: Any, reduction: str, operand: float, denominator: float = 1.0
) -> np.ndarray | float:
    """``|l_i| + operand`` reduced as the loss is: per element (``none``), summed, or summed / ``denominator``.

    Args:
        each: The per-element losses (the loss with ``reduction="none"``), float64.
        reduction: The loss's reduction (``mean``, ``sum``, ``none``, ``batchmean``).
        operand: A bound on ``weight * |operands|`` of one element (the largest score and target, plus
            ``log C`` for a log-sum-exp over ``C`` classes).
        denominator: What ``mean``/``batchmean`` divide the sum by (torch's: the kept labels' weights, the
            element count, the batch); 0 (every label ignored) counts as 1.
    """
    per = np.abs(np.asarray(each, dtype=np.float64)) + operand
    if reduction == "none":
        return per
    total = float(per.sum())
    if reduction == "sum":
        return total
    return total / (denominator or 1.0)


def class_operand(scores: Any, classes: int, weight: Any = None) -> float:
    """The operand bound of a class loss: ``max weight * (max |score| + log classes)``."""
    largest = float(np.max(np.abs(weight))) if weight is not None else 1.0
    return largest * (
        float(np.max(np.abs(np.asarray(scores, dtype=np.float64)))) + math.log(classes)
    )


def class_denominator(labels: Any, weight: Any = None, ignore_index: int | None = None) -> float:
    """torch's ``mean`` denominator of a class loss: the summed weights of the labels that count."""
    flat = np.asarray(labels).reshape(-1)
    if ignore_index is not None:
        flat = flat[flat != ignore_index]
    if weight is None:
        return float(flat.size)
    return float(np.sum(np.asarray(weight, dtype=np.float64)[flat]))

"""Parameter groups and hyperparameters of the optimizers in standard ops, checked as torch checks
them.

Groups are spelled as in torch, naming parameters instead of passing tensors:
``param_groups=[{"params": ["fc1.bias"], "weight_decay": 0.0}]``, or a predicate over names
(``{"params": lambda name: name.endswith("bias"), ...}``; :class:`NormBiasParams` is the usual
no-decay one). :func:`check_hyper` checks a group's hyperparameters against the algorithm's
rule (:mod:`onnxblocks.portable.rules`) and torch's ranges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)

if TYPE_CHECKING:
    from onnxblocks.portable.rules import Rule


def rule(algorithm: str) -> Rule:
    """The rule of :mod:`onnxblocks.portable.rules`, imported on first use (``import onnxblocks``
    skips onnx-ir).
    """
    import onnxblocks.ir.lazy  # noqa: F401  # first: onnx-ir's sympy loads only if computed with
    from onnxblocks.portable.rules import rule as find

    return find(algorithm)


#: A group's parameters: names, or a predicate over a parameter's name.
GroupParams = Sequence[str] | Callable[[str], bool]


class NormBiasParams:
    """The usual no-decay rule as a group predicate: biases and normalisation weights.

    A parameter is taken when its name ends in ``bias`` or it has at most one
    dimension (LayerNorm, BatchNorm, GroupNorm scales and shifts, and biases), which
    is what Hugging Face's ``Trainer`` and timm exclude from weight decay.
    """

    def __call__(self, name: str, shape: Sequence[int] | None = None) -> bool:
        """True for a bias or a normalisation weight."""
        return name.lower().endswith("bias") or (shape is not None and len(shape) <= 1)

    def __repr__(self) -> str:
        return "NormBiasParams()"


def no_decay_norm_bias(**hyper: Any) -> list[dict[str, Any]]:
    """The parameter groups of the usual fine-tuning recipe: no weight decay on biases and
    normalisation weights.

    Example:
        >>> AdamW(weight_decay=0.01, param_groups=no_decay_norm_bias())

    Args:
        hyper: More hyperparameters of the no-decay group (its ``lr`` for instance).

    Returns:
        One group, ``{"params": NormBiasParams(), "weight_decay": 0.0, **hyper}``.
    """
    return [{"params": NormBiasParams(), "weight_decay": 0.0, **hyper}]


def flag(value: Any, what: str) -> bool:
    """``value`` as a bool, refused unless it is True or False (``what`` names it)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(
            f"{what} must be True or False, not {type(value).__name__} {value!r:.60}."
        )
    return bool(value)


def check_hyper(algorithm: str, hyper: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``hyper`` checked against the algorithm's hyperparameters and torch's ranges, as plain Python
    values.

    Raises:
        UnknownNameError: for a hyperparameter the algorithm does not have.
        InvalidTypeError: for a value of the wrong kind.
        InvalidValueError: for a value out of torch's range, or ``nesterov`` without momentum or
        with dampening.
    """
    defaults = rule(algorithm).defaults
    out: dict[str, Any] = {}
    for key, value in hyper.items():
        if key not in defaults:
            raise UnknownNameError(
                f"{where}: {algorithm} has no hyperparameter {key!r}; it has {sorted(defaults)} "
                "(and lr)."
                f"{did_you_mean(key, defaults)}"
            )
        what = f"{where} {key}"
        if key == "betas":
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise InvalidValueError(f"{what} must be a pair (beta1, beta2), got {value!r:.60}.")
            out[key] = [_hyper.beta(b, f"{what}[{i}]") for i, b in enumerate(value)]
        elif isinstance(defaults[key], bool):
            out[key] = flag(value, what)
        elif key == "alpha" or key == "momentum" or key == "dampening":
            number = _hyper.nonnegative(value, what)
            if key == "alpha" and number > 1:
                raise InvalidValueError(f"{what} must be in [0, 1], got {number!r}.")
            out[key] = number
        else:
            out[key] = _hyper.nonnegative(value, what)
    merged = {**defaults, **out}
    if merged.get("nesterov") and (
        float(merged["momentum"]) <= 0 or float(merged["dampening"]) != 0
    ):
        raise InvalidValueError(
            f"{where}: nesterov momentum requires a momentum > 0 and zero dampening (as in torch)."
        )
    return out


__all__ = ["GroupParams", "NormBiasParams", "check_hyper", "flag", "no_decay_norm_bias", "rule"]

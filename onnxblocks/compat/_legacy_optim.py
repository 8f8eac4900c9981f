"""The legacy ``TrainingParameters`` optimizer attributes, mapped onto :mod:`onnxblocks.optim`'s
standard-op optimizers.

ONNX Runtime's pre-1.15 trainer took ``training_optimizer_name`` and, per weight,
``optimizer_attributes_map`` / ``optimizer_int_attributes_map`` holding the legacy
kernels' attributes. Their formulas (``orttraining/training_ops/{cpu,cuda}/optimizer``)
and how they map:

* ``SGDOptimizer``: ``w -= eta * g`` → :class:`onnxblocks.optim.SGD`.
* ``AdamOptimizer`` (``alpha`` = beta1 0.9, ``beta`` = beta2 0.999, ``lambda`` 0,
  ``epsilon`` 1e-8, ``do_bias_correction`` 1, ``weight_decay_mode`` 0):
  mode 0 adds ``lambda * w`` to the bias-corrected Adam direction before scaling by
  ``eta``, which is ``torch.optim.AdamW(weight_decay=lambda)`` (``torch.optim.Adam`` when
  ``lambda`` is 0) → :class:`onnxblocks.optim.AdamW`; mode 1 is Hugging Face's AdamW
  (bias correction folded into the step size, decay applied to the updated weight) →
  ``AdamW(mode="hf")``. Mode 0 without bias correction has no standard-op form and is refused.
* ``LambOptimizer`` (``alpha`` 0.9, ``beta`` 0.999, ``lambda`` 0, ``epsilon`` 1e-6,
  ``do_bias_correction`` 0, ``ratio_min`` -inf, ``ratio_max`` inf):
  ``d = m_hat / (sqrt(v_hat) + eps) + lambda * w``, ``w -= eta * (||w|| / ||d||) * d``
  (ratio 1 when a norm is 0) → :class:`onnxblocks.optim.Lamb`; a finite ``ratio_min`` /
  ``ratio_max`` is refused.

``max_norm_clip`` (default 1.0) clips the gradients' global norm for Adam and Lamb when
``enable_grad_norm_clip`` is on (the legacy default): ONNX Runtime divides by
``max(1, norm / max_norm)``, :class:`onnxblocks.optim.ClipGradNorm` multiplies by
``min(1, max_norm / (norm + 1e-6))`` (torch's), a relative difference of 1e-6 / norm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from onnxblocks import optim as _optim
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)

#: The legacy optimizers' float attributes and their defaults.
FLOAT_DEFAULTS: dict[str, dict[str, float]] = {
    "SGDOptimizer": {},
    "AdamOptimizer": {
        "alpha": 0.9,
        "beta": 0.999,
        "lambda": 0.0,
        "epsilon": 1e-8,
        "max_norm_clip": 1.0,
    },
    "LambOptimizer": {
        "alpha": 0.9,
        "beta": 0.999,
        "lambda": 0.0,
        "epsilon": 1e-6,
        "max_norm_clip": 1.0,
        "ratio_min": -math.inf,
        "ratio_max": math.inf,
    },
}
#: The legacy optimizers' int attributes and their defaults.
INT_DEFAULTS: dict[str, dict[str, int]] = {
    "SGDOptimizer": {},
    "AdamOptimizer": {"do_bias_correction": 1, "weight_decay_mode": 0},
    "LambOptimizer": {"do_bias_correction": 0},
}


def _attributes(
    optimizer: str,
    kind: str,
    table: Mapping[str, Any],
    weights: Sequence[str],
    defaults: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    if not isinstance(table, Mapping):
        raise InvalidTypeError(
            f"{kind} must be a dict {{weight name: {{attribute: value}}}}, not "
            f"{type(table).__name__}."
        )
    unknown = [name for name in table if name not in weights]
    if unknown:
        raise UnknownNameError(
            f"{kind} names '{unknown[0]}', which is not a trained "
            f"weight.{did_you_mean(unknown[0], list(weights))}"
        )
    out = {}
    for weight in weights:
        given = table.get(weight) or {}
        if not isinstance(given, Mapping):
            raise InvalidTypeError(
                f"{kind}['{weight}'] must be a dict of attributes, not {type(given).__name__}."
            )
        for key, value in given.items():
            if key not in defaults:
                raise UnknownNameError(
                    f"{kind}['{weight}'] sets '{key}', which {optimizer} does not have. Its "
                    "attributes: "
                    f"{sorted(defaults) or 'none'}.{did_you_mean(key, list(defaults))}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidTypeError(
                    f"{kind}['{weight}']['{key}'] must be a number, not {value!r:.40}."
                )
        out[weight] = {**defaults, **given}
    return out


def optimizer_for(
    name: str,
    weights: Sequence[str],
    float_map: Mapping[str, Any],
    int_map: Mapping[str, Any],
    clip: bool,
) -> _optim.Optimizer:
    """The standard-op optimizer that does what the legacy ``name`` with these attributes did.

    Raises:
        InvalidValueError: for an unknown optimizer name or a combination without a standard-op
        form.
        UnknownNameError: for an attribute the optimizer does not have or a weight not trained.
    """
    if name not in FLOAT_DEFAULTS:
        raise InvalidValueError(
            f"training_optimizer_name is {name!r}; the legacy trainer's optimizers are "
            f"{', '.join(sorted(FLOAT_DEFAULTS))}.{did_you_mean(str(name), list(FLOAT_DEFAULTS))}"
        )
    floats = _attributes(name, "optimizer_attributes_map", float_map, weights, FLOAT_DEFAULTS[name])
    ints = _attributes(name, "optimizer_int_attributes_map", int_map, weights, INT_DEFAULTS[name])
    if name == "SGDOptimizer":
        return _optim.SGD()
    merged = {w: {**floats[w], **ints[w]} for w in weights}
    shared = {k: v for k, v in merged[weights[0]].items() if k != "lambda"}
    for weight in weights[1:]:
        differ = sorted(k for k, v in merged[weight].items() if k != "lambda" and shared[k] != v)
        if differ:
            raise InvalidValueError(
                f"optimizer attributes {differ} of '{weight}' differ from those of "
                f"'{weights[0]}'; only 'lambda' "
                "(weight decay) may differ between weights. Give every weight the same values."
            )
    decay = {w: float(merged[w]["lambda"]) for w in weights}
    default_decay = decay[weights[0]]
    groups = [{"params": [w], "weight_decay": d} for w, d in decay.items() if d != default_decay]
    betas = (float(shared["alpha"]), float(shared["beta"]))
    eps = float(shared["epsilon"])
    clip_grad = float(shared["max_norm_clip"]) if clip else None
    bias = bool(shared["do_bias_correction"])
    if name == "LambOptimizer":
        if shared["ratio_min"] != -math.inf or shared["ratio_max"] != math.inf:
            raise InvalidValueError(
                "LambOptimizer's ratio_min/ratio_max clamp the trust ratio; onnxblocks' Lamb "
                "does not clamp it. "
                "Leave them at -inf/inf."
            )
        return _optim.Lamb(
            betas=betas,
            eps=eps,
            weight_decay=default_decay,
            bias_correction=bias,
            param_groups=groups or None,
            clip_grad=clip_grad,
        )
    mode = int(shared["weight_decay_mode"])
    if mode not in (0, 1):
        raise InvalidValueError(
            f"AdamOptimizer's weight_decay_mode is {mode}; ONNX Runtime had 0 (torch) and 1 (HF)."
        )
    if mode == 1:
        if groups:
            raise InvalidValueError(
                "weight_decay_mode=1 (Hugging Face AdamW) takes one 'lambda' for every weight."
            )
        return _optim.AdamW(bias, betas, eps, default_decay, clip_grad, mode="hf")
    if not bias:
        raise InvalidValueError(
            "AdamOptimizer with do_bias_correction=0 and weight_decay_mode=0 has no standard-op "
            "form here; use "
            "weight_decay_mode=1 (Hugging Face AdamW, which can skip the bias correction) or "
            "do_bias_correction=1."
        )
    return _optim.AdamW(True, betas, eps, default_decay, clip_grad, param_groups=groups or None)

"""``torch.optim.Adam`` and ``AdamW``: L2 or decoupled weight decay, amsgrad, maximize."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules.base import (
    Hyper,
    Rule,
    Scalars,
    compute_type,
    corrections,
    fma,
    l2_scalars,
    signed_grad,
    sqrt,
    to_type,
)


def _adam_needs(hyper: Hyper) -> tuple[str, ...]:
    return (
        ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        if hyper["amsgrad"]
        else ("exp_avg", "exp_avg_sq")
    )


def _adam_scalars(
    decoupled: bool,
) -> Callable[[Writer, Hyper, ir.Value, ir.Value, np.dtype], Scalars]:
    def scalars(w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype) -> Scalars:
        beta1, beta2 = (float(b) for b in hyper["betas"])
        ct = compute_type(hyper, dtype)
        bc1, bc2 = corrections(w, [beta1, beta2], step, ct)
        s: Scalars = {
            "step_size": to_type(w, w.op("Div", [lr, bc1]), ct, dtype),
            "bc2_sqrt": to_type(w, w.op("Sqrt", [bc2]), ct, dtype),
            "beta1c": w.scalar(1.0 - beta1, dtype),
            "beta2": w.scalar(beta2, dtype),
            "beta2c": w.scalar(1.0 - beta2, dtype),
            "eps": w.scalar(float(hyper["eps"]), dtype),
        }
        wd = float(hyper["weight_decay"])
        if decoupled and wd:
            decay = w.op("Sub", [w.scalar(1.0, ct), w.op("Mul", [lr, w.scalar(wd, ct)])])
            s["decay"] = to_type(w, decay, ct, dtype)
        elif wd:
            s.update(l2_scalars(w, hyper, dtype))
        return s

    return scalars


def adam_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    """The Adam update, for torch's rule and the training build's ``AdamWOptimizer`` kernel alike.

    The scalars choose the form: ``decay`` scales the parameter first (decoupled decay) and
    ``decay_last`` scales the result (Hugging Face's order); ``beta1`` writes the first moment as
    the kernel does (``beta1 * m1 + (1 - beta1) * g``; without it, torch's ``lerp``); ``bc2_sqrt``
    divides the root of the second moment (without it, the bias correction is folded into
    ``step_size`` and ``eps``).
    """
    if "decay" in s:
        param = w.op("Mul", [param, s["decay"]])
    g = signed_grad(w, hyper, s, param, grad)
    m1, m2 = states["exp_avg"], states["exp_avg_sq"]
    if "beta1" in s:
        exp_avg = w.op("Add", [w.op("Mul", [m1, s["beta1"]]), w.op("Mul", [g, s["beta1c"]])])
    else:  # lerp(m1, g, 1 - beta1)
        exp_avg = fma(w, w.op("Sub", [g, m1]), s["beta1c"], m1, hyper["dtype"])
    new = {
        "exp_avg": exp_avg,
        "exp_avg_sq": fma(
            w, w.op("Mul", [g, s["beta2c"]]), g, w.op("Mul", [m2, s["beta2"]]), hyper["dtype"]
        ),
    }
    second = new["exp_avg_sq"]
    if hyper.get("amsgrad"):
        second = new["max_exp_avg_sq"] = w.op("Max", [states["max_exp_avg_sq"], second])
    root = sqrt(w, second, hyper["dtype"])
    if "bc2_sqrt" in s:
        root = w.op("Div", [root, s["bc2_sqrt"]])
    denom = w.op("Add", [root, s["eps"]])
    update = w.op(
        "Div", [w.op("Mul", [new["exp_avg"], s["step_size"]]), denom]
    )  # addcdiv: (value * m1) / denom
    new_param = w.op("Sub", [param, update])
    if "decay_last" in s:
        new_param = w.op("Mul", [new_param, s["decay_last"]])
    return new_param, new


_ADAM_DEFAULTS = {
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "amsgrad": False,
    "maximize": False,
}


#: The rule of ``adam``.
ADAM = Rule(
    "adam",
    _ADAM_DEFAULTS,
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    _adam_needs,
    _adam_scalars(False),
    adam_update,
)

#: The rule of ``adamw``.
ADAMW = Rule(
    "adamw",
    {**_ADAM_DEFAULTS, "weight_decay": 1e-2},
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    _adam_needs,
    _adam_scalars(True),
    adam_update,
)

__all__ = ["ADAM", "ADAMW", "adam_update"]

"""``torch.optim.SGD``: momentum, dampening, Nesterov, L2 weight decay, maximize."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules.base import (
    Hyper,
    Rule,
    Scalars,
    compute_type,
    first_step,
    fma,
    l2_scalars,
    signed_grad,
    to_type,
)


def _sgd_needs(hyper: Hyper) -> tuple[str, ...]:
    return ("momentum_buffer",) if float(hyper["momentum"]) else ()


def _sgd_scalars(w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype) -> Scalars:
    ct = compute_type(hyper, dtype)
    s = {"neg_lr": to_type(w, w.op("Neg", [lr]), ct, dtype), **l2_scalars(w, hyper, dtype)}
    if float(hyper["momentum"]):
        s["momentum"] = w.scalar(float(hyper["momentum"]), dtype)
        s["damp"] = w.scalar(1.0 - float(hyper["dampening"]), dtype)
        s["first"] = first_step(w, step, ct)
    return s


def _sgd_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    """The SGD update, for torch's rule and the training build's ``SGDOptimizerV2`` kernel alike:
    the kernel's scalars give ``lr`` (``p - lr * g``), torch's ``neg_lr`` (``p + g * -lr``, one
    rounding with ``exact``).
    """
    d_p = signed_grad(w, hyper, s, param, grad)
    new: Scalars = {}
    if "momentum" in s:
        later = fma(
            w,
            d_p,
            s["damp"],
            w.op("Mul", [states["momentum_buffer"], s["momentum"]]),
            hyper["dtype"],
        )
        buf = new["momentum_buffer"] = w.op("Where", [s["first"], d_p, later])
        d_p = fma(w, buf, s["momentum"], d_p, hyper["dtype"]) if hyper["nesterov"] else buf
    if "lr" in s:  # the training build's SGDOptimizerV2: p - lr * g
        return w.op("Sub", [param, w.op("Mul", [s["lr"], d_p])]), new
    return fma(w, d_p, s["neg_lr"], param, hyper["dtype"]), new


#: The rule of ``sgd``.
SGD = Rule(
    "sgd",
    {
        "momentum": 0.0,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "maximize": False,
    },
    ("momentum_buffer",),
    _sgd_needs,
    _sgd_scalars,
    _sgd_update,
)

__all__ = ["SGD"]

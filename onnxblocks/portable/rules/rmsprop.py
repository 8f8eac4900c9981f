"""``torch.optim.RMSprop``: momentum, centered, L2 weight decay."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules.base import (
    Hyper,
    Rule,
    Scalars,
    compute_type,
    fma,
    l2_scalars,
    signed_grad,
    sqrt,
    to_type,
)


def _rmsprop_needs(hyper: Hyper) -> tuple[str, ...]:
    return (
        "square_avg",
        *(("momentum_buffer",) if float(hyper["momentum"]) else ()),
        *(("grad_avg",) if hyper["centered"] else ()),
    )


def _rmsprop_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    alpha = float(hyper["alpha"])
    ct = compute_type(hyper, dtype)
    s = {
        "alpha": w.scalar(alpha, dtype),
        "alphac": w.scalar(1.0 - alpha, dtype),
        "eps": w.scalar(float(hyper["eps"]), dtype),
        **l2_scalars(w, hyper, dtype),
    }
    if float(hyper["momentum"]):
        s["momentum"] = w.scalar(float(hyper["momentum"]), dtype)
        s["neg_lr"] = to_type(w, w.op("Neg", [lr]), ct, dtype)
    else:
        s["lr"] = to_type(w, lr, ct, dtype)
    return s


def _rmsprop_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    g = signed_grad(w, hyper, s, param, grad)
    like = hyper["dtype"]
    sq = fma(
        w, w.op("Mul", [g, s["alphac"]]), g, w.op("Mul", [states["square_avg"], s["alpha"]]), like
    )
    new = {"square_avg": sq}
    if hyper["centered"]:
        ga = states["grad_avg"]
        ga = new["grad_avg"] = fma(w, w.op("Sub", [g, ga]), s["alphac"], ga, like)
        avg = sqrt(w, fma(w, w.op("Neg", [ga]), ga, sq, like), like)
    else:
        avg = sqrt(w, sq, like)
    avg = w.op("Add", [avg, s["eps"]])
    if "momentum" in s:
        buf = w.op(
            "Add", [w.op("Mul", [states["momentum_buffer"], s["momentum"]]), w.op("Div", [g, avg])]
        )
        new["momentum_buffer"] = buf
        return fma(w, buf, s["neg_lr"], param, like), new
    return w.op("Sub", [param, w.op("Div", [w.op("Mul", [g, s["lr"]]), avg])]), new


#: The rule of ``rmsprop``.
RMSPROP = Rule(
    "rmsprop",
    {
        "alpha": 0.99,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "momentum": 0.0,
        "centered": False,
        "maximize": False,
    },
    ("square_avg", "momentum_buffer", "grad_avg"),
    _rmsprop_needs,
    _rmsprop_scalars,
    _rmsprop_update,
)

__all__ = ["RMSPROP"]

"""LAMB (You et al., 2019): Adam's direction plus decay, scaled by the trust ratio."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules.base import (
    Hyper,
    Rule,
    Scalars,
    compute_type,
    corrections,
    sqrt,
    to_type,
)


def _lamb_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    beta1, beta2 = (float(b) for b in hyper["betas"])
    ct = compute_type(hyper, dtype)
    s: Scalars = {
        "lr": to_type(w, lr, ct, dtype),
        "beta1": w.scalar(beta1, dtype),
        "beta1c": w.scalar(1.0 - beta1, dtype),
        "beta2": w.scalar(beta2, dtype),
        "beta2c": w.scalar(1.0 - beta2, dtype),
        "eps": w.scalar(float(hyper["eps"]), dtype),
        "zero": w.scalar(0.0, dtype),
        "one": w.scalar(1.0, dtype),
    }
    if float(hyper["weight_decay"]):
        s["wd"] = w.scalar(float(hyper["weight_decay"]), dtype)
    if hyper["bias_correction"]:
        c1, c2 = corrections(w, [beta1, beta2], step, ct)
        s["c1"], s["c2"] = to_type(w, c1, ct, dtype), to_type(w, c2, ct, dtype)
    return s


def _lamb_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    """LAMB (You et al., 2019, Algorithm 2): Adam's direction plus decay, times the trust ratio
    ``||w|| / ||u||``.
    """
    g = w.op("Neg", [grad]) if hyper["maximize"] else grad
    m1 = w.op("Add", [w.op("Mul", [states["exp_avg"], s["beta1"]]), w.op("Mul", [g, s["beta1c"]])])
    m2 = w.op(
        "Add",
        [
            w.op("Mul", [states["exp_avg_sq"], s["beta2"]]),
            w.op("Mul", [w.op("Mul", [g, g]), s["beta2c"]]),
        ],
    )
    m1_hat = w.op("Div", [m1, s["c1"]]) if "c1" in s else m1
    m2_hat = w.op("Div", [m2, s["c2"]]) if "c2" in s else m2
    u = w.op("Div", [m1_hat, w.op("Add", [sqrt(w, m2_hat, hyper["dtype"]), s["eps"]])])
    if "wd" in s:
        u = w.op("Add", [u, w.op("Mul", [param, s["wd"]])])
    w_norm = w.op("Sqrt", [w.reduce("ReduceSumSquare", param, None, keepdims=0)])
    u_norm = w.op("Sqrt", [w.reduce("ReduceSumSquare", u, None, keepdims=0)])
    both = w.op("And", [w.op("Greater", [w_norm, s["zero"]]), w.op("Greater", [u_norm, s["zero"]])])
    ratio = w.op("Where", [both, w.op("Div", [w_norm, u_norm]), s["one"]])
    step = w.op("Mul", [u, w.op("Mul", [ratio, s["lr"]])])
    return w.op("Sub", [param, step]), {"exp_avg": m1, "exp_avg_sq": m2}


#: The rule of ``lamb``.
LAMB = Rule(
    "lamb",
    {
        "betas": (0.9, 0.999),
        "eps": 1e-6,
        "weight_decay": 0.0,
        "bias_correction": True,
        "maximize": False,
    },
    ("exp_avg", "exp_avg_sq"),
    lambda hyper: ("exp_avg", "exp_avg_sq"),
    _lamb_scalars,
    _lamb_update,
    elementwise=False,
)

__all__ = ["LAMB"]

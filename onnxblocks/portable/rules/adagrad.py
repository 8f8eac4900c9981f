"""``torch.optim.Adagrad``: learning-rate decay, initial accumulator, L2 weight decay."""

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
    sqrt,
    to_type,
)


def _adagrad_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    ct = compute_type(hyper, dtype)
    one = w.scalar(1.0, ct)
    decay = w.op("Mul", [w.op("Sub", [step, one]), w.scalar(float(hyper["lr_decay"]), ct)])
    return {
        "clr": to_type(w, w.op("Div", [lr, w.op("Add", [one, decay])]), ct, dtype),
        "initial": w.scalar(float(hyper["initial_accumulator_value"]), dtype),
        "eps": w.scalar(float(hyper["eps"]), dtype),
        "first": first_step(w, step, ct),
        **l2_scalars(w, hyper, dtype),
    }


def _adagrad_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    g = signed_grad(w, hyper, s, param, grad)
    before = w.op("Where", [s["first"], s["initial"], states["sum"]])
    total = fma(w, g, g, before, hyper["dtype"])
    std = w.op("Add", [sqrt(w, total, hyper["dtype"]), s["eps"]])
    return w.op("Sub", [param, w.op("Div", [w.op("Mul", [g, s["clr"]]), std])]), {"sum": total}


#: The rule of ``adagrad``.
ADAGRAD = Rule(
    "adagrad",
    {
        "lr_decay": 0.0,
        "weight_decay": 0.0,
        "initial_accumulator_value": 0.0,
        "eps": 1e-10,
        "maximize": False,
    },
    ("sum",),
    lambda hyper: ("sum",),
    _adagrad_scalars,
    _adagrad_update,
)

__all__ = ["ADAGRAD"]

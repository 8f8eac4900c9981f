"""The training build's update kernels as rules: ``AdamWOptimizer`` (torch and Hugging Face modes)
and ``SGDOptimizerV2``, with their rounding.

What an optimizer of :mod:`onnxblocks.optim` that emits these ops does, written in standard ops
for portable artifacts (matched to the kernels at rtol 1e-6). The update is the one of the
torch rules (:func:`~onnxblocks.portable.rules.adam.adam_update`, SGD's); this module maps the
kernels' attributes to its per-step scalars. A group's hyperparameters are the
``AdamWOptimizer`` attributes (``alpha``, ``beta``, ``epsilon``, ``weight_decay``,
``correct_bias``, ``adam_mode``); the kernel holds them as float32. The moments as the CPU kernel
writes them (``beta * m + (1 - beta) * g``, ``((1 - beta) * g) * g``); the decay and the bias
corrections folded into per-step scalars (``w * (1 - lr * wd)``,
``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``, ``eps * sqrt(1 - beta2**t)``), so that each
parameter costs 13 passes over memory (12 without decay): ONNX Runtime runs no elementwise fusion
on CPU, so the count is what costs. The folding moves the result by about an ulp of the update.
The scalars are float32 throughout; the bias corrections come from
:mod:`~onnxblocks.portable.bias_correction`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxblocks._core.contrib_ops import ADAMW_OPTIMIZER
from onnxblocks.portable.bias_correction import bias_corrections
from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules.adam import adam_update
from onnxblocks.portable.rules.base import Hyper, Rule, Scalars
from onnxblocks.portable.rules.sgd import SGD

#: The ``AdamWOptimizer`` attributes' declared defaults.
ADAMW_ATTRIBUTES = {a.name: a.default for a in ADAMW_OPTIMIZER.attributes}


def _f32(value: float) -> float:
    """``value`` rounded to float32 (what the kernels' float attributes hold), as a Python float."""
    return float(np.float32(value))


def _adamw_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    f32 = np.float32
    alpha, beta = _f32(float(hyper["alpha"])), _f32(float(hyper["beta"]))
    s: Scalars = {
        "beta1": w.scalar(alpha, f32),
        "beta1c": w.scalar(_f32(1.0 - alpha), f32),
        "beta2": w.scalar(beta, f32),
        "beta2c": w.scalar(_f32(1.0 - beta), f32),
    }
    eps = w.scalar(float(hyper["epsilon"]), f32)
    torch_mode = int(hyper["adam_mode"]) == 0
    decay_rate = float(hyper["weight_decay"])
    if decay_rate:  # torch: decay first; Hugging Face: decay last
        decay_step = w.op("Mul", [lr, w.scalar(decay_rate, f32)])
        s["decay" if torch_mode else "decay_last"] = w.op("Sub", [w.scalar(1.0, f32), decay_step])
    if not int(hyper["correct_bias"]):
        s["step_size"], s["eps"] = lr, eps
        return s
    # the kernel rounds its attributes to float32, then takes the power
    alpha_c, beta_c = bias_corrections(w, [alpha, beta], step)
    root_beta_c = w.op("Sqrt", [beta_c])
    s["step_size"] = w.op("Mul", [lr, w.op("Div", [root_beta_c, alpha_c])])
    # torch mode: sqrt(m2 / c2) + eps, scaled by sqrt(c2); Hugging Face mode: eps outside
    s["eps"] = w.op("Mul", [eps, root_beta_c]) if torch_mode else eps
    return s


def _sgd_scalars(w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype) -> Scalars:
    return {"lr": lr}


#: ``AdamWOptimizer``: two moments per parameter.
ORT_ADAMW = Rule(
    "adamw",
    ADAMW_ATTRIBUTES,
    ("exp_avg", "exp_avg_sq"),
    lambda hyper: ("exp_avg", "exp_avg_sq"),
    _adamw_scalars,
    adam_update,
)

#: ``SGDOptimizerV2``: no state is read or written, but ONNX Runtime's training API keeps one
#: moment of zeros per parameter (``first_order_moments``).
ORT_SGD = Rule("sgd", {}, (), lambda hyper: (), _sgd_scalars, SGD.update, state_inputs=1)

__all__ = ["ADAMW_ATTRIBUTES", "ORT_ADAMW", "ORT_SGD"]

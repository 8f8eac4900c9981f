"""Optimizer update rules in standard ops: ``torch.optim``'s SGD, Adam, AdamW, Adagrad and RMSprop.

Each algorithm is an elementwise update rule plus a declaration of its
per-parameter state, so a layout (one tensor per parameter, or parameters
flattened together) applies it unchanged:

* :class:`Rule` ``states(hyper)``: the state tensors a group with hyperparameters
  ``hyper`` keeps per parameter (``torch.optim``'s state names, in a fixed order);
  each starts at zeros, and a rule whose torch state starts elsewhere (SGD's momentum
  buffer is the first gradient, Adagrad's sum is ``initial_accumulator_value``)
  reads it through ``step == 1``, so a checkpoint's zeros are the initial state;
* ``scalars(w, hyper, lr, step)``: the per-step scalars of one group (computed in
  double from the float ``lr`` and int64 ``step``, then rounded to the parameters'
  type once, as torch's Python-float scalars are);
* ``update(w, hyper, scalars, param, grad, states)``: the new parameter and the new
  value of each state (a dict keyed by state name), written with standard ops.

The numbers follow ``torch.optim``'s single-tensor implementations (torch 2.13):
the same operations in the same order on the parameters' element type
(``addcmul(t, a, b, value=c)`` as ``t + (c * a) * b``, ``addcdiv`` as ``t + (c * a) / b``,
``lerp(a, b, w)`` as ``a + w * (b - a)``), so float32 rounding follows torch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.portable.bias_correction import bias_corrections
from onnxblocks.portable.context import Writer

#: Hyperparameters of one group: numbers, bools and (for ``betas``) a pair.
Hyper = Mapping[str, Any]
Scalars = dict[str, ir.Value]


@dataclass(frozen=True)
class Rule:
    """One algorithm: its torch defaults, its state slots, its per-group scalars and its elementwise
    update.

    Attributes:
        name: The algorithm (``"sgd"``, ``"adam"``, ``"adamw"``, ``"adagrad"``, ``"rmsprop"``).
        defaults: The hyperparameters and ``torch.optim``'s defaults (``lr`` apart).
        slots: Every state a group may keep, in their fixed order.
        needs: Which slots a group with given hyperparameters keeps.
        scalars: ``(w, hyper, lr, step, dtype) -> scalars`` (``lr``, ``step``: double scalars).
        update: ``(w, hyper, scalars, param, grad, states) -> (param, states)``; ``hyper["dtype"]``
        is the
            parameters' numpy type for torch-exact rounding (:func:`fma`, :func:`sqrt`), None for
            float32 ops.
    """

    name: str
    defaults: Mapping[str, Any]
    slots: tuple[str, ...]
    needs: Callable[[Hyper], tuple[str, ...]]
    scalars: Callable[[Writer, Hyper, ir.Value, ir.Value, np.dtype], Scalars]
    update: Callable[
        [Writer, Hyper, Scalars, ir.Value, ir.Value, dict[str, ir.Value]], tuple[ir.Value, Scalars]
    ]
    #: False for a rule that reads whole-tensor norms (Lamb): layouts apply it per tensor, never
    #: flattened.
    elementwise: bool = True

    def states(self, groups: Sequence[Hyper]) -> tuple[str, ...]:
        """The slots any of ``groups`` keeps, in the rule's order (the layout's per-parameter
        state).
        """
        wanted = {s for g in groups for s in self.needs(g)}
        return tuple(s for s in self.slots if s in wanted)


def _cast(w: Writer, x: ir.Value, dtype: np.dtype) -> ir.Value:
    return w.cast(x, ir.DataType.from_numpy(dtype))


def compute_type(hyper: Hyper, dtype: np.dtype) -> np.dtype:
    """The type a group's scalars are computed in: double for torch's rounding (``exact``) or
    float64 parameters, else float32 (no float64 in the graph).
    """
    exact = hyper.get("dtype") is not None
    return np.dtype(np.float64 if exact or np.dtype(dtype) == np.float64 else np.float32)


def _to(w: Writer, x: ir.Value, compute: np.dtype, dtype: np.dtype) -> ir.Value:
    """A scalar computed in ``compute`` as the parameters' ``dtype`` (no node when they agree)."""
    return x if np.dtype(compute) == np.dtype(dtype) else _cast(w, x, dtype)


def corrections(
    w: Writer, betas: Sequence[float], step: ir.Value, compute: np.dtype
) -> list[ir.Value]:
    """``1 - beta**step`` for each beta, in ``compute``: in double as torch computes it, else in
    float32 (:func:`~onnxblocks.portable.bias_correction.bias_corrections`).
    """
    if np.dtype(compute) == np.float64:
        one = w.scalar(1.0, np.float64)
        return [w.op("Sub", [one, w.op("Pow", [w.scalar(b, np.float64), step])]) for b in betas]
    return bias_corrections(w, betas, step)


def fma(w: Writer, a: ir.Value, b: ir.Value, c: ir.Value, dtype: np.dtype | None) -> ir.Value:
    """``a * b + c`` rounded once, as torch's CPU kernels compute ``add(alpha=)``, ``addcmul`` and
    ``lerp``.

    The compiler fuses them into one fused multiply-add; ONNX has none, so the
    product and sum are taken in double (the product of two floats is exact there)
    and rounded back to ``dtype`` (the parameters' type). ``dtype=None`` (an optimizer built with
    ``exact=False``) takes both in the operands' type: two roundings, three fewer passes over
    memory.
    """
    if dtype is None or np.dtype(dtype) == np.float64:
        return w.op("Add", [w.op("Mul", [a, b]), c])
    up = [w.cast(x, ir.DataType.DOUBLE) for x in (a, b, c)]
    return _cast(w, w.op("Add", [w.op("Mul", up[:2]), up[2]]), np.dtype(dtype))


def sqrt(w: Writer, x: ir.Value, dtype: np.dtype | None) -> ir.Value:
    """``sqrt(x)`` correctly rounded, as torch's CPU kernel takes it.

    ONNX Runtime's vectorised float ``Sqrt`` may be off by an ulp, so it is taken
    in double and rounded back to ``dtype`` (``None``: ONNX Runtime's ``Sqrt`` as it is).
    """
    if dtype is None or np.dtype(dtype) == np.float64:
        return w.op("Sqrt", [x])
    return _cast(w, w.op("Sqrt", [w.cast(x, ir.DataType.DOUBLE)]), np.dtype(dtype))


def _first_step(w: Writer, step: ir.Value, compute: np.dtype) -> ir.Value:
    """A bool scalar: ``step == 1`` (the state's torch initialisation happens now)."""
    return w.op("Equal", [step, w.scalar(1.0, compute)])


def _signed_grad(w: Writer, hyper: Hyper, s: Scalars, param: ir.Value, grad: ir.Value) -> ir.Value:
    """``-grad`` if maximizing, plus ``weight_decay * param`` (L2 decay, not decoupled)."""
    if hyper.get("maximize"):
        grad = w.op("Neg", [grad])
    if "l2" in s:
        grad = fma(w, param, s["l2"], grad, hyper["dtype"])  # grad.add(param, alpha=weight_decay)
    return grad


def _l2(w: Writer, hyper: Hyper, dtype: np.dtype) -> Scalars:
    wd = float(hyper.get("weight_decay", 0.0))
    return {"l2": w.scalar(wd, dtype)} if wd else {}


# --------------------------------------------------------------------------- SGD


def _sgd_needs(hyper: Hyper) -> tuple[str, ...]:
    return ("momentum_buffer",) if float(hyper["momentum"]) else ()


def _sgd_scalars(w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype) -> Scalars:
    ct = compute_type(hyper, dtype)
    s = {"neg_lr": _to(w, w.op("Neg", [lr]), ct, dtype), **_l2(w, hyper, dtype)}
    if float(hyper["momentum"]):
        s["momentum"] = w.scalar(float(hyper["momentum"]), dtype)
        s["damp"] = w.scalar(1.0 - float(hyper["dampening"]), dtype)
        s["first"] = _first_step(w, step, ct)
    return s


def _sgd_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    d_p = _signed_grad(w, hyper, s, param, grad)
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
    return fma(w, d_p, s["neg_lr"], param, hyper["dtype"]), new


# --------------------------------------------------------------------------- Adam, AdamW


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
            "step_size": _to(w, w.op("Div", [lr, bc1]), ct, dtype),
            "bc2_sqrt": _to(w, w.op("Sqrt", [bc2]), ct, dtype),
            "beta1c": w.scalar(1.0 - beta1, dtype),
            "beta2": w.scalar(beta2, dtype),
            "beta2c": w.scalar(1.0 - beta2, dtype),
            "eps": w.scalar(float(hyper["eps"]), dtype),
        }
        wd = float(hyper["weight_decay"])
        if decoupled and wd:
            decay = w.op("Sub", [w.scalar(1.0, ct), w.op("Mul", [lr, w.scalar(wd, ct)])])
            s["decay"] = _to(w, decay, ct, dtype)
        elif wd:
            s.update(_l2(w, hyper, dtype))
        return s

    return scalars


def _adam_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    if "decay" in s:
        param = w.op("Mul", [param, s["decay"]])
    g = _signed_grad(w, hyper, s, param, grad)
    m1, m2 = states["exp_avg"], states["exp_avg_sq"]
    new = {
        "exp_avg": fma(
            w, w.op("Sub", [g, m1]), s["beta1c"], m1, hyper["dtype"]
        ),  # lerp(m1, g, 1 - beta1)
        "exp_avg_sq": fma(
            w, w.op("Mul", [g, s["beta2c"]]), g, w.op("Mul", [m2, s["beta2"]]), hyper["dtype"]
        ),
    }
    second = new["exp_avg_sq"]
    if hyper["amsgrad"]:
        second = new["max_exp_avg_sq"] = w.op("Max", [states["max_exp_avg_sq"], second])
    denom = w.op("Add", [w.op("Div", [sqrt(w, second, hyper["dtype"]), s["bc2_sqrt"]]), s["eps"]])
    update = w.op(
        "Div", [w.op("Mul", [new["exp_avg"], s["step_size"]]), denom]
    )  # addcdiv: (value * m1) / denom
    return w.op("Sub", [param, update]), new


# --------------------------------------------------------------------------- Adagrad


def _adagrad_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    ct = compute_type(hyper, dtype)
    one = w.scalar(1.0, ct)
    decay = w.op("Mul", [w.op("Sub", [step, one]), w.scalar(float(hyper["lr_decay"]), ct)])
    return {
        "clr": _to(w, w.op("Div", [lr, w.op("Add", [one, decay])]), ct, dtype),
        "initial": w.scalar(float(hyper["initial_accumulator_value"]), dtype),
        "eps": w.scalar(float(hyper["eps"]), dtype),
        "first": _first_step(w, step, ct),
        **_l2(w, hyper, dtype),
    }


def _adagrad_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    g = _signed_grad(w, hyper, s, param, grad)
    before = w.op("Where", [s["first"], s["initial"], states["sum"]])
    total = fma(w, g, g, before, hyper["dtype"])
    std = w.op("Add", [sqrt(w, total, hyper["dtype"]), s["eps"]])
    return w.op("Sub", [param, w.op("Div", [w.op("Mul", [g, s["clr"]]), std])]), {"sum": total}


# --------------------------------------------------------------------------- RMSprop


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
        **_l2(w, hyper, dtype),
    }
    if float(hyper["momentum"]):
        s["momentum"] = w.scalar(float(hyper["momentum"]), dtype)
        s["neg_lr"] = _to(w, w.op("Neg", [lr]), ct, dtype)
    else:
        s["lr"] = _to(w, lr, ct, dtype)
    return s


def _rmsprop_update(
    w: Writer,
    hyper: Hyper,
    s: Scalars,
    param: ir.Value,
    grad: ir.Value,
    states: dict[str, ir.Value],
) -> tuple[ir.Value, Scalars]:
    g = _signed_grad(w, hyper, s, param, grad)
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


# --------------------------------------------------------------------------- Lamb


def _lamb_scalars(
    w: Writer, hyper: Hyper, lr: ir.Value, step: ir.Value, dtype: np.dtype
) -> Scalars:
    beta1, beta2 = (float(b) for b in hyper["betas"])
    ct = compute_type(hyper, dtype)
    s: Scalars = {
        "lr": _to(w, lr, ct, dtype),
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
        s["c1"], s["c2"] = _to(w, c1, ct, dtype), _to(w, c2, ct, dtype)
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


_ADAM_DEFAULTS = {
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "amsgrad": False,
    "maximize": False,
}

#: The algorithms, by name.
RULES: dict[str, Rule] = {
    "sgd": Rule(
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
    ),
    "adam": Rule(
        "adam",
        _ADAM_DEFAULTS,
        ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        _adam_needs,
        _adam_scalars(False),
        _adam_update,
    ),
    "adamw": Rule(
        "adamw",
        {**_ADAM_DEFAULTS, "weight_decay": 1e-2},
        ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
        _adam_needs,
        _adam_scalars(True),
        _adam_update,
    ),
    "lamb": Rule(
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
    ),
    "adagrad": Rule(
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
    ),
    "rmsprop": Rule(
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
    ),
}


def rule(name: str) -> Rule:
    """The rule of algorithm ``name``.

    Raises:
        InvalidValueError: for an unknown algorithm.
    """
    if name not in RULES:
        raise InvalidValueError(
            f"Unknown optimizer algorithm {name!r}; the portable rules are {sorted(RULES)}."
        )
    return RULES[name]


__all__ = ["RULES", "Hyper", "Rule", "Scalars", "rule"]

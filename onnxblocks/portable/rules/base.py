"""What an optimizer update rule is, and the arithmetic the rules share (torch's rounding).

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
  type once, as torch's Python-float scalars are; in float32 with ``exact=False``);
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

from onnxblocks.portable.bias_correction import bias_corrections
from onnxblocks.portable.lowering_context import Writer

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
        scalars: ``(w, hyper, lr, step, dtype) -> scalars`` (``lr``, ``step``: scalars of
            :func:`compute_type`: double for torch's rounding, else float32).
        update: ``(w, hyper, scalars, param, grad, states) -> (param, states)``;
            ``hyper["dtype"]`` is the parameters' numpy type for torch-exact rounding
            (:func:`fma`, :func:`sqrt`), None for float32 ops.
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
    #: The fewest state sequences the sequence model declares (ONNX Runtime's training API asks
    #: ``SGDOptimizerV2`` models for ``first_order_moments``, which nothing reads).
    state_inputs: int = 0

    def states(self, groups: Sequence[Hyper]) -> tuple[str, ...]:
        """The slots any of ``groups`` keeps, in the rule's order (the layout's per-parameter
        state).
        """
        wanted = {s for g in groups for s in self.needs(g)}
        return tuple(s for s in self.slots if s in wanted)


def cast(w: Writer, x: ir.Value, dtype: np.dtype) -> ir.Value:
    """``x`` cast to the numpy type ``dtype``."""
    return w.cast(x, ir.DataType.from_numpy(dtype))


def compute_type(hyper: Hyper, dtype: np.dtype) -> np.dtype:
    """The type a group's scalars are computed in: double for torch's rounding (``exact``) or
    float64 parameters, else float32 (no float64 in the graph).
    """
    exact = hyper.get("dtype") is not None
    return np.dtype(np.float64 if exact or np.dtype(dtype) == np.float64 else np.float32)


def to_type(w: Writer, x: ir.Value, compute: np.dtype, dtype: np.dtype) -> ir.Value:
    """A scalar computed in ``compute`` as the parameters' ``dtype`` (no node when they agree)."""
    return x if np.dtype(compute) == np.dtype(dtype) else cast(w, x, dtype)


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
    return cast(w, w.op("Add", [w.op("Mul", up[:2]), up[2]]), np.dtype(dtype))


def sqrt(w: Writer, x: ir.Value, dtype: np.dtype | None) -> ir.Value:
    """``sqrt(x)`` correctly rounded, as torch's CPU kernel takes it.

    ONNX Runtime's vectorised float ``Sqrt`` may be off by an ulp, so it is taken
    in double and rounded back to ``dtype`` (``None``: ONNX Runtime's ``Sqrt`` as it is).
    """
    if dtype is None or np.dtype(dtype) == np.float64:
        return w.op("Sqrt", [x])
    return cast(w, w.op("Sqrt", [w.cast(x, ir.DataType.DOUBLE)]), np.dtype(dtype))


def first_step(w: Writer, step: ir.Value, compute: np.dtype) -> ir.Value:
    """A bool scalar: ``step == 1`` (the state's torch initialisation happens now)."""
    return w.op("Equal", [step, w.scalar(1.0, compute)])


def signed_grad(w: Writer, hyper: Hyper, s: Scalars, param: ir.Value, grad: ir.Value) -> ir.Value:
    """``-grad`` if maximizing, plus ``weight_decay * param`` (L2 decay, not decoupled)."""
    if hyper.get("maximize"):
        grad = w.op("Neg", [grad])
    if "l2" in s:
        grad = fma(w, param, s["l2"], grad, hyper["dtype"])  # grad.add(param, alpha=weight_decay)
    return grad


def l2_scalars(w: Writer, hyper: Hyper, dtype: np.dtype) -> Scalars:
    """``{"l2": weight_decay}`` for a group with L2 weight decay, else nothing."""
    wd = float(hyper.get("weight_decay", 0.0))
    return {"l2": w.scalar(wd, dtype)} if wd else {}


__all__ = [
    "Hyper",
    "Rule",
    "Scalars",
    "cast",
    "compute_type",
    "corrections",
    "first_step",
    "fma",
    "l2_scalars",
    "signed_grad",
    "sqrt",
    "to_type",
]

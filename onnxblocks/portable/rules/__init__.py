"""Optimizer update rules in standard ops: ``torch.optim``'s SGD, Adam, AdamW, Adagrad, RMSprop,
Lamb, and the training build's ``AdamWOptimizer`` / ``SGDOptimizerV2`` kernels.

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

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.portable.rules.adagrad import ADAGRAD
from onnxblocks.portable.rules.adam import ADAM, ADAMW
from onnxblocks.portable.rules.base import Hyper, Rule, Scalars, compute_type, fma, sqrt
from onnxblocks.portable.rules.lamb import LAMB
from onnxblocks.portable.rules.onnxruntime import ORT_ADAMW, ORT_SGD
from onnxblocks.portable.rules.rmsprop import RMSPROP
from onnxblocks.portable.rules.sgd import SGD

#: The algorithms, by name.
RULES: dict[str, Rule] = {r.name: r for r in (SGD, ADAM, ADAMW, LAMB, ADAGRAD, RMSPROP)}

#: The training build's kernels by the algorithm they run: what an optimizer of
#: :mod:`onnxblocks.optim` that emits ``AdamWOptimizer`` or ``SGDOptimizerV2`` does, with the
#: kernels' rounding.
KERNEL_RULES: dict[str, Rule] = {"adamw": ORT_ADAMW, "sgd": ORT_SGD}


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


__all__ = [
    "KERNEL_RULES",
    "RULES",
    "Hyper",
    "Rule",
    "Scalars",
    "compute_type",
    "fma",
    "rule",
    "sqrt",
]

"""Optimizers in standard ops: AdamW (torch and Hugging Face modes), SGD, gradient-norm clipping.

:func:`read_optimizer` reads what an optimizer model built by :mod:`onnxblocks.optim`
does (its ``AdamWOptimizer`` / ``SGDOptimizerV2`` node and an optional
``InplaceClipGradNorm``). :func:`adamw_update`, :func:`sgd_update` and
:func:`clip_gradients` write the same arithmetic for one tensor (or one list of
gradients) with standard ops: the moments as ONNX Runtime's CPU kernels compute them,
the bias corrections ``1 - float(pow(double(beta), step))`` as the kernel does, and the
per-step scalars folded so that each parameter costs as few passes over memory as
possible (the result moves by about an ulp of the update: rtol 1e-6 of the kernels).
They serve the portable optimizer model (:func:`portable_optimizer_model`) and the
fused step model (:mod:`onnxblocks.portable.step`).

The portable optimizer model keeps today's inputs and returns the updated
sequences ``params.out``, ``first_order_moments.out`` and ``second_order_moments.out``
(AdamW; ``params.out`` only for SGD) instead of a flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import (
    FIRST_ORDER_MOMENTS,
    GRADIENTS,
    LEARNING_RATE,
    PARAMS,
    SECOND_ORDER_MOMENTS,
    STEP,
    updated_name,
)
from onnxblocks._core.contrib import ADAMW_OPTIMIZER, INPLACE_CLIP_GRAD_NORM, SGD_OPTIMIZER_V2, Attribute
from onnxblocks._core.errors import PortabilityError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.gradient import _graph
from onnxblocks.portable.context import Writer

#: ``InplaceClipGradNorm``'s epsilon: ``coefficient = min(max_norm / (norm + 1e-6), 1)``.
CLIP_EPSILON = 1e-6


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer model does.

    Attributes:
        kind: ``"adamw"`` or ``"sgd"``.
        attributes: The ``AdamWOptimizer`` attributes (declared defaults filled in); empty for SGD.
        max_norm: The gradient-clipping norm, or None without clipping.
        elem_type: The parameters' element type.
    """

    kind: str
    attributes: dict[str, float | int | str] = field(default_factory=dict)
    max_norm: float | None = None
    elem_type: int = onnx.TensorProto.FLOAT

    @property
    def state_inputs(self) -> tuple[str, ...]:
        """The moment sequences the optimizer model reads."""
        return (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS) if self.kind == "adamw" else (FIRST_ORDER_MOMENTS,)


def read_optimizer(model: onnx.ModelProto) -> OptimizerSpec:
    """Read the optimizer of an optimizer model: an update node, optionally after a clipping node.

    Raises:
        PortabilityError: for an optimizer model of another form (a custom optimizer block).
    """
    ops = {n.op_type: n for n in model.graph.node}
    extra = [n.op_type for n in model.graph.node if n.op_type not in (*_UPDATES, INPLACE_CLIP_GRAD_NORM.op_type)]
    updates = [n for n in model.graph.node if n.op_type in _UPDATES]
    if len(updates) != 1 or extra:
        raise PortabilityError(
            f"The optimizer model holds {[n.op_type for n in model.graph.node]}; portable artifacts support the "
            "optimizers of onnxblocks.optim (AdamW, SGD, with an optional ClipGradNorm), one update node each. "
            "Use one of those, or generate non-portable artifacts (portable=False)."
        )
    update = updates[0]
    clip = ops.get(INPLACE_CLIP_GRAD_NORM.op_type)
    max_norm = None
    if clip is not None:
        max_norm = float(_attributes(clip, INPLACE_CLIP_GRAD_NORM.attributes)["max_norm"])
    params = next((i for i in model.graph.input if i.name == PARAMS), None)
    elem = params.type.sequence_type.elem_type.tensor_type.elem_type if params is not None else 0
    elem = elem or onnx.TensorProto.FLOAT
    if update.op_type == ADAMW_OPTIMIZER.op_type:
        return OptimizerSpec("adamw", _attributes(update, ADAMW_OPTIMIZER.attributes), max_norm, elem)
    return OptimizerSpec("sgd", {}, max_norm, elem)


_UPDATES = (ADAMW_OPTIMIZER.op_type, SGD_OPTIMIZER_V2.op_type)


def _attributes(node: onnx.NodeProto, declared: Sequence[Attribute]) -> dict[str, float | int | str]:
    values: dict[str, float | int | str] = {a.name: a.default for a in declared}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _f32(value: float) -> float:
    """``value`` rounded to float32 (what the kernels' float attributes hold), as a Python float."""
    return float(np.float32(value))


def clip_gradients(w: Writer, gradients: Sequence[str], max_norm: float, elem: int) -> list[str]:
    """Scale ``gradients`` by ``min(max_norm / (global L2 norm + 1e-6), 1)``."""
    squares = [w.reduce("ReduceSumSquare", g, None, keepdims=0) for g in gradients]
    total = w.op("Sqrt", [w.op("Sum", squares) if len(squares) > 1 else squares[0]])
    ratio = w.op("Div", [w.scalar(max_norm, elem), w.op("Add", [total, w.scalar(CLIP_EPSILON, elem)])])
    coefficient = w.op("Min", [ratio, w.scalar(1.0, elem)])
    return [w.op("Mul", [g, coefficient]) for g in gradients]


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 scalars AdamW shares across parameters.

    Attributes:
        decay: ``1 - lr * weight_decay`` (the decoupled decay as one product), or "" without decay.
        step_size: ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` (``lr`` without bias correction).
        epsilon: What is added to ``sqrt(m2)``: ``eps * sqrt(1 - beta2**t)`` in torch mode
            (``sqrt(m2 / c2) + eps`` scaled by ``sqrt(c2)``), ``eps`` in Hugging Face mode.
    """

    decay: str
    step_size: str
    epsilon: str


def adamw_scalars(w: Writer, spec: OptimizerSpec, learning_rate: str, step: str) -> AdamWScalars:
    """The step's scalars; bias corrections ``1 - float(pow(double(beta), step))`` as the kernel computes them."""
    a = spec.attributes
    f32 = onnx.TensorProto.FLOAT
    lr = w.reshape(learning_rate, [])
    one = w.scalar(1.0, f32)
    eps = w.scalar(float(a["epsilon"]), f32)
    decay_rate = float(a["weight_decay"])
    decay = w.op("Sub", [one, w.op("Mul", [lr, w.scalar(decay_rate, f32)])]) if decay_rate else ""
    if not int(a["correct_bias"]):
        return AdamWScalars(decay, lr, eps)
    step_d = w.cast(w.reshape(step, []), onnx.TensorProto.DOUBLE)

    def correction(beta: float) -> str:
        power = w.op("Pow", [w.const(np.float64(_f32(beta)), suffix="beta"), step_d])
        return w.op("Sub", [one, w.cast(power, f32)])

    alpha_c, root_beta_c = correction(float(a["alpha"])), w.op("Sqrt", [correction(float(a["beta"]))])
    step_size = w.op("Mul", [lr, w.op("Div", [root_beta_c, alpha_c])])
    return AdamWScalars(decay, step_size, w.op("Mul", [eps, root_beta_c]) if int(a["adam_mode"]) == 0 else eps)


def adamw_update(
    w: Writer, spec: OptimizerSpec, s: AdamWScalars, param: str, grad: str, m1: str, m2: str, outs: Sequence[str]
) -> None:
    """Write ``outs = (param, m1, m2)`` after one AdamW step (``adam_mode`` 0: torch, 1: Hugging Face).

    13 passes over the parameter's size (12 without weight decay), each a standard op:
    ONNX Runtime runs no elementwise fusion on CPU, so the count is what costs. The
    moments as the kernel writes them (``beta * m + (1 - beta) * g``, ``((1 - beta) * g) * g``);
    the decay and the bias corrections folded into scalars (``w * (1 - lr * wd)``,
    :class:`AdamWScalars`), which moves the result by about an ulp of the update.
    """
    a = spec.attributes
    f32 = onnx.TensorProto.FLOAT
    alpha, beta = _f32(float(a["alpha"])), _f32(float(a["beta"]))
    new_m1 = w.op(
        "Add", [w.op("Mul", [m1, w.scalar(alpha, f32)]), w.op("Mul", [grad, w.scalar(_f32(1.0 - alpha), f32)])], outs[1]
    )
    scaled_g = w.op("Mul", [grad, w.scalar(_f32(1.0 - beta), f32)])
    new_m2 = w.op("Add", [w.op("Mul", [m2, w.scalar(beta, f32)]), w.op("Mul", [scaled_g, grad])], outs[2])
    denom = w.op("Add", [w.op("Sqrt", [new_m2]), s.epsilon])
    update = w.op("Div", [w.op("Mul", [new_m1, s.step_size]), denom])
    if int(a["adam_mode"]) == 0:  # torch: decay first
        weight = w.op("Mul", [param, s.decay]) if s.decay else param
        w.op("Sub", [weight, update], outs[0])
    elif s.decay:  # Hugging Face: decay last
        w.op("Mul", [w.op("Sub", [param, update]), s.decay], outs[0])
    else:
        w.op("Sub", [param, update], outs[0])


def sgd_update(w: Writer, learning_rate: str, param: str, grad: str, out: str) -> None:
    """``out = param - lr * grad``."""
    w.op("Sub", [param, w.op("Mul", [w.reshape(learning_rate, []), grad])], out)


def portable_optimizer_model(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """The standard-op optimizer model for ``count`` parameters, with today's inputs and updated sequences out.

    Args:
        model: An optimizer model built by :mod:`onnxblocks.optim` (not changed).
        count: How many parameters the sequences hold (the training model's trainable parameters).

    Raises:
        PortabilityError: for an optimizer model of another form.
    """
    spec = read_optimizer(model)
    opset = max(_limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET, 13)
    names = NameAuthority(i.name for i in model.graph.input)
    w = Writer(names, opset, "optimizer")
    lr, step = LEARNING_RATE, STEP
    sequences = [PARAMS, GRADIENTS, *spec.state_inputs]
    items = {s: [w.op("SequenceAt", [s, w.const(np.int64(i))]) for i in range(count)] for s in sequences}
    grads = items[GRADIENTS]
    if spec.max_norm is not None:
        grads = clip_gradients(w, grads, spec.max_norm, spec.elem_type)
    outs = {s: [w.fresh(f"{s}.{i}") for i in range(count)] for s in (PARAMS, *spec.state_inputs)}
    if spec.kind == "adamw":
        scalars = adamw_scalars(w, spec, lr, step)
        for i in range(count):
            m1, m2 = items[FIRST_ORDER_MOMENTS][i], items[SECOND_ORDER_MOMENTS][i]
            trio = (outs[PARAMS][i], outs[FIRST_ORDER_MOMENTS][i], outs[SECOND_ORDER_MOMENTS][i])
            adamw_update(w, spec, scalars, items[PARAMS][i], grads[i], m1, m2, trio)
        produced = (PARAMS, *spec.state_inputs)
    else:
        for i in range(count):
            sgd_update(w, lr, items[PARAMS][i], grads[i], outs[PARAMS][i])
        produced = (PARAMS,)
    outputs = []
    for s in produced:
        w.op("SequenceConstruct", outs[s], updated_name(s))
        outputs.append(helper.make_tensor_sequence_value_info(updated_name(s), spec.elem_type, None))
    graph = helper.make_graph(w.nodes, "portable_optimizer", list(model.graph.input), outputs)
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxblocks")
    _limits.stamp_versions(result)
    return result


__all__ = [
    "AdamWScalars",
    "OptimizerSpec",
    "_graph",
    "adamw_scalars",
    "adamw_update",
    "clip_gradients",
    "portable_optimizer_model",
    "read_optimizer",
    "sgd_update",
]

"""Optimizers in standard ops: AdamW (torch and Hugging Face modes), SGD, gradient-norm clipping.

:func:`read_optimizer` reads what an optimizer model built by :mod:`onnxblocks.optim`
does (its ``AdamWOptimizer`` / ``SGDOptimizerV2`` node and an optional
``InplaceClipGradNorm``). :func:`adamw_update`, :func:`sgd_update` and
:func:`clip_gradients` write the same arithmetic for one tensor (or one list of
gradients) with standard ops, as IR nodes (:class:`onnxblocks.ir.writer.Writer`): the
moments as ONNX Runtime's CPU kernels compute them, the bias corrections
``1 - float(pow(double(beta), step))`` as the kernel does, and the per-step scalars
folded so that each parameter costs as few passes over memory as possible (the
result moves by about an ulp of the update: rtol 1e-6 of the kernels). They serve
the portable optimizer model (:func:`optimizer_model`) and the fused step model
(:mod:`onnxblocks.portable.step`).

The portable optimizer model (:func:`optimizer_model`, what ``optimizer_model.onnx``
holds) takes each parameter, its gradient and its moments as tensors of their own
and returns the updated ones (``<p>.out``, ``<p>.exp_avg.out``, ``<p>.exp_avg_sq.out``),
so a runtime binds them where they live, as it is written. :func:`portable_optimizer_model`
is the same update with the training build's sequence inputs, returning updated
sequences instead of a flag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import (
    FIRST_ORDER_MOMENTS,
    GRADIENTS,
    LEARNING_RATE,
    OPTIMIZER_METADATA,
    PARAMS,
    SECOND_ORDER_MOMENTS,
    STATE_SEQUENCES,
    STEP,
    gradient_name,
    moment_names,
    state_names,
    updated_name,
)
from onnxblocks._core.contrib import ADAMW_OPTIMIZER, INPLACE_CLIP_GRAD_NORM, SGD_OPTIMIZER_V2, Attribute
from onnxblocks._core.errors import PortabilityError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.serde import to_proto
from onnxblocks.portable import groups as _groups
from onnxblocks.portable import rules as _rules
from onnxblocks.portable.context import Writer

#: ``InplaceClipGradNorm``'s epsilon: ``coefficient = min(max_norm / (norm + 1e-6), 1)``.
CLIP_EPSILON = 1e-6


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer model does.

    Attributes:
        kind: ``"adamw"`` or ``"sgd"`` (the contrib ops), or a rule of :mod:`onnxblocks.portable.rules`
            when ``groups`` is set.
        attributes: The ``AdamWOptimizer`` attributes (declared defaults filled in); empty for SGD.
        max_norm: The gradient-clipping norm, or None without clipping.
        elem_type: The parameters' element type.
        groups: For an optimizer in standard ops: each parameter group's hyperparameters (the rule's
            defaults filled in) and ``lr_scale`` (its learning rate over the session's); empty for the contrib ops.
        params: The trainable parameters in the optimizer model's order, each with its group's index.
    """

    kind: str
    attributes: dict[str, float | int | str] = field(default_factory=dict)
    max_norm: float | None = None
    elem_type: int = onnx.TensorProto.FLOAT
    groups: tuple[Mapping[str, Any], ...] = ()
    params: tuple[tuple[str, int], ...] = ()

    @property
    def rule(self) -> _rules.Rule | None:
        """The standard-op rule of an optimizer with groups, or None for the contrib ops."""
        return _rules.rule(self.kind) if self.groups else None

    @property
    def states(self) -> tuple[str, ...]:
        """The rule's state tensors per parameter (torch's names), in slot order; () for the contrib ops."""
        rule = self.rule
        return rule.states([g["hyper"] for g in self.groups]) if rule is not None else ()

    @property
    def state_inputs(self) -> tuple[str, ...]:
        """The moment sequences the optimizer model reads."""
        if self.groups:
            return STATE_SEQUENCES[: len(self.states)]
        return (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS) if self.kind == "adamw" else (FIRST_ORDER_MOMENTS,)

    def to_json(self) -> str:
        """The metadata an optimizer model in standard ops carries (:data:`OPTIMIZER_METADATA`)."""
        return _groups.metadata(self.kind, self.groups, self.params, self.max_norm)

    def layout(self) -> _groups.Layout:
        """The groups' layout of a spec with groups (:func:`~onnxblocks.portable.groups.write_updates`)."""
        assert self.rule is not None, "a spec with groups"
        return _groups.Layout(self.rule, self.groups, dict(self.params), self.states, self.dtype)

    @property
    def moments(self) -> int:
        """How many moments per parameter the optimizer keeps (ONNX Runtime's SGD keeps one of zeros)."""
        return len(self.state_inputs)

    @property
    def dtype(self) -> np.dtype:
        """The parameters' numpy element type."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))


def read_optimizer(model: onnx.ModelProto) -> OptimizerSpec:
    """Read the optimizer of an optimizer model: an update node, optionally after a clipping node.

    Raises:
        PortabilityError: for an optimizer model of another form (a custom optimizer block).
    """
    params = next((i for i in model.graph.input if i.name == PARAMS), None)
    elem = params.type.sequence_type.elem_type.tensor_type.elem_type if params is not None else 0
    elem = elem or onnx.TensorProto.FLOAT
    meta = next((p.value for p in model.metadata_props if p.key == OPTIMIZER_METADATA), None)
    if meta is not None:  # an optimizer in standard ops
        algorithm, groups, order, max_norm = _groups.parse_metadata(meta)
        return OptimizerSpec(algorithm, {}, max_norm, elem, groups, order)
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


def clip_gradients(w: Writer, gradients: Sequence[ir.Value], max_norm: float, dtype: np.dtype) -> list[ir.Value]:
    """Scale ``gradients`` by ``min(max_norm / (global L2 norm + 1e-6), 1)``."""
    squares = [w.reduce("ReduceSumSquare", g, None, keepdims=0) for g in gradients]
    total = w.op("Sqrt", [w.op("Sum", squares) if len(squares) > 1 else squares[0]])
    ratio = w.op("Div", [w.scalar(max_norm, dtype), w.op("Add", [total, w.scalar(CLIP_EPSILON, dtype)])])
    coefficient = w.op("Min", [ratio, w.scalar(1.0, dtype)])
    return [w.op("Mul", [g, coefficient]) for g in gradients]


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 scalars AdamW shares across parameters.

    Attributes:
        decay: ``1 - lr * weight_decay`` (the decoupled decay as one product), or None without decay.
        step_size: ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` (``lr`` without bias correction).
        epsilon: What is added to ``sqrt(m2)``: ``eps * sqrt(1 - beta2**t)`` in torch mode
            (``sqrt(m2 / c2) + eps`` scaled by ``sqrt(c2)``), ``eps`` in Hugging Face mode.
    """

    decay: ir.Value | None
    step_size: ir.Value
    epsilon: ir.Value


def adamw_scalars(w: Writer, spec: OptimizerSpec, learning_rate: ir.Value, step: ir.Value) -> AdamWScalars:
    """The step's scalars; bias corrections ``1 - float(pow(double(beta), step))`` as the kernel computes them."""
    a = spec.attributes
    f32 = np.float32
    lr = w.reshape(learning_rate, [])
    one = w.scalar(1.0, f32)
    eps = w.scalar(float(a["epsilon"]), f32)
    decay_rate = float(a["weight_decay"])
    decay = w.op("Sub", [one, w.op("Mul", [lr, w.scalar(decay_rate, f32)])]) if decay_rate else None
    if not int(a["correct_bias"]):
        return AdamWScalars(decay, lr, eps)
    step_d = w.cast(w.reshape(step, []), ir.DataType.DOUBLE)

    def correction(beta: float) -> ir.Value:
        power = w.op("Pow", [w.const(np.float64(_f32(beta)), suffix="beta"), step_d])
        return w.op("Sub", [one, w.cast(power, ir.DataType.FLOAT)])

    alpha_c, root_beta_c = correction(float(a["alpha"])), w.op("Sqrt", [correction(float(a["beta"]))])
    step_size = w.op("Mul", [lr, w.op("Div", [root_beta_c, alpha_c])])
    return AdamWScalars(decay, step_size, w.op("Mul", [eps, root_beta_c]) if int(a["adam_mode"]) == 0 else eps)


def adamw_update(
    w: Writer,
    spec: OptimizerSpec,
    s: AdamWScalars,
    param: ir.Value,
    grad: ir.Value,
    m1: ir.Value,
    m2: ir.Value,
    outs: Sequence[str | ir.Value],
) -> list[ir.Value]:
    """Write ``outs = (param, m1, m2)`` after one AdamW step (``adam_mode`` 0: torch, 1: Hugging Face).

    13 passes over the parameter's size (12 without weight decay), each a standard op:
    ONNX Runtime runs no elementwise fusion on CPU, so the count is what costs. The
    moments as the kernel writes them (``beta * m + (1 - beta) * g``, ``((1 - beta) * g) * g``);
    the decay and the bias corrections folded into scalars (``w * (1 - lr * wd)``,
    :class:`AdamWScalars`), which moves the result by about an ulp of the update.

    Returns:
        The new parameter and moments.
    """
    a = spec.attributes
    f32 = np.float32
    alpha, beta = _f32(float(a["alpha"])), _f32(float(a["beta"]))
    new_m1 = w.op(
        "Add", [w.op("Mul", [m1, w.scalar(alpha, f32)]), w.op("Mul", [grad, w.scalar(_f32(1.0 - alpha), f32)])], outs[1]
    )
    scaled_g = w.op("Mul", [grad, w.scalar(_f32(1.0 - beta), f32)])
    new_m2 = w.op("Add", [w.op("Mul", [m2, w.scalar(beta, f32)]), w.op("Mul", [scaled_g, grad])], outs[2])
    denom = w.op("Add", [w.op("Sqrt", [new_m2]), s.epsilon])
    update = w.op("Div", [w.op("Mul", [new_m1, s.step_size]), denom])
    if int(a["adam_mode"]) == 0:  # torch: decay first
        weight = w.op("Mul", [param, s.decay]) if s.decay is not None else param
        new_p = w.op("Sub", [weight, update], outs[0])
    elif s.decay is not None:  # Hugging Face: decay last
        new_p = w.op("Mul", [w.op("Sub", [param, update]), s.decay], outs[0])
    else:
        new_p = w.op("Sub", [param, update], outs[0])
    return [new_p, new_m1, new_m2]


def sgd_update(w: Writer, learning_rate: ir.Value, param: ir.Value, grad: ir.Value, out: str | ir.Value) -> ir.Value:
    """``out = param - lr * grad``."""
    return w.op("Sub", [param, w.op("Mul", [w.reshape(learning_rate, []), grad])], out)


def _opset(model: onnx.ModelProto) -> int:
    return max(_limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET, 13)


def _input(model: onnx.ModelProto, name: str, elem: int, shape: Sequence[int]) -> ir.Value:
    """The optimizer model's graph input ``name`` as a new IR value (its declared type, else ``elem`` ``shape``)."""
    declared = next((i for i in model.graph.input if i.name == name), None)
    if declared is not None and declared.type.HasField("tensor_type"):
        return ir.serde.deserialize_value_info_proto(declared, None)
    return ir.Value(name=name, type=ir.TensorType(ir.DataType(elem)), shape=ir.Shape(list(shape)))


def _finish(inputs: list[ir.Value], outputs: list[ir.Value], w: Writer, opset: int, name: str) -> onnx.ModelProto:
    graph = ir.Graph(inputs, outputs, nodes=w.nodes, opset_imports={"": opset}, name=name)
    result = to_proto(ir.Model(graph, ir_version=8, producer_name="onnxblocks"))
    _limits.stamp_versions(result)
    return result


def optimizer_model(model: onnx.ModelProto, params: Sequence[ir.Value]) -> onnx.ModelProto:
    """The portable optimizer model: one tensor input and output per parameter, gradient and moment.

    Its signature (docs/portable.md)::

        inputs:  learning_rate, step,
                 for each p of params: p, <p>_grad, p.exp_avg, p.exp_avg_sq  (SGD: p, <p>_grad, p.exp_avg)
        outputs: for each p of params: p.out, p.exp_avg.out, p.exp_avg_sq.out  (SGD: p.out)

    SGD's ``p.exp_avg`` is read by nothing: ONNX Runtime's SGD keeps one moment of
    zeros in its checkpoints, and the runtime keeps it through this input.

    Args:
        model: An optimizer model built by :mod:`onnxblocks.optim` (not changed).
        params: The trainable parameters, in the training model's order: values whose
            names, types and shapes the inputs take (not changed).

    Raises:
        PortabilityError: for an optimizer model of another form.
    """
    spec = read_optimizer(model)
    opset = _opset(model)
    names = NameAuthority([LEARNING_RATE, STEP])
    for p in params:
        assert p.name is not None, "parameters have names"
        names.reserve(p.name)
        names.reserve(gradient_name(p.name))
        for n in (p.name, *state_names(p.name)):
            names.reserve(n)
            names.reserve(updated_name(n))
    w = Writer(names, opset, "optimizer")
    lr = _input(model, LEARNING_RATE, onnx.TensorProto.FLOAT, [1])
    step = _input(model, STEP, onnx.TensorProto.INT64, [1])
    inputs, outputs = [lr, step], []
    state: list[tuple[ir.Value, ir.Value, list[ir.Value]]] = []
    for p in params:
        assert p.name is not None

        def like(name: str, p: ir.Value = p) -> ir.Value:
            return ir.Value(name=name, type=p.type, shape=ir.Shape(p.shape) if p.shape is not None else None)

        value, grad = like(p.name), like(gradient_name(p.name))
        moments = [like(m) for m in state_names(p.name, spec.moments)]
        inputs += [value, grad, *moments]
        state.append((value, grad, moments))
    grads = [g for _, g, _ in state]
    if spec.max_norm is not None:
        grads = clip_gradients(w, grads, spec.max_norm, spec.dtype)
    if spec.rule is not None:
        items = [(v.name or "", v, g, m) for (v, _, m), g in zip(state, grads, strict=True)]
        targets = [
            [updated_name(n) for n in (v.name or "", *state_names(v.name or "", spec.moments))] for v, _, _ in state
        ]
        for (value, _, moments), new in zip(
            state, _groups.write_updates(w, spec.layout(), lr, step, items, targets), strict=True
        ):
            for out, old in zip(new, (value, *moments), strict=True):
                out.type, out.shape = old.type, old.shape
                outputs.append(out)
        return _finish(inputs, outputs, w, opset, "portable_optimizer")
    scalars = adamw_scalars(w, spec, lr, step) if spec.kind == "adamw" else None
    for (value, _, moments), grad in zip(state, grads, strict=True):
        assert value.name is not None
        if scalars is not None:
            outs = [updated_name(n) for n in (value.name, *moment_names(value.name))]
            new = adamw_update(w, spec, scalars, value, grad, moments[0], moments[1], outs)
        else:
            new = [sgd_update(w, lr, value, grad, updated_name(value.name))]
        for out, old in zip(new, (value, *moments), strict=False):
            out.type, out.shape = old.type, old.shape
            outputs.append(out)
    return _finish(inputs, outputs, w, opset, "portable_optimizer")


def portable_optimizer_model(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """The standard-op optimizer model for ``count`` parameters, with today's inputs and updated sequences out.

    The training build's optimizer inputs (tensor sequences ``params``, ``gradients``,
    moments), returning ``params.out`` and the moments' ``.out`` sequences.
    :func:`optimizer_model` is the per-tensor form portable artifacts hold.

    Args:
        model: An optimizer model built by :mod:`onnxblocks.optim` (not changed).
        count: How many parameters the sequences hold (the training model's trainable parameters).

    Raises:
        PortabilityError: for an optimizer model of another form.
    """
    spec = read_optimizer(model)
    opset = _opset(model)
    inputs = [ir.serde.deserialize_value_info_proto(i, None) for i in model.graph.input]
    by_name = {v.name: v for v in inputs}
    w = Writer(NameAuthority(v.name for v in inputs if v.name), opset, "optimizer")
    sequences = [PARAMS, GRADIENTS, *spec.state_inputs]
    items = {s: [w.op("SequenceAt", [by_name[s], w.const(np.int64(i))]) for i in range(count)] for s in sequences}
    grads = items[GRADIENTS]
    if spec.max_norm is not None:
        grads = clip_gradients(w, grads, spec.max_norm, spec.dtype)
    outs = {s: [w.fresh(f"{s}.{i}") for i in range(count)] for s in (PARAMS, *spec.state_inputs)}
    lr = by_name[LEARNING_RATE]
    if spec.rule is not None:
        names = [n for n, _ in spec.params] if len(spec.params) == count else [f"p{i}" for i in range(count)]
        rule_items = [
            (names[i], items[PARAMS][i], grads[i], [items[s][i] for s in spec.state_inputs]) for i in range(count)
        ]
        rule_outs = [[outs[s][i] for s in (PARAMS, *spec.state_inputs)] for i in range(count)]
        _groups.write_updates(w, spec.layout(), lr, by_name[STEP], rule_items, rule_outs)
        produced: tuple[str, ...] = (PARAMS, *spec.state_inputs)
    elif spec.kind == "adamw":
        scalars = adamw_scalars(w, spec, lr, by_name[STEP])
        for i in range(count):
            m1, m2 = items[FIRST_ORDER_MOMENTS][i], items[SECOND_ORDER_MOMENTS][i]
            trio = (outs[PARAMS][i], outs[FIRST_ORDER_MOMENTS][i], outs[SECOND_ORDER_MOMENTS][i])
            adamw_update(w, spec, scalars, items[PARAMS][i], grads[i], m1, m2, trio)
        produced = (PARAMS, *spec.state_inputs)
    else:
        for i in range(count):
            sgd_update(w, lr, items[PARAMS][i], grads[i], outs[PARAMS][i])
        produced = (PARAMS,)
    values = {v.name: v for n in w.nodes for v in n.outputs}
    outputs = []
    for s in produced:
        out = w.op("SequenceConstruct", [values[n] for n in outs[s]], updated_name(s))
        out.type = ir.SequenceType(ir.TensorType(ir.DataType(spec.elem_type)))
        outputs.append(out)
    return _finish(inputs, outputs, w, opset, "portable_optimizer")


__all__ = [
    "AdamWScalars",
    "OptimizerSpec",
    "adamw_scalars",
    "adamw_update",
    "clip_gradients",
    "optimizer_model",
    "portable_optimizer_model",
    "read_optimizer",
    "sgd_update",
]

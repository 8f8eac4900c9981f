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

import math
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
    state_names,
    updated_name,
)
from onnxblocks._core.contrib import ADAMW_OPTIMIZER, INPLACE_CLIP_GRAD_NORM, SGD_OPTIMIZER_V2, Attribute
from onnxblocks._core.errors import PortabilityError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.serde import to_proto
from onnxblocks.portable import groups as _groups
from onnxblocks.portable import rules as _rules
from onnxblocks.portable.context import Writer, numpy_type


class OptimizerWriter(Writer):
    """A :class:`~onnxblocks.portable.context.Writer` that writes each scalar constant once.

    Stock onnxruntime merges equal scalar initializers and removes the copies, warning
    "Removing initializer ..." for each: an optimizer graph shares its scalars instead.
    """

    def __init__(self, names: NameAuthority, opset: int, hint: str) -> None:
        super().__init__(names, opset, hint)
        self._scalars: dict[tuple[str, bytes, tuple[int, ...]], ir.Value] = {}

    def scalar(self, value: float | int, dtype: Any = np.float32, shape: Sequence[int] = ()) -> ir.Value:
        """The constant of ``dtype`` holding ``value`` (one node per distinct value, type and shape)."""
        array = np.full(tuple(shape), value, dtype=numpy_type(dtype if dtype is not None else np.float32))
        key = (array.dtype.str, array.tobytes(), tuple(array.shape))
        if key not in self._scalars:
            self._scalars[key] = super().scalar(value, dtype, shape)
        return self._scalars[key]


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
        exact: For an optimizer in standard ops: round as torch's CPU kernels (see :mod:`~onnxblocks.portable.rules`).
    """

    kind: str
    attributes: dict[str, float | int | str] = field(default_factory=dict)
    max_norm: float | None = None
    elem_type: int = onnx.TensorProto.FLOAT
    groups: tuple[Mapping[str, Any], ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    exact: bool = True

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
    def updated_states(self) -> int:
        """How many state tensors per parameter the update writes (ONNX Runtime's SGD: none)."""
        return len(self.states) if self.groups else 2 if self.kind == "adamw" else 0

    def to_json(self) -> str:
        """The metadata an optimizer model in standard ops carries (:data:`OPTIMIZER_METADATA`)."""
        return _groups.metadata(self.kind, self.groups, self.params, self.max_norm, self.exact)

    def layout(self) -> _groups.Layout:
        """The groups' layout of a spec with groups (:class:`~onnxblocks.portable.groups.GroupUpdater`)."""
        assert self.rule is not None, "a spec with groups"
        return _groups.Layout(self.rule, self.groups, dict(self.params), self.states, self.dtype, self.exact)

    @property
    def state_inputs(self) -> tuple[str, ...]:
        """The moment sequences the optimizer model reads."""
        if self.groups:
            return STATE_SEQUENCES[: len(self.states)]
        return (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS) if self.kind == "adamw" else (FIRST_ORDER_MOMENTS,)

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
        algorithm, groups, order, max_norm, exact = _groups.parse_metadata(meta)
        return OptimizerSpec(algorithm, {}, max_norm, elem, groups, order, exact)
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


def clip(w: Writer, spec: OptimizerSpec, gradients: Sequence[ir.Value], names: Sequence[str]) -> list[ir.Value]:
    """The gradients clipped by the global norm (``spec.max_norm``), then by each group's ``max_norm``, as asked."""
    grads = clip_gradients(w, gradients, spec.max_norm, spec.dtype) if spec.max_norm is not None else list(gradients)
    if not spec.groups:
        return grads
    return _groups.clip_by_group(spec.layout(), names, grads, lambda gs, m: clip_gradients(w, gs, m, spec.dtype))


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 scalars AdamW shares across parameters.

    Attributes:
        decay: ``1 - lr * weight_decay`` (the decoupled decay as one product), or None without decay.
        step_size: ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` (``lr`` without bias correction).
        epsilon: What is added to ``sqrt(m2)``: ``eps * sqrt(1 - beta2**t)`` in torch mode
            (``sqrt(m2 / c2) + eps`` scaled by ``sqrt(c2)``), ``eps`` in Hugging Face mode.
        coefficients: ``beta1, 1 - beta1, beta2, 1 - beta2`` as float32 constants, written once and shared
            by every update (None: each update writes its own).
    """

    decay: ir.Value | None
    step_size: ir.Value
    epsilon: ir.Value
    coefficients: tuple[ir.Value, ir.Value, ir.Value, ir.Value] | None = None


def adamw_scalars(w: Writer, spec: OptimizerSpec, learning_rate: ir.Value, step: ir.Value) -> AdamWScalars:
    """The step's scalars; bias corrections ``1 - float(pow(double(beta), step))`` as the kernel computes them."""
    a = spec.attributes
    f32 = np.float32
    alpha, beta = _f32(float(a["alpha"])), _f32(float(a["beta"]))
    coefficients = (
        w.scalar(alpha, f32),
        w.scalar(_f32(1.0 - alpha), f32),
        w.scalar(beta, f32),
        w.scalar(_f32(1.0 - beta), f32),
    )
    lr = w.reshape(learning_rate, [])
    eps = w.scalar(float(a["epsilon"]), f32)
    decay_rate = float(a["weight_decay"])
    one = w.scalar(1.0, f32) if decay_rate or int(a["correct_bias"]) else None  # no constant nothing reads
    decay = w.op("Sub", [one, w.op("Mul", [lr, w.scalar(decay_rate, f32)])]) if decay_rate else None
    if not int(a["correct_bias"]):
        return AdamWScalars(decay, lr, eps, coefficients)
    assert one is not None
    step_d = w.cast(w.reshape(step, []), ir.DataType.DOUBLE)

    def correction(beta: float) -> ir.Value:
        power = w.op("Pow", [w.const(np.float64(_f32(beta)), suffix="beta"), step_d])
        return w.op("Sub", [one, w.cast(power, ir.DataType.FLOAT)])

    alpha_c, root_beta_c = correction(float(a["alpha"])), w.op("Sqrt", [correction(float(a["beta"]))])
    step_size = w.op("Mul", [lr, w.op("Div", [root_beta_c, alpha_c])])
    epsilon = w.op("Mul", [eps, root_beta_c]) if int(a["adam_mode"]) == 0 else eps
    return AdamWScalars(decay, step_size, epsilon, coefficients)


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
    if s.coefficients is not None:
        alpha_c, rest_alpha, beta_c, rest_beta = s.coefficients
    else:
        alpha, beta = _f32(float(a["alpha"])), _f32(float(a["beta"]))
        alpha_c, rest_alpha = w.scalar(alpha, f32), w.scalar(_f32(1.0 - alpha), f32)
        beta_c, rest_beta = w.scalar(beta, f32), w.scalar(_f32(1.0 - beta), f32)
    new_m1 = w.op("Add", [w.op("Mul", [m1, alpha_c]), w.op("Mul", [grad, rest_alpha])], outs[1])
    scaled_g = w.op("Mul", [grad, rest_beta])
    new_m2 = w.op("Add", [w.op("Mul", [m2, beta_c]), w.op("Mul", [scaled_g, grad])], outs[2])
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


#: Parameters of at most this many elements are updated together, in flat buffers (:func:`update_parameters`).
#: Above it a tensor's own elementwise passes cost more than their nodes' dispatch, and flattening
#: (a ``Concat`` of each input, a ``Split`` of each output) would only add passes over memory.
FLAT_LIMIT = 1 << 18


def _numel(value: ir.Value) -> int | None:
    """The element count of ``value`` when its shape is static, else None."""
    if value.shape is None or not value.shape.is_static():
        return None
    return math.prod(value.shape.numpy())


def _static_shape(value: ir.Value) -> tuple[int, ...]:
    assert value.shape is not None, "grouped parameters have static shapes"
    return tuple(int(d) for d in value.shape.numpy())


def _flat(w: Writer, value: ir.Value) -> ir.Value:
    return value if value.shape is not None and len(value.shape) == 1 else w.reshape(value, [-1])


def update_parameters(
    w: Writer,
    spec: OptimizerSpec,
    learning_rate: ir.Value,
    step: ir.Value,
    params: Sequence[ir.Value],
    grads: Sequence[ir.Value],
    moments: Sequence[Sequence[ir.Value]],
    outs: Sequence[Sequence[str | ir.Value]],
    flat_limit: int | None = None,
    names: Sequence[str] | None = None,
) -> list[list[ir.Value]]:
    """Write one optimizer step for every parameter: each writes ``outs[i] = (p, *moments)`` (SGD: ``(p,)``).

    Multi-tensor layout: the parameters of at most ``flat_limit`` elements (static shapes) are updated together,
    per element type: their parameters, gradients and moments flattened and concatenated into one buffer each,
    every elementwise op of the update run once over the buffer, and the results split back to each
    parameter's shape and output name (what torch's ``foreach`` optimizers do with their tensor lists). The
    arithmetic per element is the same ops in the same order, so the results equal the per-tensor update bit
    for bit; a model of many small tensors (biases, norms, depthwise kernels) runs a few dozen nodes for them
    instead of 13 per tensor. Larger parameters keep their own update (flattening would cost more passes over
    memory than the nodes it saves).

    Args:
        w: The writer.
        spec: The optimizer.
        learning_rate: The ``[1]`` float learning rate.
        step: The ``[1]`` int64 step being taken (read by AdamW's bias corrections).
        params: The parameters.
        grads: Their (clipped) gradients.
        moments: Per parameter, its moments (AdamW: two; SGD: none read).
        outs: Per parameter, the names (or values) of the updated parameter and moments.
        flat_limit: The largest tensor updated in the flat buffers (0: none; default :data:`FLAT_LIMIT`).
        names: The parameters' names, for an optimizer with parameter groups (default: the values' names);
            parameters are flattened together per element type and group.

    Returns:
        Per parameter, the values written to ``outs[i]``.
    """
    limit = FLAT_LIMIT if flat_limit is None else flat_limit
    rule = _groups.GroupUpdater(w, spec.layout(), learning_rate, step) if spec.rule is not None else None
    adamw = spec.kind == "adamw" and rule is None
    scalars = adamw_scalars(w, spec, learning_rate, step) if adamw else None
    lr = w.reshape(learning_rate, []) if not adamw and rule is None else None
    keys: list[str] = [str(p.name) for p in params] if names is None else list(names)
    group_of = rule.group_of if rule is not None else {}

    def update(
        p: ir.Value, g: ir.Value, ms: Sequence[ir.Value], names: Sequence[str | ir.Value], group: int = 0
    ) -> list[ir.Value]:
        if rule is not None:
            return rule(group, p, g, ms, names)
        if scalars is not None:
            return adamw_update(w, spec, scalars, p, g, ms[0], ms[1], names)
        assert lr is not None
        return [w.op("Sub", [p, w.op("Mul", [lr, g])], names[0])]

    count = len(params)
    result: list[list[ir.Value] | None] = [None] * count
    groups: dict[tuple[object, int], list[int]] = {}
    for i, p in enumerate(params):
        size = _numel(p)
        flat = rule is None or rule.layout.rule.elementwise  # Lamb reads each tensor's norm: never flattened
        if flat and size is not None and 0 < size <= limit and p.dtype is not None:
            groups.setdefault((p.dtype, group_of.get(keys[i], 0)), []).append(i)
        else:
            result[i] = update(params[i], grads[i], moments[i], outs[i], group_of.get(keys[i], 0))
    for (_, group), members in groups.items():
        if len(members) == 1:
            (i,) = members
            result[i] = update(params[i], grads[i], moments[i], outs[i], group)
            continue
        arity = 1 + spec.updated_states

        def joined(tensors: Sequence[ir.Value], members: list[int] = members) -> ir.Value:
            return w.concat([_flat(w, tensors[i]) for i in members], 0)

        flat_moments = [joined([moments[i][k] for i in range(count)]) for k in range(arity - 1)]
        new = update(joined(params), joined(grads), flat_moments, [w.fresh("flat") for _ in range(arity)], group)
        sizes = [int(_numel(params[i]) or 0) for i in members]
        for k, value in enumerate(new):
            shapes = [list(_static_shape(params[i])) for i in members]
            pieces = w.split(
                value,
                sizes,
                0,
                [outs[i][k] if len(shape) == 1 else w.fresh("piece") for i, shape in zip(members, shapes, strict=True)],
            )
            for i, shape, piece in zip(members, shapes, pieces, strict=True):
                written = piece if len(shape) == 1 else w.reshape(piece, shape, outs[i][k])
                slot = result[i]
                if slot is None:
                    slot = result[i] = []
                slot.append(written)
    return [r if r is not None else [] for r in result]


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
    w = OptimizerWriter(names, opset, "optimizer")
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
    grads = clip(w, spec, [g for _, g, _ in state], [v.name or "" for v, _, _ in state])
    names_out = []
    for value, _, _ in state:
        assert value.name is not None
        names_out.append([updated_name(n) for n in (value.name, *state_names(value.name, spec.updated_states))])
    written = update_parameters(w, spec, lr, step, [v for v, _, _ in state], grads, [m for _, _, m in state], names_out)
    for (value, _, moments), new in zip(state, written, strict=True):
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
    w = OptimizerWriter(NameAuthority(v.name for v in inputs if v.name), opset, "optimizer")
    sequences = [PARAMS, GRADIENTS, *spec.state_inputs]
    items = {s: [w.op("SequenceAt", [by_name[s], w.const(np.int64(i))]) for i in range(count)] for s in sequences}
    if spec.groups and len(spec.params) != count:
        raise PortabilityError(f"The optimizer model names {len(spec.params)} parameters, not {count}: regenerate it.")
    order = [n for n, _ in spec.params] if spec.groups else None
    grads = clip(w, spec, items[GRADIENTS], order or [f"#{i}" for i in range(count)])
    outs = {s: [w.fresh(f"{s}.{i}") for i in range(count)] for s in (PARAMS, *spec.state_inputs)}
    produced: tuple[str, ...] = (PARAMS, *spec.state_inputs[: spec.updated_states])
    moments = [[items[m][i] for m in produced[1:]] for i in range(count)]
    update_parameters(
        w,
        spec,
        by_name[LEARNING_RATE],
        by_name[STEP],
        items[PARAMS],
        grads,
        moments,
        [[outs[s][i] for s in produced] for i in range(count)],
        names=order,
    )
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
    "OptimizerWriter",
    "adamw_scalars",
    "adamw_update",
    "clip_gradients",
    "optimizer_model",
    "portable_optimizer_model",
    "read_optimizer",
    "sgd_update",
    "update_parameters",
]

"""The optimizer update in standard ops: AdamW (torch and Hugging Face modes), SGD, clipping,
multi-tensor layout.

:func:`adamw_update`, :func:`sgd_update` and :func:`clip_gradients` write the arithmetic
of ONNX Runtime's ``AdamWOptimizer`` / ``SGDOptimizerV2`` / ``InplaceClipGradNorm``
kernels for one tensor (or one list of gradients) with standard ops, as IR nodes
(:class:`onnxblocks.ir.writer.Writer`): the moments as the CPU kernels compute them,
the bias corrections ``1 - beta**t`` in float32 (:mod:`~onnxblocks.portable.bias_correction`),
and
the per-step scalars folded so that each parameter costs as few passes over memory as
possible (the result moves by about an ulp of the update: rtol 1e-6 of the kernels).
:func:`update_parameters` writes the step of every parameter in the multi-tensor
layout (small tensors updated together in flat buffers). They serve the portable
optimizer models (:mod:`onnxblocks.portable.optimizer`) and the fused step model
(:mod:`onnxblocks.portable.step`).
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

from onnxblocks._core.contracts import FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS, STATE_SEQUENCES
from onnxblocks._core.naming import NameAuthority
from onnxblocks.portable import groups as _groups
from onnxblocks.portable import rules as _rules
from onnxblocks.portable.bias_correction import bias_corrections, float_step
from onnxblocks.portable.context import Writer, numpy_type


class OptimizerWriter(Writer):
    """A :class:`~onnxblocks.portable.context.Writer` that writes each scalar constant once.

    Stock onnxruntime merges equal scalar initializers and removes the copies, warning
    "Removing initializer ..." for each: an optimizer graph shares its scalars instead.
    """

    def __init__(self, names: NameAuthority, opset: int, hint: str) -> None:
        super().__init__(names, opset, hint)
        self._scalars: dict[tuple[str, bytes, tuple[int, ...]], ir.Value] = {}

    def scalar(
        self, value: float | int, dtype: Any = np.float32, shape: Sequence[int] = ()
    ) -> ir.Value:
        """The constant of ``dtype`` holding ``value`` (one node per distinct value, type and
        shape).
        """
        array = np.full(
            tuple(shape), value, dtype=numpy_type(dtype if dtype is not None else np.float32)
        )
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
        kind: ``"adamw"`` or ``"sgd"`` (the contrib ops), or a rule of
        :mod:`onnxblocks.portable.rules`
            when ``groups`` is set.
        attributes: The ``AdamWOptimizer`` attributes (declared defaults filled in); empty for SGD.
        max_norm: The gradient-clipping norm, or None without clipping.
        elem_type: The parameters' element type.
        groups: For an optimizer in standard ops: each parameter group's hyperparameters (the rule's
            defaults filled in), ``lr_scale`` (its learning rate over the session's) and optional
            ``max_norm``;
            empty for the contrib ops.
        params: The trainable parameters in the optimizer model's order, each with its group's
        index.
        exact: For an optimizer in standard ops: round as torch's CPU kernels (see
        :mod:`~onnxblocks.portable.rules`).
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
        """The rule's state tensors per parameter (torch's names), in slot order; () for the
        contrib ops.
        """
        rule = self.rule
        return rule.states([g["hyper"] for g in self.groups]) if rule is not None else ()

    @property
    def updated_states(self) -> int:
        """How many state tensors per parameter the update writes (ONNX Runtime's SGD: none)."""
        return len(self.states) if self.groups else 2 if self.kind == "adamw" else 0

    def to_json(self) -> str:
        """The metadata an optimizer model in standard ops carries (``onnxblocks.optimizer``)."""
        return _groups.metadata(self.kind, self.groups, self.params, self.max_norm, self.exact)

    def layout(self) -> _groups.Layout:
        """The groups' layout of a spec with groups
        (:class:`~onnxblocks.portable.groups.GroupUpdater`).
        """
        assert self.rule is not None, "a spec with groups"
        return _groups.Layout(
            self.rule, self.groups, dict(self.params), self.states, self.dtype, self.exact
        )

    @property
    def state_inputs(self) -> tuple[str, ...]:
        """The moment sequences the optimizer model reads."""
        if self.groups:
            return STATE_SEQUENCES[: len(self.states)]
        return (
            (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS)
            if self.kind == "adamw"
            else (FIRST_ORDER_MOMENTS,)
        )

    @property
    def moments(self) -> int:
        """How many moments per parameter the optimizer keeps (ONNX Runtime's SGD keeps one of
        zeros).
        """
        return len(self.state_inputs)

    @property
    def dtype(self) -> np.dtype:
        """The parameters' numpy element type."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))


def _f32(value: float) -> float:
    """``value`` rounded to float32 (what the kernels' float attributes hold), as a Python float."""
    return float(np.float32(value))


def clip_gradients(
    w: Writer, gradients: Sequence[ir.Value], max_norm: float, dtype: np.dtype
) -> list[ir.Value]:
    """Scale ``gradients`` by ``min(max_norm / (global L2 norm + 1e-6), 1)``."""
    squares = [w.reduce("ReduceSumSquare", g, None, keepdims=0) for g in gradients]
    total = w.op("Sqrt", [w.op("Sum", squares) if len(squares) > 1 else squares[0]])
    ratio = w.op(
        "Div", [w.scalar(max_norm, dtype), w.op("Add", [total, w.scalar(CLIP_EPSILON, dtype)])]
    )
    coefficient = w.op("Min", [ratio, w.scalar(1.0, dtype)])
    return [w.op("Mul", [g, coefficient]) for g in gradients]


def clip(
    w: Writer, spec: OptimizerSpec, gradients: Sequence[ir.Value], names: Sequence[str]
) -> list[ir.Value]:
    """The gradients clipped by the global norm (``spec.max_norm``), then by each group's
    ``max_norm``, as asked.
    """
    grads = (
        clip_gradients(w, gradients, spec.max_norm, spec.dtype)
        if spec.max_norm is not None
        else list(gradients)
    )
    if not spec.groups:
        return grads
    return _groups.clip_by_group(
        spec.layout(), names, grads, lambda gs, m: clip_gradients(w, gs, m, spec.dtype)
    )


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 scalars AdamW shares across parameters.

    Attributes:
        decay: ``1 - lr * weight_decay`` (the decoupled decay as one product), or None without
        decay.
        step_size: ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` (``lr`` without bias correction).
        epsilon: What is added to ``sqrt(m2)``: ``eps * sqrt(1 - beta2**t)`` in torch mode
            (``sqrt(m2 / c2) + eps`` scaled by ``sqrt(c2)``), ``eps`` in Hugging Face mode.
        coefficients: ``beta1, 1 - beta1, beta2, 1 - beta2`` as float32 constants, written once and
        shared
            by every update (None: each update writes its own).
    """

    decay: ir.Value | None
    step_size: ir.Value
    epsilon: ir.Value
    coefficients: tuple[ir.Value, ir.Value, ir.Value, ir.Value] | None = None


def adamw_scalars(
    w: Writer, spec: OptimizerSpec, learning_rate: ir.Value, step: ir.Value
) -> AdamWScalars:
    """The step's scalars; the bias corrections ``1 - beta**t`` in float32
    (:mod:`~onnxblocks.portable.bias_correction`).
    """
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
    decay = (
        w.op("Sub", [w.scalar(1.0, f32), w.op("Mul", [lr, w.scalar(decay_rate, f32)])])
        if decay_rate
        else None
    )
    if not int(a["correct_bias"]):
        return AdamWScalars(decay, lr, eps, coefficients)
    # the kernel rounds its attributes to float32, then takes the power (docs/training.md)
    alpha_c, beta_c = bias_corrections(
        w, [_f32(float(a["alpha"])), _f32(float(a["beta"]))], float_step(w, step)
    )
    root_beta_c = w.op("Sqrt", [beta_c])
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
    """Write ``outs = (param, m1, m2)`` after one AdamW step (``adam_mode`` 0: torch, 1: Hugging
    Face).

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


def sgd_update(
    w: Writer, learning_rate: ir.Value, param: ir.Value, grad: ir.Value, out: str | ir.Value
) -> ir.Value:
    """``out = param - lr * grad``."""
    return w.op("Sub", [param, w.op("Mul", [w.reshape(learning_rate, []), grad])], out)


#: Parameters of at most this many elements are updated together, in flat buffers
#: (:func:`update_parameters`).
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
    """Write one optimizer step for every parameter: each writes ``outs[i] = (p, *moments)`` (SGD:
    ``(p,)``).

    Multi-tensor layout: the parameters of at most ``flat_limit`` elements (static shapes) are
    updated together,
    per element type: their parameters, gradients and moments flattened and concatenated into one
    buffer each,
    every elementwise op of the update run once over the buffer, and the results split back to each
    parameter's shape and output name (what torch's ``foreach`` optimizers do with their tensor
    lists). The
    arithmetic per element is the same ops in the same order, so the results equal the per-tensor
    update bit
    for bit; a model of many small tensors (biases, norms, depthwise kernels) runs a few dozen nodes
    for them
    instead of 13 per tensor. Larger parameters keep their own update (flattening would cost more
    passes over
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
        flat_limit: The largest tensor updated in the flat buffers (0: none; default
        :data:`FLAT_LIMIT`).
        names: The parameters' names, for an optimizer with parameter groups (default: the values'
        names);
            parameters are flattened together per element type and group (a rule reading
            whole-tensor norms,
            Lamb, never).

    Returns:
        Per parameter, the values written to ``outs[i]``.
    """
    limit = FLAT_LIMIT if flat_limit is None else flat_limit
    rule = (
        _groups.GroupUpdater(w, spec.layout(), learning_rate, step)
        if spec.rule is not None
        else None
    )
    adamw = spec.kind == "adamw" and rule is None
    scalars = adamw_scalars(w, spec, learning_rate, step) if adamw else None
    lr = w.reshape(learning_rate, []) if not adamw and rule is None else None
    keys: list[str] = [str(p.name) for p in params] if names is None else list(names)
    group_of = rule.group_of if rule is not None else {}

    def update(
        p: ir.Value,
        g: ir.Value,
        ms: Sequence[ir.Value],
        names: Sequence[str | ir.Value],
        group: int = 0,
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
        flat = (
            rule is None or rule.layout.rule.elementwise
        )  # Lamb reads each tensor's norm: never flattened
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
        new = update(
            joined(params),
            joined(grads),
            flat_moments,
            [w.fresh("flat") for _ in range(arity)],
            group,
        )
        sizes = [int(_numel(params[i]) or 0) for i in members]
        for k, value in enumerate(new):
            shapes = [list(_static_shape(params[i])) for i in members]
            pieces = w.split(
                value,
                sizes,
                0,
                [
                    outs[i][k] if len(shape) == 1 else w.fresh("piece")
                    for i, shape in zip(members, shapes, strict=True)
                ],
            )
            for i, shape, piece in zip(members, shapes, pieces, strict=True):
                written = piece if len(shape) == 1 else w.reshape(piece, shape, outs[i][k])
                slot = result[i]
                if slot is None:
                    slot = result[i] = []
                slot.append(written)
    return [r if r is not None else [] for r in result]


__all__ = [
    "CLIP_EPSILON",
    "FLAT_LIMIT",
    "AdamWScalars",
    "OptimizerSpec",
    "OptimizerWriter",
    "adamw_scalars",
    "adamw_update",
    "clip",
    "clip_gradients",
    "sgd_update",
    "update_parameters",
]

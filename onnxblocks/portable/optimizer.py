"""Optimizer models in standard ops, written from an :class:`OptimizerSpec`.

An optimizer block of :mod:`onnxblocks.optim` hands its spec over when it is built; an
optimizer model on disk (artifacts written before, or by another tool) is read back by
:func:`read_optimizer`, the one reader of optimizer models: the spec its metadata carries
(``onnxblocks.optimizer``), or its ``AdamWOptimizer`` / ``SGDOptimizerV2`` node and an optional
``InplaceClipGradNorm``. :mod:`onnxblocks.portable.updates` writes the update.

The portable optimizer model (:func:`optimizer_model`, what ``optimizer_model.onnx``
holds) takes each parameter, its gradient and its moments as tensors of their own
and returns the updated ones (``<p>.out``, ``<p>.exp_avg.out``, ``<p>.exp_avg_sq.out``),
so a runtime binds them where they live, as it is written. :func:`portable_optimizer_model`
is the same update with the training build's sequence inputs, returning updated
sequences instead of a flag.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import (
    GRADIENTS,
    LEARNING_RATE,
    OPTIMIZER_METADATA,
    PARAMS,
    STEP,
    gradient_name,
    state_names,
    updated_name,
)
from onnxblocks._core.contrib_ops import (
    ADAMW_OPTIMIZER,
    INPLACE_CLIP_GRAD_NORM,
    SGD_OPTIMIZER_V2,
    Attribute,
)
from onnxblocks._core.errors import PortabilityError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.serde import to_proto
from onnxblocks.portable.clipping import clip
from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.optimizer_spec import OptimizerSpec
from onnxblocks.portable.updates import OptimizerWriter, update_parameters


def read_optimizer(model: onnx.ModelProto) -> OptimizerSpec:
    """Read the optimizer of an optimizer model: the spec in its metadata, or an update node,
    optionally after a clipping node (the training build's models, which carry no metadata).

    Raises:
        PortabilityError: for an optimizer model of another form (a custom optimizer block).
    """
    params = next((i for i in model.graph.input if i.name == PARAMS), None)
    elem = params.type.sequence_type.elem_type.tensor_type.elem_type if params is not None else 0
    elem = elem or onnx.TensorProto.FLOAT
    meta = next((p.value for p in model.metadata_props if p.key == OPTIMIZER_METADATA), None)
    if meta is not None:  # an optimizer in standard ops
        return OptimizerSpec.from_json(meta, elem)
    ops = {n.op_type: n for n in model.graph.node}
    flag = [o for n in model.graph.node if n.op_type in _UPDATES for o in n.output[:1]]
    reshape = [n for n in model.graph.node if n.op_type == "Reshape" and list(n.input[:1]) == flag]
    shaping = (
        {id(n) for n in reshape}
        | {  # SGD's flag reshaped to [1] (onnxblocks.optim.sgd), and its shape
            id(n)
            for n in model.graph.node
            if n.op_type == "Constant" and any(n.output[0] in r.input[1:] for r in reshape)
        }
    )
    extra = [
        n.op_type
        for n in model.graph.node
        if n.op_type not in (*_UPDATES, INPLACE_CLIP_GRAD_NORM.op_type) and id(n) not in shaping
    ]
    updates = [n for n in model.graph.node if n.op_type in _UPDATES]
    if len(updates) != 1 or extra:
        raise PortabilityError(
            f"The optimizer model holds {[n.op_type for n in model.graph.node]}; portable "
            "artifacts support the "
            "optimizers of onnxblocks.optim (AdamW, SGD, with an optional ClipGradNorm), one "
            "update node each. "
            "Use one of those, or generate non-portable artifacts (portable=False)."
        )
    update = updates[0]
    clip = ops.get(INPLACE_CLIP_GRAD_NORM.op_type)
    max_norm = None
    if clip is not None:
        max_norm = float(_attributes(clip, INPLACE_CLIP_GRAD_NORM.attributes)["max_norm"])
    if update.op_type == ADAMW_OPTIMIZER.op_type:
        attributes = _attributes(update, ADAMW_OPTIMIZER.attributes)
        return OptimizerSpec.kernel("adamw", attributes, max_norm, elem)
    return OptimizerSpec.kernel("sgd", {}, max_norm, elem)


_UPDATES = (ADAMW_OPTIMIZER.op_type, SGD_OPTIMIZER_V2.op_type)


def _attributes(
    node: onnx.NodeProto, declared: Sequence[Attribute]
) -> dict[str, float | int | str]:
    values: dict[str, float | int | str] = {a.name: a.default for a in declared}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        values[attr.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _opset(model: onnx.ModelProto) -> int:
    return max(_limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET, 13)


def _scalar_input(name: str, elem: int) -> ir.Value:
    """The ``[1]`` graph input ``name`` of element type ``elem`` (the optimizer contract's)."""
    return ir.Value(name=name, type=ir.TensorType(ir.DataType(elem)), shape=ir.Shape([1]))


def _model(
    inputs: list[ir.Value], outputs: list[ir.Value], w: Writer, opset: int, name: str
) -> ir.Model:
    graph = ir.Graph(inputs, outputs, nodes=w.nodes, opset_imports={"": opset}, name=name)
    return ir.Model(graph, ir_version=8, producer_name="onnxblocks")


def _finish(model: ir.Model) -> onnx.ModelProto:
    result = to_proto(model)
    _limits.stamp_versions(result)
    return result


def _spec_and_opset(optimizer: onnx.ModelProto | OptimizerSpec) -> tuple[OptimizerSpec, int]:
    """The spec (read from a model by :func:`read_optimizer`) and the opset to write in."""
    if isinstance(optimizer, OptimizerSpec):
        return optimizer, _limits.DEFAULT_ONNX_OPSET
    return read_optimizer(optimizer), _opset(optimizer)


def optimizer_model(
    optimizer: onnx.ModelProto | OptimizerSpec,
    params: Sequence[ir.Value],
    opset: int | None = None,
) -> onnx.ModelProto:
    """The portable optimizer model (:func:`optimizer_ir`) as a ModelProto, its versions stamped.

    Raises:
        PortabilityError: for an optimizer model of another form.
    """
    return _finish(optimizer_ir(optimizer, params, opset))


def optimizer_ir(
    optimizer: onnx.ModelProto | OptimizerSpec,
    params: Sequence[ir.Value],
    opset: int | None = None,
) -> ir.Model:
    """The portable optimizer model: one tensor input and output per parameter, gradient and moment.

    Its signature (docs/portable.md)::

        inputs:  learning_rate, step,
                 for each p of params: p, <p>_grad, p.exp_avg, p.exp_avg_sq  (SGD: p, <p>_grad,
                 p.exp_avg)
        outputs: for each p of params: p.out, p.exp_avg.out, p.exp_avg_sq.out  (SGD: p.out)

    SGD's ``p.exp_avg`` is read by nothing: ONNX Runtime's SGD keeps one moment of
    zeros in its checkpoints, and the runtime keeps it through this input.

    Args:
        optimizer: The optimizer's spec, or an optimizer model built by :mod:`onnxblocks.optim`
            (read by :func:`read_optimizer`; not changed).
        params: The trainable parameters, in the training model's order: values whose
            names, types and shapes the inputs take (not changed).
        opset: The opset to write (default: the model's, or the default opset for a spec).

    Raises:
        PortabilityError: for an optimizer model of another form.
    """
    spec, read_opset = _spec_and_opset(optimizer)
    opset = max(opset or read_opset, 13)
    names = NameAuthority([LEARNING_RATE, STEP])
    for p in params:
        assert p.name is not None, "parameters have names"
        names.reserve(p.name)
        names.reserve(gradient_name(p.name))
        for n in (p.name, *state_names(p.name)):
            names.reserve(n)
            names.reserve(updated_name(n))
    w = OptimizerWriter(names, opset, "optimizer")
    lr = _scalar_input(LEARNING_RATE, onnx.TensorProto.FLOAT)
    step = _scalar_input(STEP, onnx.TensorProto.INT64)
    inputs, outputs = [lr, step], []
    state: list[tuple[ir.Value, ir.Value, list[ir.Value]]] = []
    for p in params:
        assert p.name is not None

        def like(name: str, p: ir.Value = p) -> ir.Value:
            return ir.Value(
                name=name, type=p.type, shape=ir.Shape(p.shape) if p.shape is not None else None
            )

        value, grad = like(p.name), like(gradient_name(p.name))
        moments = [like(m) for m in state_names(p.name, spec.moments)]
        inputs += [value, grad, *moments]
        state.append((value, grad, moments))
    grads = clip(w, spec, [g for _, g, _ in state], [v.name or "" for v, _, _ in state])
    names_out = []
    for value, _, _ in state:
        assert value.name is not None
        names_out.append(
            [updated_name(n) for n in (value.name, *state_names(value.name, spec.updated_states))]
        )
    written = update_parameters(
        w,
        spec,
        lr,
        step,
        [v for v, _, _ in state],
        grads,
        [m[: spec.updated_states] for _, _, m in state],  # ONNX Runtime's SGD: a moment unread
        names_out,
    )
    for (value, _, moments), new in zip(state, written, strict=True):
        for out, old in zip(new, (value, *moments), strict=False):
            out.type, out.shape = old.type, old.shape
            outputs.append(out)
    return _model(inputs, outputs, w, opset, "portable_optimizer")


def portable_optimizer_model(
    optimizer: onnx.ModelProto | OptimizerSpec, count: int, opset: int | None = None
) -> onnx.ModelProto:
    """The standard-op optimizer model for ``count`` parameters, with the training build's
    sequence inputs and updated sequences out.

    The inputs ``learning_rate``, ``step`` and the tensor sequences ``params``, ``gradients``
    and the moments; the outputs ``params.out`` and the moments' ``.out`` sequences.
    :func:`optimizer_model` is the per-tensor form portable artifacts hold.

    Args:
        optimizer: The optimizer's spec, or an optimizer model built by :mod:`onnxblocks.optim`
            (read by :func:`read_optimizer`; not changed).
        count: How many parameters the sequences hold (the training model's trainable parameters).
        opset: The opset to write (default: the model's, or the default opset for a spec).

    Raises:
        PortabilityError: for an optimizer model of another form, or a spec naming another
            number of parameters.
    """
    spec, read_opset = _spec_and_opset(optimizer)
    opset = max(opset or read_opset, 13)
    sequence = ir.SequenceType(ir.TensorType(ir.DataType(spec.elem_type)))
    inputs = [_scalar_input(LEARNING_RATE, onnx.TensorProto.FLOAT)]
    inputs += [_scalar_input(STEP, onnx.TensorProto.INT64)]
    inputs += [ir.Value(name=n, type=sequence) for n in (PARAMS, GRADIENTS, *spec.state_inputs)]
    by_name = {v.name: v for v in inputs}
    w = OptimizerWriter(NameAuthority(v.name for v in inputs if v.name), opset, "optimizer")
    sequences = [PARAMS, GRADIENTS, *spec.state_inputs]
    items = {
        s: [w.op("SequenceAt", [by_name[s], w.const(np.int64(i))]) for i in range(count)]
        for s in sequences
    }
    if spec.params and len(spec.params) != count:
        raise PortabilityError(
            f"The optimizer model names {len(spec.params)} parameters, not {count}: regenerate it."
        )
    order = [n for n, _ in spec.params] if spec.params else None
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
        out.type = sequence
        outputs.append(out)
    return _finish(_model(inputs, outputs, w, opset, "portable_optimizer"))


__all__ = ["optimizer_ir", "optimizer_model", "portable_optimizer_model", "read_optimizer"]

"""Optimizer models in standard ops: what an ``onnxblocks.optim`` optimizer model does, rewritten.

:func:`read_optimizer` reads what an optimizer model built by :mod:`onnxblocks.optim`
does (its ``AdamWOptimizer`` / ``SGDOptimizerV2`` node and an optional
``InplaceClipGradNorm``); :mod:`onnxblocks.portable.updates` writes that update in
standard ops (re-exported here).

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
from onnxblocks._core.contrib import (
    ADAMW_OPTIMIZER,
    INPLACE_CLIP_GRAD_NORM,
    SGD_OPTIMIZER_V2,
    Attribute,
)
from onnxblocks._core.errors import PortabilityError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.serde import to_proto
from onnxblocks.portable import groups as _groups
from onnxblocks.portable.context import Writer
from onnxblocks.portable.updates import (
    OptimizerSpec,
    OptimizerWriter,
    clip,
    update_parameters,
)


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
        return OptimizerSpec(
            "adamw", _attributes(update, ADAMW_OPTIMIZER.attributes), max_norm, elem
        )
    return OptimizerSpec("sgd", {}, max_norm, elem)


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


def _input(model: onnx.ModelProto, name: str, elem: int, shape: Sequence[int]) -> ir.Value:
    """The optimizer model's graph input ``name`` as a new IR value (its declared type, else
    ``elem`` ``shape``).
    """
    declared = next((i for i in model.graph.input if i.name == name), None)
    if declared is not None and declared.type.HasField("tensor_type"):
        return ir.serde.deserialize_value_info_proto(declared, None)
    return ir.Value(name=name, type=ir.TensorType(ir.DataType(elem)), shape=ir.Shape(list(shape)))


def _finish(
    inputs: list[ir.Value], outputs: list[ir.Value], w: Writer, opset: int, name: str
) -> onnx.ModelProto:
    graph = ir.Graph(inputs, outputs, nodes=w.nodes, opset_imports={"": opset}, name=name)
    result = to_proto(ir.Model(graph, ir_version=8, producer_name="onnxblocks"))
    _limits.stamp_versions(result)
    return result


def optimizer_model(model: onnx.ModelProto, params: Sequence[ir.Value]) -> onnx.ModelProto:
    """The portable optimizer model: one tensor input and output per parameter, gradient and moment.

    Its signature (docs/portable.md)::

        inputs:  learning_rate, step,
                 for each p of params: p, <p>_grad, p.exp_avg, p.exp_avg_sq  (SGD: p, <p>_grad,
                 p.exp_avg)
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
        w, spec, lr, step, [v for v, _, _ in state], grads, [m for _, _, m in state], names_out
    )
    for (value, _, moments), new in zip(state, written, strict=True):
        for out, old in zip(new, (value, *moments), strict=False):
            out.type, out.shape = old.type, old.shape
            outputs.append(out)
    return _finish(inputs, outputs, w, opset, "portable_optimizer")


def portable_optimizer_model(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """The standard-op optimizer model for ``count`` parameters, with today's inputs and updated
    sequences out.

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
    items = {
        s: [w.op("SequenceAt", [by_name[s], w.const(np.int64(i))]) for i in range(count)]
        for s in sequences
    }
    if spec.groups and len(spec.params) != count:
        raise PortabilityError(
            f"The optimizer model names {len(spec.params)} parameters, not {count}: regenerate it."
        )
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


__all__ = ["optimizer_model", "portable_optimizer_model", "read_optimizer"]

"""The fused step model: forward, backward and the optimizer update in one graph (one ``run`` per
step).

Built from the lowered training graph (before its accumulation is rewritten):
each accumulator's gradient input ``<p>_grad`` feeds the update instead, after
the optional gradient clipping. Its signature (docs/portable.md)::

    inputs:  user inputs, learning_rate, step,
             for each trainable p: p, p.exp_avg, p.exp_avg_sq   (AdamW; p alone for SGD),
             frozen parameters
    outputs: loss, additional outputs,
             for each trainable p: p.out, p.exp_avg.out, p.exp_avg_sq.out   (AdamW; p.out for SGD)

``step`` is the optimizer step being taken (1 for the first), as for the optimizer model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import (
    ACCUMULATED_SUFFIX,
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    STEP,
    state_names,
    updated_name,
)
from onnxblocks._core.errors import PortabilityError
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.portable.accumulation import _parameters, accumulators
from onnxblocks.portable.updates import OptimizerSpec, OptimizerWriter, clip, update_parameters


class FuseStep(Pass):
    """Turn a lowered training model (its accumulators not yet rewritten) into the fused step model.

    Args:
        spec: The optimizer (:func:`~onnxblocks.portable.optimizer.read_optimizer`).
        frozen: The frozen parameters; default: the graph inputs between the last
            trainable parameter and the first accumulation buffer.
    """

    name = "step"

    def __init__(self, spec: OptimizerSpec, frozen: Sequence[str] | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.frozen = list(frozen) if frozen is not None else None

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        """Raises: PortabilityError: if the model has no accumulators (nothing is trained)."""
        graph, spec = model.graph, self.spec
        params = _parameters(graph)
        if not params:
            raise PortabilityError(
                "The training model has no trainable parameters: there is no step to fuse."
            )
        found = accumulators(graph)
        grads: list[ir.Value] = []
        for node in found:
            grad = node.inputs[1]
            if grad is None:
                raise PortabilityError(f"Accumulator node '{node.name}' reads no gradient.")
            grads.append(grad)
        buffers = {n.inputs[0] for n in found}
        outputs = [o for o in graph.outputs if not (o.name or "").endswith(ACCUMULATED_SUFFIX)]
        graph.outputs.clear()
        graph.outputs.extend(outputs)
        graph.remove(found, safe=True)

        order = list(graph.inputs)
        by_name = {v.name: v for v in order}
        frozen = (
            [by_name[n] for n in self.frozen]
            if self.frozen is not None
            else _frozen_by_position(order, params, buffers)
        )
        skip = {*params, *frozen, *buffers}
        user = [v for v in order if v not in skip and v.name != LAZY_RESET_GRAD]

        opset = graph.opset_imports.get("", _limits.DEFAULT_ONNX_OPSET)
        w = OptimizerWriter(graph_names(graph), opset, "step")
        grads = clip(w, spec, grads, [p.name or "" for p in params])
        lr = ir.Value(
            name=LEARNING_RATE, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1])
        )
        step = ir.Value(name=STEP, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]))
        new_inputs = [*user, lr, step]
        moments, outs = [], []
        for param in params:
            assert param.name is not None
            kept = [_like(n, param) for n in state_names(param.name, spec.updated_states)]
            new_inputs += [param, *kept]
            moments.append(kept)
            outs.append(
                [
                    updated_name(n)
                    for n in (param.name, *state_names(param.name, spec.updated_states))
                ]
            )
        written = update_parameters(w, spec, lr, step, params, grads, moments, outs)
        for param, new in zip(params, written, strict=True):
            for value in new:
                value.type, value.shape = param.type, _shape(param)
            outputs += new
        new_inputs += frozen
        graph.extend(w.nodes)
        graph.inputs.clear()
        graph.inputs.extend(new_inputs)
        graph.outputs.clear()
        graph.outputs.extend(outputs)
        return {"updates": len(params)}


def _shape(value: ir.Value) -> ir.Shape | None:
    return ir.Shape(value.shape) if value.shape is not None else None


def _like(name: str, param: ir.Value) -> ir.Value:
    return ir.Value(name=name, type=param.type, shape=_shape(param))


def _frozen_by_position(
    order: list[ir.Value], params: list[ir.Value], buffers: set[ir.Value | None]
) -> list[ir.Value]:
    """The inputs after the last trainable parameter and before the first buffer (onnxblocks'
    input order).
    """
    last = max(order.index(p) for p in params)
    first_buffer = min((order.index(b) for b in buffers if b is not None), default=len(order))
    return [v for v in order[last + 1 : first_buffer] if v.name != LAZY_RESET_GRAD]

"""The fused step model: forward, backward and the optimizer update in one graph (one ``run`` per step).

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

from collections.abc import Sequence

import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import LAZY_RESET_GRAD, LEARNING_RATE, STEP, moment_names, updated_name
from onnxblocks._core.errors import PortabilityError
from onnxblocks.gradient import _graph
from onnxblocks.portable.accumulation import ACCUMULATOR, trainable_parameters
from onnxblocks.portable.context import Writer
from onnxblocks.portable.optimizer import OptimizerSpec, adamw_scalars, adamw_update, clip_gradients, sgd_update


def step_model(lowered: onnx.ModelProto, spec: OptimizerSpec, frozen: Sequence[str] | None = None) -> onnx.ModelProto:
    """The fused step model of a lowered training model (its accumulators not yet rewritten).

    Args:
        lowered: The training model after :func:`~onnxblocks.portable.lower.lower_training_ops` (not changed).
        spec: The optimizer (:func:`~onnxblocks.portable.optimizer.read_optimizer`).
        frozen: The frozen parameters; default: the graph inputs between the last
            trainable parameter and the first accumulation buffer.

    Raises:
        PortabilityError: if the model has no accumulators (nothing is trained).
    """
    model = _graph.copy_structure(lowered)
    graph = model.graph
    params = trainable_parameters(model)
    if not params:
        raise PortabilityError("The training model has no trainable parameters: there is no step to fuse.")
    accumulators = [n for n in graph.node if n.op_type == ACCUMULATOR]
    grads = [n.input[1] for n in accumulators]
    buffers = {n.input[0] for n in accumulators}
    kept = [n for n in graph.node if n.op_type != ACCUMULATOR]
    del graph.node[:]
    graph.node.extend(kept)

    inputs = {i.name: i for i in graph.input}
    order = [i.name for i in graph.input]
    frozen_names = list(frozen) if frozen is not None else _frozen_by_position(order, params, buffers)
    user = [n for n in order if n not in set(params) | set(frozen_names) | buffers | {LAZY_RESET_GRAD}]

    w = Writer(_graph.name_authority(graph), _limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET, "step")
    if spec.max_norm is not None:
        grads = clip_gradients(w, grads, spec.max_norm, spec.elem_type)
    new_inputs = [inputs[n] for n in user]
    new_inputs.append(helper.make_tensor_value_info(LEARNING_RATE, onnx.TensorProto.FLOAT, [1]))
    new_inputs.append(helper.make_tensor_value_info(STEP, onnx.TensorProto.INT64, [1]))
    outputs = [o for o in graph.output if not o.name.endswith(".accumulation.out")]
    scalars = adamw_scalars(w, spec, LEARNING_RATE, STEP) if spec.kind == "adamw" else None
    for param, grad in zip(params, grads, strict=True):
        p_type = inputs[param].type
        new_inputs.append(inputs[param])
        if scalars is not None:
            first, second = moment_names(param)
            new_inputs += [helper.make_value_info(first, p_type), helper.make_value_info(second, p_type)]
            trio = [updated_name(param), updated_name(first), updated_name(second)]
            adamw_update(w, spec, scalars, param, grad, first, second, trio)
            outputs += [helper.make_value_info(n, p_type) for n in trio]
        else:
            sgd_update(w, LEARNING_RATE, param, grad, updated_name(param))
            outputs.append(helper.make_value_info(updated_name(param), p_type))
    new_inputs += [inputs[n] for n in frozen_names]
    graph.node.extend(w.nodes)
    del graph.input[:]
    graph.input.extend(new_inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    _limits.stamp_versions(model)
    return model


def _frozen_by_position(order: list[str], params: list[str], buffers: set[str]) -> list[str]:
    """The inputs after the last trainable parameter and before the first buffer (onnxblocks' input order)."""
    last = max(order.index(p) for p in params)
    first_buffer = min((order.index(b) for b in buffers), default=len(order))
    return [n for n in order[last + 1 : first_buffer] if n != LAZY_RESET_GRAD]

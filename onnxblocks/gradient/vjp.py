"""Vector-Jacobian product graphs: the gradients of several outputs, given their incoming gradients.

:func:`~onnxblocks.gradient.builder.build_training_graphs` differentiates one
scalar loss. An autograd engine (torch's, for :mod:`onnxblocks.torch`) needs the
vector-Jacobian product instead: given the gradients ``g_i`` flowing into the
outputs ``y_i``, the gradients ``sum_i g_i . dy_i/dx`` of the weights and of the
inputs that require one. :func:`build_vjp_graph` builds it with ONNX Runtime's
``GradientGraphBuilder`` run with the differentiable outputs as its *y* nodes and
no loss: ONNX Runtime then reads ``<y>_grad`` as values nobody produces, which
become graph inputs here. (The alternative, a scalar ``sum_i <y_i, g_i>`` loss,
gives the same gradients but adds a multiply, a reduction and their gradients
per output.)

ONNX Runtime adds the gradient of a *y* node only to what flows into it from the
graph; it does not add ``<y>_grad`` to a *y* node that other nodes also read.
Each such output is therefore written by an ``Identity`` of its own, which
nothing else reads.

The same preparation as for the training graphs runs first (opset upgrade,
:func:`~onnxblocks.gradient.normalize.normalize`, parameters as graph inputs,
layer-norm constants unshared) plus
:func:`~onnxblocks.gradient.batch_norm.batch_norm_inference_as_elementary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxblocks._core import limits as _limits
from onnxblocks._core import ort_errors
from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import UnknownNameError, did_you_mean, preview
from onnxblocks.gradient import _graph, ort_bridge, pooling, signature
from onnxblocks.gradient.batch_norm import batch_norm_inference_as_elementary
from onnxblocks.gradient.builder import upgrade_old_opset
from onnxblocks.gradient.layer_norm import unshare_layer_norm_constants
from onnxblocks.gradient.normalize import normalize
from onnxblocks.gradient.parameters import FLOAT_TYPES, ParameterPartition, partition_parameters

__all__ = ["VjpGraph", "build_vjp_graph"]


@dataclass(frozen=True)
class VjpGraph:
    """The result of :func:`build_vjp_graph`.

    Attributes:
        model: Inputs: the user inputs, the parameters (:attr:`partition` order),
            then one gradient input per differentiable output (:attr:`output_grads`).
            Outputs: the user outputs, then one gradient per value of :attr:`gradients`.
        user_inputs: The graph inputs that are not parameters, in order.
        partition: The parameters (trainable and frozen) and the inputs asked for a gradient.
        outputs: The user outputs, in order.
        differentiable: The outputs that take an incoming gradient (float, and reached
            from a value whose gradient is built).
        output_grads: The graph input holding the incoming gradient of each differentiable output.
        gradients: The values whose gradient the model outputs (``<name>_grad``), in the order of
            ``partition.requires_grad``. Values the outputs do not depend on, or depend on only
            through ops without a gradient path (ONNX Runtime's "unreachable": a BatchNorm's
            running statistics, integer casts, shapes), are left out: they get no gradient.
        rewrites: How many nodes each normalisation pass rewrote.
    """

    model: onnx.ModelProto
    user_inputs: tuple[str, ...]
    partition: ParameterPartition
    outputs: tuple[str, ...]
    differentiable: tuple[str, ...]
    output_grads: tuple[str, ...]
    gradients: tuple[str, ...]
    rewrites: dict[str, int] = field(default_factory=dict)


def build_vjp_graph(
    model: onnx.ModelProto,
    requires_grad: Iterable[str],
    frozen_params: Iterable[str] = (),
    outputs: Sequence[str] | None = None,
    no_grad_outputs: Iterable[str] = (),
    custom_op_libraries: Sequence[str] = (),
) -> VjpGraph:
    """Build the forward-and-VJP graph of ``model``.

    Args:
        model: The forward model (not mutated).
        requires_grad: Parameters (initializers) to train and graph inputs whose gradient is wanted.
        frozen_params: Initializers that become graph inputs without a gradient (fed by the caller).
        outputs: The outputs to compute, in order; defaults to the graph outputs.
        no_grad_outputs: Outputs that never take a gradient (statistics, masks).
        custom_op_libraries: Shared libraries with custom ops, registered with ONNX Runtime.

    Returns:
        The graph and the names of its parts. When no output depends on a value of
        ``requires_grad`` the model has no gradient input and no gradient output.

    Raises:
        UnknownNameError: for an unknown parameter, input or output name.
        ValueError: for a value both trainable and frozen, or a model without outputs.
        TypeError: for a non-float value that requires a gradient.
        GradientError: when ONNX Runtime cannot differentiate the graph (naming the node and op).
    """
    forward = _graph.copy_structure(model)
    _limits.check_opset_supported(forward, "the model")
    forward = upgrade_old_opset(forward)
    graph = forward.graph
    if not graph.output and outputs is None:
        raise ValueError("The model has no graph output: there is nothing to differentiate.")
    user_outputs = signature.select_outputs(graph, outputs)
    silent = tuple(dict.fromkeys(no_grad_outputs))
    for name in silent:
        if name not in user_outputs:
            raise UnknownNameError(
                f"no_grad_outputs names '{name}', which is not one of the outputs.{did_you_mean(name, user_outputs)} "
                f"Outputs: {preview(user_outputs)}."
            )
    partition = partition_parameters(graph, requires_grad, frozen_params)
    rewrites = normalize(forward)
    rewrites["batch_norm_inference_as_elementary"] = batch_norm_inference_as_elementary(forward)
    signature.keep_only_outputs(graph, user_outputs)
    signature.parameters_to_inputs(forward, partition.parameters)
    rewrites["copy_inputs_written_in_place"] = copy_inputs_written_in_place(forward)
    user_inputs = tuple(i.name for i in graph.input if i.name not in set(partition.parameters))

    types = _graph.infer_types(forward)
    sources = _sources(graph)
    differentiable = tuple(
        o
        for o in user_outputs
        if o not in silent
        and _graph.elem_type(types, o) in FLOAT_TYPES
        and sources.get(o, set()) & set(partition.requires_grad)
    )
    reached = set().union(*(sources.get(o, set()) for o in differentiable)) if differentiable else set()
    gradients = tuple(n for n in partition.requires_grad if n in reached)
    if not gradients:
        _limits.stamp_versions(forward)
        return VjpGraph(forward, user_inputs, partition, user_outputs, (), (), (), rewrites)

    _give_outputs_their_own_writer(graph, differentiable)
    signature_inputs = {vi.name: vi for vi in graph.input}
    while True:  # a value ONNX Runtime finds no differentiable path from gets no gradient (as in torch)
        attempt = _graph.copy_structure(forward)
        norm_constants = unshare_layer_norm_constants(attempt, gradients)
        held = signature.held_constants_to_inputs(attempt, also=norm_constants)
        try:
            vjp = _differentiate(attempt, gradients, differentiable, custom_op_libraries)
            break
        except _UnreachableError as unreachable:
            gradients = tuple(n for n in gradients if n != unreachable.name)
            if not gradients:
                _limits.stamp_versions(forward)
                return VjpGraph(forward, user_inputs, partition, user_outputs, (), (), (), rewrites)
    pooling.check_pool_shapes(attempt, vjp)
    signature.restore_held_constants(vjp, held)
    output_grads = tuple(gradient_name(o) for o in differentiable)
    _order_signature(vjp, signature_inputs, user_inputs, partition, types, differentiable, user_outputs, gradients)
    _limits.stamp_versions(vjp)
    ort_bridge.check_kernels(vjp, attempt, custom_op_libraries)
    return VjpGraph(vjp, user_inputs, partition, user_outputs, differentiable, output_grads, gradients, rewrites)


def copy_inputs_written_in_place(model: onnx.ModelProto) -> int:
    """Make ops that write into an input read a copy when that input is a graph input, in place.

    ONNX Runtime's training-mode BatchNorm kernel writes the updated running mean and
    variance into the buffers of its inputs 3 and 4 (its outputs alias them). When
    those are graph inputs, the caller's tensors (fed without copies) would change
    behind its back; an ``Add`` of zero gives the node a buffer of its own.

    Returns:
        The number of node inputs now read through a copy.
    """
    graph = model.graph
    elem_types = {vi.name: vi.type.tensor_type.elem_type for vi in graph.input}
    names = _graph.name_authority(graph)
    copies: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    changed = 0
    for node in graph.node:
        training = node.op_type == "BatchNormalization" and _graph.int_attribute(node, "training_mode", 0)
        for index in (3, 4) if training else ():
            source = node.input[index] if index < len(node.input) else ""
            if not elem_types.get(source):
                continue
            if source not in copies:
                zero, copy = names.fresh(f"{source}.zero"), names.fresh(f"{source}.copy")
                dtype = helper.tensor_dtype_to_np_dtype(elem_types[source])
                graph.initializer.append(numpy_helper.from_array(np.zeros((), dtype=dtype), zero))
                nodes.append(helper.make_node("Add", [source, zero], [copy], name=names.fresh("Add")))
                copies[source] = copy
            node.input[index] = copies[source]
            changed += 1
        nodes.append(node)
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed


def _sources(graph: onnx.GraphProto) -> dict[str, set[str]]:
    """For each value, the graph inputs it depends on (through nodes and subgraph reads)."""
    inputs = {vi.name for vi in graph.input}
    found: dict[str, set[str]] = {name: {name} for name in inputs}
    for node in graph.node:  # graphs are topologically sorted
        reads = set(node.input) | _graph.subgraph_reads(node)
        depends = set().union(*(found.get(name, set()) for name in reads if name))
        for out in node.output:
            if out:
                found[out] = depends
    return found


def _give_outputs_their_own_writer(graph: onnx.GraphProto, outputs: Sequence[str]) -> None:
    """Make each output in ``outputs`` that a node also reads the output of an ``Identity`` nothing else reads."""
    readers = _graph.consumers(graph)
    inputs = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    names = _graph.name_authority(graph)
    for name in outputs:
        if name in inputs:
            raise ValueError(
                f"Output '{name}' is a graph input passed through unchanged; give it a node of its own "
                "(an Identity to a new name) to differentiate it."
            )
        if not readers.get(name):
            continue
        inner = names.fresh(f"{name}.value")
        for node in graph.node:
            for i, value in enumerate(node.output):
                if value == name:
                    node.output[i] = inner
            for i, value in enumerate(node.input):
                if value == name:
                    node.input[i] = inner
            _rename_subgraph_reads(node, name, inner)
        graph.node.append(helper.make_node("Identity", [inner], [name], name=names.fresh(f"{name}.output")))


def _rename_subgraph_reads(node: onnx.NodeProto, old: str, new: str) -> None:
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                for i, value in enumerate(inner.input):
                    if value == old:
                        inner.input[i] = new
                _rename_subgraph_reads(inner, old, new)


class _UnreachableError(Exception):
    """ONNX Runtime found no differentiable path from the outputs to ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _differentiate(
    forward: onnx.ModelProto, gradients: Sequence[str], ys: Sequence[str], custom_op_libraries: Sequence[str]
) -> onnx.ModelProto:
    """ONNX Runtime's pre-training optimizer and gradient builder, with ``ys`` as y nodes and no loss."""
    from onnxblocks._core.ort import require_training_build

    C = require_training_build("Building a gradient graph (ONNX Runtime's gradient builder)")
    options = ort_bridge.session_options(custom_op_libraries)
    stamped = _graph.copy_structure(forward)
    _limits.stamp_versions(stamped)
    wanted = set(gradients)
    optimized = ort_bridge.optimize_for_gradient(C, stamped, wanted, options)
    try:
        builder = C.GradientGraphBuilder(optimized, set(ys), wanted, "", options)
        builder.build()
        result = builder.get_model()
    except Exception as exc:
        name = ort_errors.unreachable_value(ort_errors.clean_message(exc))
        if name is not None and name in wanted:
            raise _UnreachableError(name) from None
        partition = ParameterPartition(tuple(gradients), (), tuple(gradients))
        raise ort_bridge.explain_gradient_failure(
            exc, forward, onnx.load_from_string(optimized), partition, ys[0]
        ) from None
    return onnx.load_from_string(result)


def _order_signature(
    vjp: onnx.ModelProto,
    signature_inputs: dict[str, onnx.ValueInfoProto],
    user_inputs: Sequence[str],
    partition: ParameterPartition,
    types: dict[str, onnx.TypeProto],
    differentiable: Sequence[str],
    user_outputs: Sequence[str],
    gradients: Sequence[str],
) -> None:
    """Inputs: user inputs, parameters, output gradients. Outputs: user outputs, then gradients."""
    graph = vjp.graph
    present = {vi.name: vi for vi in graph.input}
    inputs = [present.get(n) or signature_inputs[n] for n in (*user_inputs, *partition.parameters)]
    for name in differentiable:
        grad = helper.make_value_info(gradient_name(name), types[name])
        inputs.append(grad)
    wanted = {vi.name for vi in inputs}
    extra = [n for n in present if n not in wanted]
    signature.refuse_extra_inputs(extra)
    del graph.input[:]
    graph.input.extend(inputs)
    signature.order_outputs(graph, [*user_outputs, *(gradient_name(n) for n in gradients)])

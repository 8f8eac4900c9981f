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
:func:`~onnxblocks.gradient.rewrites.normalize`, parameters as graph inputs,
layer-norm constants lifted, an input per reader of a value without gradient) plus
``batch_norm_inference_as_elementary``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core import ort_errors
from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import (
    GradientError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks._core.naming import NameAuthority
from onnxblocks.gradient import kernels, ort_bridge, pooling, signature
from onnxblocks.gradient.batch_norm import BatchNormInferenceAsElementary
from onnxblocks.gradient.builder import upgrade_old_opset
from onnxblocks.gradient.dependencies import upstream_values
from onnxblocks.gradient.frozen_reads import alias_frozen_reads, restore_frozen_reads
from onnxblocks.gradient.layer_norm import unshare_norm_constants
from onnxblocks.gradient.parameters import FLOAT_TYPES, ParameterPartition, partition_parameters
from onnxblocks.gradient.rewrites import default_passes, normalize
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.proto import copy_model
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.types import infer_proto_types, proto_elem_type
from onnxblocks.ir.walk import reads

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
    forward = copy_model(model)
    _limits.check_opset_supported(forward, "the model")
    ir_forward = from_proto(upgrade_old_opset(forward))
    graph = ir_forward.graph
    if not graph.outputs and outputs is None:
        raise InvalidValueError("The model has no graph output: there is nothing to differentiate.")
    user_outputs = signature.select_outputs(graph, outputs)
    silent = tuple(dict.fromkeys(no_grad_outputs))
    for name in silent:
        if name not in user_outputs:
            raise UnknownNameError(
                f"no_grad_outputs names '{name}', which is not one of the "
                f"outputs.{did_you_mean(name, user_outputs)} "
                f"Outputs: {preview(user_outputs)}."
            )
    partition = partition_parameters(graph, requires_grad, frozen_params)
    rewrites = normalize(ir_forward, [*default_passes(), BatchNormInferenceAsElementary()])
    signature.keep_only_outputs(graph, user_outputs)
    signature.parameters_to_inputs(graph, partition.parameters)
    rewrites.update(normalize(ir_forward, [CopyInputsWrittenInPlace()]))
    user_inputs = tuple(
        v.name or "" for v in graph.inputs if v.name not in set(partition.parameters)
    )

    forward = to_proto(ir_forward)
    types = infer_proto_types(forward)
    sources = _sources(ir_forward.graph)
    differentiable = tuple(
        o
        for o in user_outputs
        if o not in silent
        and proto_elem_type(types, o) in FLOAT_TYPES
        and sources.get(o, set()) & set(partition.requires_grad)
    )
    reached = set().union(*(sources.get(o, set()) for o in differentiable))
    gradients = tuple(n for n in partition.requires_grad if n in reached)
    if not gradients:
        _limits.stamp_versions(forward)
        return VjpGraph(forward, user_inputs, partition, user_outputs, (), (), (), rewrites)

    if _give_outputs_their_own_writer(ir_forward.graph, differentiable):
        forward.CopyFrom(to_proto(ir_forward))
    signature_inputs = {vi.name: vi for vi in forward.graph.input}
    while True:  # a value with no differentiable path to an output gets no gradient (as in torch)
        ir_attempt = ir_forward.clone()  # the attempt's edits leave the forward IR as it is
        norm_constants, unshared = unshare_norm_constants(ir_attempt.graph)
        untrained = [p for p in partition.parameters if p not in gradients]
        reads = alias_frozen_reads(ir_attempt.graph, gradients, untrained)
        attempt = to_proto(ir_attempt) if unshared or reads.aliases else copy_model(forward)
        held = signature.held_constants_to_inputs(attempt, also=norm_constants | reads.lifted)
        try:
            vjp = _differentiate(attempt, gradients, differentiable, custom_op_libraries)
            break
        except _UnreachableError as unreachable:
            _refuse_silent_zero(ir_forward.graph, unreachable.name, differentiable)
            gradients = tuple(n for n in gradients if n != unreachable.name)
            if not gradients:
                _limits.stamp_versions(forward)
                return VjpGraph(forward, user_inputs, partition, user_outputs, (), (), (), rewrites)
    pooling.check_pool_shapes(attempt, vjp)
    signature.declare_output_gradients(vjp, types, differentiable)
    ir_vjp = from_proto(vjp)  # ONNX Runtime's result, edited on one IR
    restore_frozen_reads(ir_vjp.graph, reads)
    signature.restore_held_constants(ir_vjp.graph, held)
    output_grads = tuple(gradient_name(o) for o in differentiable)
    _order_signature(
        ir_vjp.graph,
        signature_inputs,
        user_inputs,
        partition,
        differentiable,
        user_outputs,
        gradients,
    )
    vjp = _limits.stamp_versions(to_proto(ir_vjp))
    kernels.check_kernels(vjp, attempt, custom_op_libraries)
    return VjpGraph(
        vjp, user_inputs, partition, user_outputs, differentiable, output_grads, gradients, rewrites
    )


class CopyInputsWrittenInPlace(Pass):
    """Make ops that write into an input read a copy when that input is a graph input.

    ONNX Runtime's training-mode BatchNorm kernel writes the updated running mean and
    variance into the buffers of its inputs 3 and 4 (its outputs alias them). When
    those are graph inputs, the caller's tensors (fed without copies) would change
    behind its back; an ``Add`` of zero gives the node a buffer of its own.
    Changes are counted per node input now read through a copy.
    """

    name = "copy_inputs_written_in_place"
    op_types = frozenset({"BatchNormalization"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        inputs = {v for v in graph.inputs if isinstance(v.type, ir.TensorType)}
        names: NameAuthority | None = None
        copies: dict[ir.Value, ir.Value] = {}
        changed = 0
        for node in list(graph):
            training = node.op_type == "BatchNormalization" and int_attribute(
                node, "training_mode", 0
            )
            for index in (3, 4) if training else ():
                source = node.inputs[index] if index < len(node.inputs) else None
                if source is None or source not in inputs:
                    continue
                if source not in copies:
                    names = names or graph_names(graph)
                    zero = ir.Value(name=names.fresh(f"{source.name}.zero"))
                    zero.const_value = ir.tensor(
                        np.zeros((), dtype=source.dtype.numpy()),  # type: ignore[union-attr]
                        name=zero.name,
                    )
                    zero.type, zero.shape = ir.TensorType(source.dtype), ir.Shape([])  # type: ignore[arg-type]
                    graph.register_initializer(zero)
                    add = ir.Node(
                        "",
                        "Add",
                        [source, zero],
                        outputs=[ir.Value(name=names.fresh(f"{source.name}.copy"))],
                        name=names.fresh("Add"),
                    )
                    graph.insert_before(node, add)
                    copies[source] = add.outputs[0]
                node.replace_input_with(index, copies[source])
                changed += 1
        return {"BatchNormalization": changed}


def _sources(graph: ir.Graph) -> dict[str, set[str]]:
    """For each value, by name, the graph inputs it depends on (through nodes and subgraph
    reads).
    """
    found: dict[ir.Value, set[str]] = {v: {v.name} for v in graph.inputs if v.name}
    for node in graph:  # graphs are topologically sorted
        depends = set().union(*(found.get(v, set()) for v in reads(node)))
        for out in node.outputs:
            found[out] = depends
    return {v.name: depends for v, depends in found.items() if v.name}


def _give_outputs_their_own_writer(graph: ir.Graph, outputs: Sequence[str]) -> bool:
    """Make each output in ``outputs`` that a node also reads the output of an ``Identity`` nothing
    else reads.

    Returns:
        Whether the graph changed.
    """
    by_name = {v.name: v for v in graph.outputs}
    sources = {v.name for v in graph.inputs} | set(graph.initializers)
    names: NameAuthority | None = None
    changed = False
    for name in outputs:
        if name in sources:
            raise InvalidValueError(
                f"Output '{name}' is a graph input passed through unchanged; give it a node of "
                "its own "
                "(an Identity to a new name) to differentiate it."
            )
        value = by_name[name]
        if not value.uses():
            continue
        names = names or graph_names(graph)
        # the value keeps its readers (subgraphs included) under a new name; an Identity writes the
        # output
        value.name = names.fresh(f"{name}.value")
        copy = ir.Node(
            "",
            "Identity",
            [value],
            outputs=[ir.Value(name=name)],
            name=names.fresh(f"{name}.output"),
        )
        graph.append(copy)
        copy.outputs[0].type, copy.outputs[0].shape = value.type, value.shape
        graph.outputs[graph.outputs.index(value)] = copy.outputs[0]
        changed = True
    return changed


#: Ops whose outputs carry their inputs' values but that ONNX Runtime's gradient builder treats as a
#: dead end.
_VALUE_CARRYING_DEAD_ENDS = frozenset(
    {"SplitToSequence", "SequenceAt", "SequenceConstruct", "SequenceInsert", "ConcatFromSequence"}
)


def _refuse_silent_zero(graph: ir.Graph, name: str, outputs: Sequence[str]) -> None:
    """Raise when ONNX Runtime finds no path to ``name`` although the outputs carry its values
    through sequences.

    torch would give ``name`` a gradient there; leaving it out would be a silently wrong (zero)
    gradient.

    Raises:
        GradientError: naming the sequence nodes on the way.
    """
    upstream = upstream_values(graph, list(outputs))
    if name not in {v.name for v in upstream}:
        return
    dead = sorted(
        {
            f"{n.op_type} '{n.name}'"
            for v in upstream
            if (n := v.producer()) is not None and n.op_type in _VALUE_CARRYING_DEAD_ENDS
        }
    )
    if dead:
        raise GradientError(
            f"ONNX Runtime finds no gradient path from the outputs {preview(list(outputs))} to "
            f"'{name}', although "
            f"they carry its values through {preview(dead)}: its gradient would silently be "
            "zero. Sequence ops have "
            "no gradient in ONNX Runtime; export with static shapes (OrtModule(..., "
            "dynamic='none')) so the split "
            "becomes a Split, or split with constant lengths."
        )


class _UnreachableError(GradientError):
    """ONNX Runtime found no differentiable path from the outputs to ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _differentiate(
    forward: onnx.ModelProto,
    gradients: Sequence[str],
    ys: Sequence[str],
    custom_op_libraries: Sequence[str],
) -> onnx.ModelProto:
    """ONNX Runtime's pre-training optimizer and gradient builder, with ``ys`` as y nodes and no
    loss.
    """
    stamped = copy_model(forward)
    _limits.stamp_versions(stamped)
    wanted = set(gradients)
    try:
        return ort_bridge.run_gradient_builder(stamped, wanted, set(ys), "", custom_op_libraries)
    except ort_bridge.GradientBuilderError as failure:
        name = ort_errors.unreachable_value(failure.message)
        if name is not None and name in wanted:
            raise _UnreachableError(name) from None
        partition = ParameterPartition(tuple(gradients), (), tuple(gradients))
        message, optimized = failure.message, failure.optimized
        raise ort_bridge.explain_gradient_failure(
            message, forward, optimized, partition, ys[0]
        ) from None


def _order_signature(
    graph: ir.Graph,
    signature_inputs: dict[str, onnx.ValueInfoProto],
    user_inputs: Sequence[str],
    partition: ParameterPartition,
    differentiable: Sequence[str],
    user_outputs: Sequence[str],
    gradients: Sequence[str],
) -> None:
    """Inputs: user inputs, parameters, output gradients. Outputs: user outputs, then gradients."""
    present = {str(v.name): v for v in graph.inputs}
    inputs = [
        present.get(n) or ir.serde.deserialize_value_info_proto(signature_inputs[n], None)
        for n in (*user_inputs, *partition.parameters)
    ]
    inputs += [present[gradient_name(n)] for n in differentiable]  # declared with y's type
    signature.refuse_extra_inputs([n for n in present if n not in {v.name for v in inputs}])
    graph.inputs.clear()
    graph.inputs.extend(inputs)
    signature.order_outputs(graph, [*user_outputs, *(gradient_name(n) for n in gradients)])

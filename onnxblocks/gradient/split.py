"""Cut a vector-Jacobian product graph into a forward model and a backward model.

An autograd engine runs the forward pass when the outputs are asked for and the
backward pass later, when their gradients arrive. :func:`split_vjp_graph` cuts
the graph of :func:`~onnxblocks.gradient.vjp.build_vjp_graph` so that nothing
runs twice:

* the **forward** model holds every node the user outputs need. Its outputs are
  the user outputs, then the *saved* values: what the backward nodes read that
  the forward nodes compute (activations, Dropout masks, normalisation
  statistics). The caller keeps them between the two runs: this is the memory
  cost of not recomputing, the same set an autograd engine saves.
* the **backward** model holds the other nodes that the gradients need. Its
  inputs are the saved values, the user outputs it reads, the user inputs and
  parameters it reads, the incoming output gradients, and the large constants
  both models read (*shared*: fed by the caller from one array, not copied into
  both sessions).

Nodes that neither the outputs nor the gradients need are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import GradientError, InvalidValueError
from onnxblocks.gradient.dependencies import upstream_values
from onnxblocks.gradient.vjp import VjpGraph
from onnxblocks.ir import walk
from onnxblocks.ir.serde import from_proto
from onnxblocks.ir.types import infer_proto_types

__all__ = [
    "SHARED_CONSTANT_BYTES",
    "SplitVjp",
    "set_input_types",
    "split_vjp_graph",
    "untyped_inputs",
]

#: Constants of at least this many bytes that both models read are fed to both instead of copied
#: into each.
SHARED_CONSTANT_BYTES = 1 << 16


@dataclass(frozen=True)
class SplitVjp:
    """The two halves of a vector-Jacobian product graph.

    Attributes:
        forward: Inputs: the VJP graph's user inputs, parameters, then :attr:`shared`.
            Outputs: the user outputs, then :attr:`saved`.
        backward: Inputs: :attr:`backward_inputs`. Outputs: ``<name>_grad`` for each of
            the VJP graph's ``gradients``, in order.
        saved: Values the forward model computes for the backward model only.
        backward_inputs: The backward model's inputs, in order; each is a saved value,
            a user output, a user input or parameter, an output gradient or a shared constant.
        shared: Constants both models read, as graph inputs of both.
        shared_values: The tensors of :attr:`shared`, in order.
    """

    forward: onnx.ModelProto
    backward: onnx.ModelProto
    saved: tuple[str, ...]
    backward_inputs: tuple[str, ...]
    shared: tuple[str, ...]
    shared_values: tuple[onnx.TensorProto, ...]


def split_vjp_graph(vjp: VjpGraph, shared_bytes: int = SHARED_CONSTANT_BYTES) -> SplitVjp:
    """Cut ``vjp.model`` into its forward and backward models (``vjp`` is not mutated).

    Args:
        vjp: A graph from :func:`~onnxblocks.gradient.vjp.build_vjp_graph` with at least one
        gradient.
        shared_bytes: Constants of at least this size read by both halves become inputs of both.

    Returns:
        The two models and the names that connect them.

    Raises:
        ValueError: when ``vjp`` has no gradient.
        GradientError: when a forward node reads an output gradient (a graph ONNX Runtime should not
        build).
    """
    if not vjp.gradients:
        raise InvalidValueError(
            "The VJP graph has no gradient output: run its model as the forward model instead."
        )
    graph = vjp.model.graph
    ir_graph = from_proto(vjp.model).graph  # the same nodes, in the same order, with def-use chains
    position = {node: i for i, node in enumerate(ir_graph)}
    reads = [{v.name for v in walk.reads(node) if v.name} for node in ir_graph]
    grads_out = [gradient_name(n) for n in vjp.gradients]
    forward_nodes = _ancestors(ir_graph, vjp.outputs, position)
    backward_nodes = _ancestors(ir_graph, grads_out, position) - forward_nodes
    late = set(vjp.output_grads)
    early_reads = set().union(*(reads[i] for i in forward_nodes)) if forward_nodes else set()
    if early_reads & late:
        raise GradientError(
            f"A forward node of the VJP graph reads output gradients {sorted(early_reads & late)}. "
            "Please report this with the model."
        )
    back_reads = set().union(*(reads[i] for i in backward_nodes)) - {""}
    back_made = {out for i in backward_nodes for out in graph.node[i].output}
    initializers = {init.name: init for init in graph.initializer}
    shared = tuple(
        name
        for name, init in initializers.items()
        if name in back_reads and name in early_reads and _nbytes(init) >= shared_bytes
    )
    outputs = set(vjp.outputs)
    saved = tuple(
        dict.fromkeys(
            out
            for i in sorted(forward_nodes)
            for out in graph.node[i].output
            if out in back_reads and out not in outputs and out not in back_made
        )
    )
    graph_inputs = {vi.name: vi for vi in graph.input}
    backward_inputs = tuple(
        [n for n in graph_inputs if n in back_reads and n not in late]
        + [o for o in vjp.outputs if o in back_reads and o not in back_made]
        + list(saved)
        + list(vjp.output_grads)
        + [s for s in shared if s not in graph_inputs]
    )
    types = _value_types(vjp.model)
    forward = _submodel(
        vjp.model,
        "forward",
        sorted(forward_nodes),
        [graph_inputs[n] for n in (*vjp.user_inputs, *vjp.partition.parameters)]
        + _typed(shared, types),
        [*vjp.outputs, *saved],
        initializers,
        exclude=set(shared),
        types=types,
        reads=reads,
    )
    backward = _submodel(
        vjp.model,
        "backward",
        sorted(backward_nodes),
        [graph_inputs.get(n) or _info(n, types) for n in backward_inputs],
        grads_out,
        initializers,
        exclude=set(shared) | set(backward_inputs),
        types=types,
        reads=reads,
    )
    return SplitVjp(
        forward,
        backward,
        saved,
        backward_inputs,
        shared,
        tuple(initializers[name] for name in shared),
    )


def _ancestors(graph: ir.Graph, targets: Iterable[str], position: dict[ir.Node, int]) -> set[int]:
    """The positions of the nodes ``targets`` depend on."""
    values = upstream_values(graph, list(targets), differentiable=False)
    return {position[n] for v in values if (n := v.producer()) is not None and n in position}


def _nbytes(init: onnx.TensorProto) -> int:
    count = 1
    for d in init.dims:
        count *= d
    itemsize = helper.tensor_dtype_to_np_dtype(init.data_type).itemsize if init.data_type else 1
    return count * itemsize


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model``: declared ones, then onnx's inference (gradient ops are
    unknown to it).
    """
    types = infer_proto_types(model)
    for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output):
        if vi.type.WhichOneof("value") is not None:
            types[vi.name] = vi.type
    return types


def _info(name: str, types: dict[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
    """A ValueInfo for ``name`` with its known type, or none (filled later by
    :func:`set_input_types`).
    """
    if name in types:
        return helper.make_value_info(name, types[name])
    info = onnx.ValueInfoProto()
    info.name = name
    return info


def _typed(names: Iterable[str], types: dict[str, onnx.TypeProto]) -> list[onnx.ValueInfoProto]:
    return [_info(n, types) for n in names]


def _submodel(
    model: onnx.ModelProto,
    label: str,
    nodes: Sequence[int],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[str],
    initializers: dict[str, onnx.TensorProto],
    exclude: set[str],
    types: dict[str, onnx.TypeProto],
    reads: Sequence[set[str]],
) -> onnx.ModelProto:
    graph = model.graph
    chosen = [graph.node[i] for i in nodes]
    read = set().union(*(reads[i] for i in nodes)) if nodes else set()
    inits = [initializers[n] for n in initializers if n in read and n not in exclude]
    new_graph = helper.make_graph(
        chosen,
        f"{graph.name or 'graph'}_{label}",
        list(inputs),
        [_info(o, types) for o in outputs],
        inits,
    )
    inner = read | {o for n in chosen for o in n.output}
    new_graph.value_info.extend(vi for vi in graph.value_info if vi.name in inner)
    out = helper.make_model(new_graph, opset_imports=list(model.opset_import))
    out.functions.extend(model.functions)
    out.ir_version = model.ir_version
    _limits.stamp_versions(out)
    return out


def untyped_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs of ``model`` whose type is unknown (values only ONNX Runtime can type)."""
    return [vi.name for vi in model.graph.input if vi.type.WhichOneof("value") is None]


def set_input_types(model: onnx.ModelProto, elem_types: dict[str, int]) -> None:
    """Give untyped graph inputs of ``model`` a tensor type of unknown shape, in place."""
    for vi in model.graph.input:
        if vi.type.WhichOneof("value") is None and vi.name in elem_types:
            vi.type.CopyFrom(helper.make_tensor_type_proto(elem_types[vi.name], None))

"""Values without a gradient that ONNX Runtime's builder would give two gradients of one name.

Several of ONNX Runtime's gradient builders (``LayerNormalization``,
``SimplifiedLayerNormalization``, ``BatchNormalization``...) write the gradient of every
float input, trained or not, as ``<input>_grad``. When two such nodes read one value
that gets no gradient, both define ``<value>_grad`` and the builder fails with "Duplicate
definition of name (<value>_grad)". Its own optimizer (``get_optimized_model``) makes such
pairs out of graphs that have none:

* a folded TorchScript export (``torch.onnx.export(..., dynamo=False)``, constant folding
  on) merges identical constants: the freshly initialized norm weights (all ones) become
  one initializer read through ``Identity`` nodes named after the others; common
  subexpression elimination merges those ``Identity`` nodes, and the RMSNorm fusion then
  makes their readers ``SimplifiedLayerNormalization`` nodes of one scale;
* equal constants are merged into one (the zero biases of two batch norms).

:func:`alias_frozen_reads` prepares the forward graph so that neither can happen, in place:

* a float constant (not trained, more than one element) that several nodes read, directly
  or through ``Identity`` nodes, or whose value another such constant repeats, is lifted:
  the caller makes it a graph input while ONNX Runtime works
  (:func:`~onnxblocks.gradient.signature.held_constants_to_inputs`), since the optimizer
  merges constants, never inputs;
* each reader past the first of such a value, or of a parameter without a gradient,
  reads a graph input of its own (an *alias*), so no node can be merged with another.

:func:`restore_frozen_reads` undoes the aliases on ONNX Runtime's result: every alias is
read as the value it stands for and leaves the graph inputs. Trained values are never
aliased (ONNX Runtime sums the gradients of their readers), and constants of one element
(epsilons, exponents) stay constants, as the fusions need them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxblocks.ir.edit import values_by_name
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.walk import Read, reads_through_identity

__all__ = ["FrozenReads", "alias_frozen_reads", "restore_frozen_reads"]


@dataclass(frozen=True)
class FrozenReads:
    """What :func:`alias_frozen_reads` changed.

    Attributes:
        lifted: Constants the caller makes graph inputs while ONNX Runtime builds the gradient.
        aliases: Each alias graph input, and the value it stands for.
    """

    lifted: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.lifted or self.aliases)


def _elements(value: ir.Value) -> int | None:
    shape = _shape(value)
    dims = [d for d in shape if isinstance(d, int)] if shape is not None else []
    return math.prod(dims) if shape is not None and len(dims) == len(shape) else None


def _is_float(value: ir.Value) -> bool:
    kind = _type(value)
    return kind is not None and kind.dtype.is_floating_point()


def _twins(constants: list[ir.Value]) -> set[ir.Value]:
    """The constants whose dtype, shape and bytes another one repeats (held weights are not
    read).
    """
    groups: dict[tuple[object, ...], list[ir.Value]] = {}
    for value in constants:
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ir.ExternalTensor):
            continue  # held aside: lifted by the caller anyway, and never read here
        key = (tensor.dtype, tuple(tensor.shape), tensor.tobytes())
        groups.setdefault(key, []).append(value)
    return {v for group in groups.values() if len(group) > 1 for v in group}


def alias_frozen_reads(
    graph: ir.Graph, trained: Iterable[str], untrained_inputs: Iterable[str]
) -> FrozenReads:
    """Lift shared or repeated constants and give each reader of a value without gradient its own
    input.

    Args:
        graph: The training copy of the forward graph, parameters already graph inputs (changed in
        place).
        trained: The values whose gradient is built (never aliased).
        untrained_inputs: The parameters that are graph inputs and get no gradient (frozen).

    Returns:
        The constants to lift and the aliases made, for :func:`restore_frozen_reads`.
    """
    wanted = set(trained)
    frozen = set(untrained_inputs) - wanted
    sources = [v for v in graph.inputs if v.name in frozen and _is_float(v)]
    constants = [
        v
        for name, v in graph.initializers.items()
        if name not in wanted and _is_float(v) and (_elements(v) or 0) > 1
    ]
    lifted = {v.name for v in _twins(constants) if v.name}
    names = graph_names(graph)
    aliases: dict[str, str] = {}
    for value in [*sources, *constants]:
        reads = reads_through_identity(value)
        by_node: dict[ir.Node, list[tuple[int, str]]] = {}
        for read in reads:
            hint = read.via[-1].outputs[0].name if read.via else value.name
            by_node.setdefault(read.node, []).append((read.index, hint or "value"))
        if len(by_node) < 2:
            continue
        if value.const_value is not None and value.name:
            lifted.add(value.name)
        for node, inputs in list(by_node.items())[1:]:
            alias = ir.Value(
                name=names.fresh(f"{inputs[0][1]}.alias"), type=_type(value), shape=_shape(value)
            )
            graph.inputs.append(alias)
            aliases[alias.name or ""] = value.name or ""
            for index, _ in inputs:
                node.replace_input_with(index, alias)
        _remove_bypassed_identities(graph, reads)
    return FrozenReads(frozenset(lifted), aliases)


def _type(value: ir.Value) -> ir.TypeProtocol | None:
    tensor = value.const_value
    return value.type if value.type is not None or tensor is None else ir.TensorType(tensor.dtype)


def _shape(value: ir.Value) -> ir.Shape | None:
    tensor = value.const_value
    if value.shape is not None or tensor is None:
        return value.shape
    return ir.Shape(
        [d if isinstance(d, int) else None for d in tensor.shape]
    )  # a tensor's dims are ints


def _remove_bypassed_identities(graph: ir.Graph, reads: list[Read]) -> None:
    """Remove the ``Identity`` nodes of ``reads`` that no reader reaches any more, the farthest
    first.
    """
    removed: set[ir.Node] = set()
    for read in reads:
        for node in reversed(read.via):
            if node not in removed and not node.outputs[0].uses():
                graph.remove(node, safe=True)
                removed.add(node)


def restore_frozen_reads(graph: ir.Graph, done: FrozenReads) -> bool:
    """On ONNX Runtime's result, read each alias as its value again and drop the alias inputs (in
    place); True when the graph changed.
    """
    if not done.aliases:
        return False
    values = values_by_name(graph)
    for alias_name, source_name in done.aliases.items():
        alias = values.get(alias_name)
        if alias is None:  # ONNX Runtime dropped an input nothing read
            continue
        source = values.get(source_name)
        if alias in graph.inputs:
            graph.inputs.remove(alias)
        if source is None:  # no reader of the value itself was left: the alias takes its name
            alias.name = source_name
            graph.inputs.append(alias)
            values[source_name] = alias
            continue
        ir.convenience.replace_all_uses_with(alias, source)
    return True

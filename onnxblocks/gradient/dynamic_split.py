"""``SplitToSequence`` by a run-time chunk length as ``Slice``: the pieces of ``chunk`` / ``split``
on a dynamic dim.

``x.chunk(2, dim=0)`` or ``x.split(n, dim=0)`` exported with a symbolic batch dim
becomes ``SplitToSequence(x, c)`` with ``c`` computed from the batch size, read by
``SequenceAt`` at constant positions.
``split_to_sequence_as_split``
needs the length of the split axis; when it is symbolic, ONNX Runtime's gradient
builder finds no path through the sequence ops and the pieces would silently get
no gradient. ``split_to_sequence_as_slice`` writes piece ``i`` as
``Slice(x, i * c, (i + 1) * c)`` along the axis instead (``Slice`` clamps the last
piece, as ``SplitToSequence`` shortens it), with ``Squeeze`` for ``keepdims=0``; for a
list of lengths known at run time (``x.split([1, n - 1])``), piece ``i`` starts at the
sum of the lengths before it.

:class:`PartlyUsedSplitAsSlice` rewrites a ``Split`` some of whose outputs are unused into
``Slice`` nodes: ONNX Runtime's ``Split`` gradient would leave the unused pieces out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.edit import replace_node
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import is_default_domain, opset_of
from onnxblocks.ir.types import ValueTypes
from onnxblocks.ir.writer import Writer

__all__ = ["PartlyUsedSplitAsSlice", "SplitToSequenceAsSlice"]


class SplitToSequenceAsSlice(Pass):
    """Rewrite ``SplitToSequence`` by a run-time length or lengths, read only by ``SequenceAt`` at
    constant positions.

    A sequence read any other way, or at a negative position, is left as it is.
    """

    name = "split_to_sequence_as_slice"
    op_types = frozenset({"SplitToSequence"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        targets = [n for n in graph if n.op_type == "SplitToSequence" and is_default_domain(n)]
        if not targets:
            return {}
        constants = ConstantTable(graph)
        types: ValueTypes | None = None
        names = graph_names(graph)
        opset = opset_of(model)
        count = 0
        for node in targets:
            seq, x = node.outputs[0], node.inputs[0]
            users = list(dict.fromkeys(u.node for u in seq.uses()))
            if x is None or seq.is_graph_output() or not users or opset < 13:
                continue
            if any(
                u.graph is not graph or u.op_type != "SequenceAt" or u.inputs[0] is not seq
                for u in users
            ):
                continue
            positions = [constants.value(u.inputs[1]) for u in users]
            if any(p is None or p.size != 1 or int(p.reshape(())) < 0 for p in positions):
                continue
            split = node.inputs[1] if len(node.inputs) > 1 else None
            lengths = False  # split holds one length per piece (a 1-D list), not one chunk length
            if split is not None:
                value = constants.value(split)
                if value is not None and value.ndim != 0:
                    continue  # constant lengths: split_to_sequence_as_split's case
                if value is None:
                    types = types or ValueTypes.infer(model)
                    shape = types.shape(split)
                    if shape is None or len(shape) > 1:
                        continue
                    lengths = len(shape) == 1
            axis = int_attribute(node, "axis", 0)
            squeeze = split is None and int_attribute(node, "keepdims", 1) == 0
            w = Writer(names, opset, seq.name or "sequence")
            if split is None:
                chunk = w.ints([1])
            else:
                chunk = w.reshape(w.cast(split, ir.DataType.INT64), [-1 if lengths else 1])
            axes = w.ints([axis])
            outs: list[ir.Value] = []
            for user, position in zip(users, positions, strict=True):
                index = int(np.asarray(position).reshape(()))
                out = user.outputs[0].name or w.fresh("piece")
                if lengths:  # piece i: from the sum of the lengths before it, for its own length
                    before = w.op("Slice", [chunk, w.ints([0]), w.ints([index]), w.ints([0])])
                    starts = w.reduce("ReduceSum", before, [0], keepdims=1)
                    ends = w.op("Add", [starts, w.op("Gather", [chunk, w.ints([index])], axis=0)])
                else:
                    starts = w.op("Mul", [chunk, w.ints([index])])
                    ends = w.op("Mul", [chunk, w.ints([index + 1])])
                piece = w.op(
                    "Slice", [x, starts, ends, axes], out=w.fresh("piece") if squeeze else out
                )
                outs.append(w.squeeze(piece, [axis], out=out) if squeeze else piece)
            ir.convenience.replace_nodes_and_values(
                graph, node, [node, *users], w.nodes, [u.outputs[0] for u in users], outs
            )
            count += 1
        return {"SplitToSequence": count} if count else {}


class PartlyUsedSplitAsSlice(Pass):
    """Rewrite a ``Split`` some of whose outputs nothing reads into one ``Slice`` per output that is
    read.

    ONNX Runtime's gradient of ``Split`` concatenates the gradients of the outputs that
    have one and leaves the others out, so the input's gradient comes out too short
    (a Reshape downstream fails) or, where it still broadcasts, wrong. ``x.chunk(2, 1)[1]``
    after an in-place op exports that way. ``SliceGrad`` pads with zeros instead. The
    piece lengths must be known (a ``split`` input or attribute, or ``num_outputs`` and a
    static axis).
    """

    name = "partly_used_split_as_slice"
    op_types = frozenset({"Split"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        targets = [
            n
            for n in graph
            if n.op_type == "Split"
            and is_default_domain(n)
            and any(not o.uses() and not o.is_graph_output() for o in n.outputs)
            and any(o.uses() or o.is_graph_output() for o in n.outputs)
        ]
        if not targets:
            return {}
        opset = opset_of(model)
        if opset < 13:
            return {}
        constants = ConstantTable(graph)
        types = ValueTypes.infer(model)
        names = graph_names(graph)
        count = 0
        for node in targets:
            x = node.inputs[0]
            lengths = _split_lengths(node, constants, types)
            if x is None or lengths is None:
                continue
            axis = int_attribute(node, "axis", 0)
            w = Writer(names, opset, node.outputs[0].name or "split")
            news: list[ir.Value | None] = []
            start = 0
            for out, length in zip(node.outputs, lengths, strict=True):
                if out.uses() or out.is_graph_output():
                    news.append(w.slice(x, [start], [start + length], [axis], out=w.fresh("piece")))
                else:
                    news.append(None)
                start += length
            replace_node(node, w.nodes, news)
            count += 1
        return {"Split": count} if count else {}


def _split_lengths(node: ir.Node, constants: ConstantTable, types: ValueTypes) -> list[int] | None:
    """The length of each output of a ``Split``, or None when they are not known."""
    split = node.inputs[1] if len(node.inputs) > 1 else None
    if split is not None:
        value = constants.value(split)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]
    listed = node.attributes.get_ints("split", None)
    if listed:
        return [int(v) for v in listed]
    shape = types.shape(node.inputs[0])
    axis = int_attribute(node, "axis", 0)
    if shape is None or shape[axis] is None:
        return None
    size, count = int(shape[axis]), len(node.outputs)
    chunk = -(-size // count)  # num_outputs (opset 18), or an even split: the last piece is shorter
    lengths = [min(chunk, max(size - i * chunk, 0)) for i in range(count)]
    return lengths if sum(lengths) == size and all(lengths) else None

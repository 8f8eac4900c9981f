"""torch's gradient semantics of ``nn.Embedding`` in the exported graph: ``padding_idx`` and
``scale_grad_by_freq``.

torch's exporter writes ``F.embedding(idx, W, padding_idx, ..., scale_grad_by_freq)`` as a
plain ``Gather(W, idx)``: the forward is right, but ONNX Runtime's gradient of it would
train the padding row and ignore the frequency scaling. :func:`fit_embeddings` rewrites
each such ``Gather`` so its gradient is torch's, with a frozen copy of the weight (fed
by the wrapper as ``W.detach()``, so it takes no gradient) carrying the forward values:

* ``padding_idx = p``: ``Where(idx == p, Wf[p], Gather(W, idx))``: the same values, and
  no gradient from positions that read row ``p`` (other uses of a tied ``W`` still
  reach it, as in torch);
* ``scale_grad_by_freq``: ``Gf + (Gather(W, idx) - Gf) * (1 / count(idx))`` with
  ``Gf = Gather(Wf, idx)``: the same values (the difference is exactly zero), and the
  gradient of each position divided by how often its index occurs in the batch.

``max_norm`` renormalises the weight in place during the forward, which no exported
graph does: it is refused at the first call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import torch

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.ir import serde
from onnxblocks.ir.edit import replace_node
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.writer import Writer

__all__ = ["FrozenWeight", "fit_embeddings", "fit_embeddings_proto"]


@dataclass(frozen=True)
class FrozenWeight:
    """A graph input the wrapper feeds with a module weight, detached (it takes no gradient).

    Attributes:
        source: The weight's name.
        row: Feed only this row (``W.detach()[row : row + 1]``); the whole weight when None.
    """

    source: str
    row: int | None = None


def fit_embeddings(
    model: ir.Model, module: torch.nn.Module, weights: list[str]
) -> dict[str, FrozenWeight]:
    """Give every ``Gather`` of an Embedding's weight torch's gradient semantics, in place.

    Args:
        model: The exported model (its initializers named as the module's tensors).
        module: The exported module.
        weights: The initializers the wrapper feeds; the frozen copies are appended.

    Returns:
        The frozen copies added, by initializer name.

    Raises:
        InvalidValueError: for an Embedding with ``max_norm`` (naming it).
    """
    graph = model.graph
    added: dict[str, FrozenWeight] = {}
    names = None
    for path, sub in module.named_modules():
        if not isinstance(sub, torch.nn.Embedding):
            continue
        if sub.max_norm is not None:
            raise InvalidValueError(
                f"{f'Embedding {path!r} of {type(module).__name__}' if path else 'The Embedding'} "
                "has "
                f"max_norm={sub.max_norm}: torch renormalises its "
                "weight in place during the forward, which an exported graph cannot do. "
                "Renormalise the weight "
                "yourself between steps (torch.embedding_renorm_) and construct the Embedding "
                "without max_norm."
            )
        padding = sub.padding_idx
        if padding is None and not sub.scale_grad_by_freq:
            continue
        aliases = [n for n, p in module.named_parameters(remove_duplicate=False) if p is sub.weight]
        weight_name = next((n for n in aliases if n in graph.initializers and n in weights), None)
        if weight_name is None:  # a tied weight is exported under one of its names
            continue
        weight = graph.initializers[weight_name]
        readers = [
            u.node
            for u in weight.uses()
            if u.node.op_type == "Gather"
            and u.idx == 0
            and u.node.domain in ("", "ai.onnx")
            and u.node.graph is graph
        ]
        readers = [n for n in readers if n.attributes.get_int("axis", 0) == 0]
        if not readers:
            continue
        names = names or graph_names(graph)
        opset = model.opset_imports.get("", 17)
        whole = row = None
        if sub.scale_grad_by_freq:
            whole = _frozen(graph, names.fresh(f"{weight_name}.frozen"), weight, None)
        if padding is not None:
            row = _frozen(graph, names.fresh(f"{weight_name}.padding_row"), weight, padding)
        for frozen, spec in (
            (whole, FrozenWeight(weight_name)),
            (row, FrozenWeight(weight_name, padding)),
        ):
            if frozen is not None:
                weights.append(frozen.name or "")
                added[frozen.name or ""] = spec
        for node in readers:
            _rewrite_gather(
                node,
                weight,
                whole,
                row,
                padding,
                Writer(names, opset, node.outputs[0].name or "gather"),
            )
    return added


def _frozen(graph: ir.Graph, name: str, weight: ir.Value, row: int | None) -> ir.Value:
    """A new initializer shaped as the weight (or one row of it) that the wrapper feeds detached."""
    assert weight.const_value is not None
    data = weight.const_value.numpy()
    data = np.array(data if row is None else data[row : row + 1], copy=True)
    value = ir.Value(
        name=name,
        type=ir.TensorType(ir.DataType.from_numpy(data.dtype)),
        shape=ir.Shape(data.shape),
    )
    value.const_value = ir.Tensor(data, name=name)
    graph.register_initializer(value)
    return value


def _rewrite_gather(
    node: ir.Node,
    weight: ir.Value,
    whole: ir.Value | None,
    row: ir.Value | None,
    padding: int | None,
    w: Writer,
) -> None:
    indices = node.inputs[1]
    assert indices is not None
    gathered = w.op("Gather", [weight, indices], axis=0)
    if whole is not None:
        flat = w.reshape(indices, [-1])
        same = w.op("Equal", [w.unsqueeze(flat, [1]), w.unsqueeze(flat, [0])])
        counts = w.reduce("ReduceSum", w.cast(same, ir.DataType.FLOAT), [1], keepdims=0)
        scale = w.unsqueeze(w.reshape(w.op("Reciprocal", [counts]), w.shape(indices)), [-1])
        if weight.dtype is not None and weight.dtype != ir.DataType.FLOAT:
            scale = w.cast(scale, weight.dtype)
        values = w.op("Gather", [whole, indices], axis=0)
        gathered = w.op("Add", [values, w.op("Mul", [w.op("Sub", [gathered, values]), scale])])
    if row is not None:
        index_type = indices.dtype.numpy() if indices.dtype is not None else np.int64
        pad = w.const(np.array(padding, dtype=index_type), suffix="padding_idx")
        mask = w.unsqueeze(w.op("Equal", [indices, pad]), [-1])
        gathered = w.op("Where", [mask, row, gathered])
    final = w.op("Identity", [gathered], out=w.fresh("value"))
    replace_node(node, w.nodes, [final])


def fit_embeddings_proto(
    model: onnx.ModelProto, module: torch.nn.Module, weights: list[str]
) -> tuple[onnx.ModelProto, dict[str, FrozenWeight]]:
    """:func:`fit_embeddings` on a ModelProto: the rewritten model (the same one when nothing
    changed).
    """
    if not any(isinstance(m, torch.nn.Embedding) for m in module.modules()):
        return model, {}
    ir_model = serde.from_proto(model)
    added = fit_embeddings(ir_model, module, weights)
    return (serde.to_proto(ir_model) if added else model), added

"""Fold the float64 arithmetic of constants into the float32 (or integer) constant it yields.

Exporters compute scales in float64 from constants: torch's attention export writes
``Cast(Sqrt(Constant<double>))`` for the ``1/sqrt(sqrt(head_dim))`` it multiplies into the query
and the key. ONNX Runtime builds without float64 kernels (onnxruntime-web's native WebGPU bundle,
``onnxruntime-web/webgpu``) cannot place such a node and refuse the whole model ("Provider type for
Sqrt node ... is not set"). The value is a constant, so it is computed here once, in float64 as
the graph asks, and written as the constant the first non-float64 node produces: the same number
every runtime computed before, and no float64 left in the graph.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnxblocks.ir.edit import remove_unused_nodes, replace_node
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.writer import Writer


def _float64_constants(graph: ir.Graph, table: ConstantTable) -> list[ir.Value]:
    """The float64 ``Constant`` outputs and inline float64 initializers of ``graph``."""
    seeds = [
        v
        for v in graph.initializers.values()
        if v.const_value is not None and v.const_value.dtype == ir.DataType.DOUBLE
    ]
    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = table.value(node.outputs[0])
            if value is not None and value.dtype == np.float64:
                seeds.append(node.outputs[0])
    return seeds


class FoldFloat64Constants(Pass):
    """Replace each non-float64 value computed from float64 constants alone by its constant.

    Nothing else changes: float64 that a graph input reaches stays (it is not constant), and a
    node whose float64 constant input does not fold (an op :mod:`onnxblocks.ir.folding` does not
    evaluate) is left as it was. Changes: ``{"folded": n, "removed": m}``.
    """

    name = "fold-float64-constants"

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        opset = model.opset_imports.get("", None)
        table = ConstantTable(graph, opset=opset)
        pending = _float64_constants(graph, table)
        if not pending:
            return {}
        writer = Writer(graph_names(graph), opset or 13, "float64")
        seen: set[ir.Node] = set()
        folded = 0
        while pending:
            value = pending.pop()
            for user, _ in list(value.uses()):
                if user in seen or user.graph is not graph:
                    continue
                seen.add(user)
                results = [table.folded(out) for out in user.outputs]
                if any(r is None for r in results):
                    continue
                if all(np.asarray(r).dtype == np.float64 for r in results):
                    pending.extend(user.outputs)  # still float64: fold further down
                    continue
                writer.nodes = []
                news = [
                    writer.named_const(out.name or writer.fresh("folded"), np.asarray(r))
                    for out, r in zip(user.outputs, results, strict=True)
                ]
                replace_node(user, writer.nodes, news)
                folded += 1
        removed = remove_unused_nodes(graph) if folded else 0
        return {"folded": folded, "removed": removed}

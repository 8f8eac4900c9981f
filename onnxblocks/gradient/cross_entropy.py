"""``SoftmaxCrossEntropyLoss`` with its ``log_prob`` output, which ONNX Runtime's gradient of it
reads.

torch's exporter writes ``F.cross_entropy`` inside a module as ``SoftmaxCrossEntropyLoss``
with its loss output only; ONNX Runtime's gradient builder then fails with
``i < node_->OutputDefs().size()``. ``expose_cross_entropy_log_prob`` gives the node
its second output under a fresh name (nothing reads it in the forward graph).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import is_default_domain

__all__ = ["ExposeCrossEntropyLogProb"]


class ExposeCrossEntropyLogProb(Pass):
    """Give every ``SoftmaxCrossEntropyLoss`` its ``log_prob`` output."""

    name = "expose_cross_entropy_log_prob"
    op_types = frozenset({"SoftmaxCrossEntropyLoss"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        names: NameAuthority | None = None
        count = 0
        for node in model.graph:
            if node.op_type != "SoftmaxCrossEntropyLoss" or not is_default_domain(node):
                continue
            if len(node.outputs) >= 2 and node.outputs[1].name:
                continue
            names = names or graph_names(model.graph)
            node.resize_outputs(2)
            node.outputs[1].name = names.fresh(f"{node.outputs[0].name}.log_prob")
            count += 1
        return {"SoftmaxCrossEntropyLoss": count} if count else {}

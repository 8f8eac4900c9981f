"""Which ops a portable model may hold: standard ONNX ops, and the few contrib ops stock ONNX Runtime runs on CPU.

Stock ``onnxruntime`` (Python, ``onnxruntime-node``, ``onnxruntime-web``'s wasm
backend) implements every standard op and, from the ``com.microsoft`` domain, a set
of inference kernels. :data:`PORTABLE_CONTRIB_OPS` lists the ones a portable model
may keep; the lowerings still prefer standard ops (WebGPU and other execution
providers implement fewer contrib ops).
"""

from __future__ import annotations

import functools

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks.ir.serde import from_proto
from onnxblocks.ir.walk import all_nodes

#: ``com.microsoft`` ops that stock ONNX Runtime runs on CPU, which a portable model may hold.
PORTABLE_CONTRIB_OPS = frozenset(
    {
        "FusedMatMul",
        "TransposeMatMul",
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "QuickGelu",
        "FusedGemm",
        "FusedConv",
        "SkipLayerNormalization",
        "Range",
        "Trilu",
    }
)


@functools.lru_cache(maxsize=4096)
def is_portable_op(op_type: str, domain: str = "", opset: int | None = None) -> bool:
    """True for a standard ONNX op (at ``opset``, any opset when None) or a portable contrib op."""
    if domain in ("", "ai.onnx"):
        if not onnx.defs.has(op_type, ""):
            return False  # ONNX Runtime's own ops in the default domain: MaxPoolGrad, AveragePoolGrad...
        if opset is None:
            return True
        try:
            onnx.defs.get_schema(op_type, opset, "")
        except onnx.defs.SchemaError:
            return False
        return True
    if domain == "ai.onnx.ml":
        return onnx.defs.has(op_type, domain)
    return domain == _limits.MS_DOMAIN and op_type in PORTABLE_CONTRIB_OPS


def non_portable_ops(model: onnx.ModelProto | ir.Model) -> list[tuple[ir.Node, str, str]]:
    """Nodes of ``model`` (subgraphs included) that stock ONNX Runtime cannot run.

    Returns:
        ``(node, op_type, domain)`` of each such node (an ``onnx_ir`` node), in graph order;
        empty for a portable model.
    """
    ir_model = from_proto(model) if isinstance(model, onnx.ModelProto) else model
    graph = ir_model.graph
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx"))
    return [
        (n, n.op_type, n.domain or "ai.onnx")
        for n in all_nodes(graph)
        if not is_portable_op(n.op_type, n.domain, opset)
    ]

"""Which ops a portable model may hold: standard ONNX ops, and the few contrib ops stock ONNX Runtime runs on CPU.

Stock ``onnxruntime`` (Python, ``onnxruntime-node``, ``onnxruntime-web``'s wasm
backend) implements every standard op and, from the ``com.microsoft`` domain, a set
of inference kernels. :data:`PORTABLE_CONTRIB_OPS` lists the ones a portable model
may keep; the lowerings still prefer standard ops (WebGPU and other execution
providers implement fewer contrib ops).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from onnxblocks._core import limits as _limits

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


def non_portable_ops(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, str]]:
    """Nodes of ``model`` (subgraphs included) that stock ONNX Runtime cannot run.

    Returns:
        ``(node, op_type, domain)`` of each such node, in graph order; empty for a portable model.
    """
    opset = _limits.onnx_opset(model)
    return [
        (n, n.op_type, n.domain or "ai.onnx")
        for n in _nodes(model.graph.node)
        if not is_portable_op(n.op_type, n.domain, opset)
    ]


def _nodes(nodes: Iterable[onnx.NodeProto]) -> Iterable[onnx.NodeProto]:
    for node in nodes:
        yield node
        for attr in node.attribute:
            for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from _nodes(graph.node)

"""``FusedMatMul`` / ``TransposeMatMul`` as ``Transpose`` + ``MatMul`` (+ ``Mul`` by alpha), and contrib ``Trilu``.

Stock ONNX Runtime runs ``FusedMatMul`` on CPU, but other execution providers
(WebGPU) and other runtimes may not: standard ops run everywhere, and ONNX
Runtime's own graph optimizer fuses ``Transpose`` + ``MatMul`` back into
``FusedMatMul`` where it pays.
"""

from __future__ import annotations

import onnx

from onnxblocks.gradient import _graph
from onnxblocks.portable.context import LoweringContext, Writer, inputs, unsupported


def _swap_last_two(w: Writer, x: str, rank: int) -> str:
    return w.op("Transpose", [x], perm=[*range(rank - 2), rank - 1, rank - 2])


def fused_matmul(node: onnx.NodeProto, ctx: LoweringContext) -> list[onnx.NodeProto]:
    """``FusedMatMul(A, B) = alpha * op(A) @ op(B)``, ``op`` transposing the last two dims when asked.

    With an input of unknown rank, ``Einsum("...ij,...jk->...ik")`` (with the transposed
    subscripts) does the same without a permutation.
    """
    a, b = inputs(node, 2)
    trans_a, trans_b = _graph.int_attribute(node, "transA", 0), _graph.int_attribute(node, "transB", 0)
    if _graph.int_attribute(node, "transBatchA", 0) or _graph.int_attribute(node, "transBatchB", 0):
        raise unsupported(node, "transBatchA / transBatchB")
    alpha = _graph.float_attribute(node, "alpha", 1.0)
    w = ctx.writer(node)
    out = node.output[0]
    product = out if alpha == 1.0 else w.fresh("product")
    ranks = [ctx.rank(a) if trans_a else 2, ctx.rank(b) if trans_b else 2]
    if any(r is None for r in ranks):
        left = "...ji" if trans_a else "...ij"
        right = "...kj" if trans_b else "...jk"
        w.op("Einsum", [a, b], product, equation=f"{left},{right}->...ik")
    else:
        ra, rb = (r or 2 for r in ranks)
        if (trans_a and ra < 2) or (trans_b and rb < 2):
            raise unsupported(node, "a transposed 1-D operand")
        left = _swap_last_two(w, a, ra) if trans_a else a
        right = _swap_last_two(w, b, rb) if trans_b else b
        w.op("MatMul", [left, right], product)
    if alpha != 1.0:
        w.op("Mul", [product, w.scalar(alpha, ctx.float_type(a))], out)
    return w.nodes


def contrib_trilu(node: onnx.NodeProto, ctx: LoweringContext) -> list[onnx.NodeProto]:
    """``com.microsoft:Trilu`` as the standard ``Trilu`` (opset 14); kept as it is on older opsets."""
    if ctx.opset < 14:
        return [node]
    w = ctx.writer(node)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    w.ops("Trilu", list(node.input), list(node.output), **attrs)
    return w.nodes


LOWERINGS = {
    "FusedMatMul": fused_matmul,
    "TransposeMatMul": fused_matmul,
    "Trilu": contrib_trilu,
}

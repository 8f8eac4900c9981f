"""``FusedMatMul`` / ``TransposeMatMul`` as ``Transpose`` + ``MatMul`` (+ ``Mul`` by alpha), and
contrib ``Trilu``.

Stock ONNX Runtime runs ``FusedMatMul`` on CPU, but other execution providers
(WebGPU) and other runtimes may not: standard ops run everywhere, and ONNX
Runtime's own graph optimizer fuses ``Transpose`` + ``MatMul`` back into
``FusedMatMul`` where it pays.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxblocks.ir.rewrite import NoMatch, fail
from onnxblocks.portable.lowering_context import (
    LoweringContext,
    Writer,
    attributes,
    inputs,
    outputs,
    unsupported,
)


def _swap_last_two(w: Writer, x: ir.Value, rank: int) -> ir.Value:
    return w.op("Transpose", [x], perm=[*range(rank - 2), rank - 1, rank - 2])


def fused_matmul(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``FusedMatMul(A, B) = alpha * op(A) @ op(B)``, ``op`` transposing the last two dims when
    asked.

    With an input of unknown rank, ``Einsum("...ij,...jk->...ik")`` (with the transposed
    subscripts) does the same without a permutation.
    """
    a, b = inputs(node, 2)
    trans_a, trans_b = node.attributes.get_int("transA", 0), node.attributes.get_int("transB", 0)
    if node.attributes.get_int("transBatchA", 0) or node.attributes.get_int("transBatchB", 0):
        raise unsupported(node, "transBatchA / transBatchB")
    alpha = node.attributes.get_float("alpha", 1.0)
    w = ctx.writer(node)
    out = outputs(node, 1)[0]
    target = out if alpha == 1.0 else w.fresh("product")
    ranks = [ctx.rank(a) if trans_a else 2, ctx.rank(b) if trans_b else 2]
    if any(r is None for r in ranks):
        sub_a = "...ji" if trans_a else "...ij"
        sub_b = "...kj" if trans_b else "...jk"
        product = w.op("Einsum", [a, b], target, equation=f"{sub_a},{sub_b}->...ik")
    else:
        ra, rb = (r or 2 for r in ranks)
        if (trans_a and ra < 2) or (trans_b and rb < 2):
            raise unsupported(node, "a transposed 1-D operand")
        left = _swap_last_two(w, a, ra) if trans_a else a
        right = _swap_last_two(w, b, rb) if trans_b else b
        product = w.op("MatMul", [left, right], target)
    if alpha != 1.0:
        w.op("Mul", [product, w.scalar(alpha, ctx.float_type(a))], out)
    return w.nodes


def contrib_trilu(node: ir.Node, ctx: LoweringContext) -> list[ir.Node] | NoMatch:
    """``com.microsoft:Trilu`` as the standard ``Trilu`` (opset 14); kept on older opsets in
    ``"onnxruntime"`` mode.

    Raises:
        PortabilityError: below opset 14 in ``"standard"`` mode.
    """
    if ctx.opset < 14:
        if ctx.mode == "onnxruntime":
            return fail("the opset is below 14: kept for ONNX Runtime, which runs it")
        ctx.require_opset(node, 14, "Trilu")
    w = ctx.writer(node)
    w.ops("Trilu", list(node.inputs), outputs(node, len(node.outputs)), **attributes(node))
    return w.nodes


LOWERINGS = {
    "FusedMatMul": fused_matmul,
    "TransposeMatMul": fused_matmul,
    "Trilu": contrib_trilu,
}

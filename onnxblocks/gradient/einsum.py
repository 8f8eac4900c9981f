"""Einsum as Transpose, ReduceSum and MatMul: ONNX Runtime 1.19.2 has no gradient builder for ``Einsum``.

``torch.einsum`` exports as ``Einsum``. :func:`einsum_as_matmul` writes it with ops
that have gradients, contracting the operands left to right, two at a time:

* a letter only one operand has, and that nothing later needs, is summed first (``ReduceSum``);
* for a pair, the letters both have and that are needed later are batch dims, the
  letters both have and that are not needed are contracted; each operand is
  transposed to ``[batch, own, contracted]`` and the pair is one ``MatMul`` when each
  group has at most one letter (``"bi,ij->bj"``, ``"bhqd,bhkd->bhqk"``, outer
  products); otherwise it is a broadcast ``Mul`` and a ``ReduceSum`` over the contracted letters;
* a final ``Transpose`` puts the letters in the output's order.

The ellipsis (``...``) is expanded when the operands' ranks are known. An equation
with a letter repeated within one operand (a diagonal, ``"ii->i"``) is left as it is
(ONNX Runtime's refusal names it).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnxblocks.gradient._rewrite import NodeRewrite, RewriteContext, is_default_domain, on_proto
from onnxblocks.ir.attributes import string_attribute
from onnxblocks.ir.writer import Writer

__all__ = ["EinsumAsMatMul", "einsum_as_matmul", "parse_equation"]

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_SPARE = "".join(chr(c) for c in range(ord("A"), ord("Z") + 1)) + "".join(chr(c) for c in range(ord("a"), ord("z") + 1))


def parse_equation(equation: str, ranks: Sequence[int | None]) -> tuple[list[str], str] | None:
    """The letters of each operand and of the output, the ellipsis expanded; None when that cannot be done.

    Args:
        equation: The Einsum equation.
        ranks: Each operand's rank (None when unknown: then it may not use ``...``).
    """
    text = equation.replace(" ", "")
    inputs_text, arrow, output_text = text.partition("->")
    operands = inputs_text.split(",")
    if len(operands) != len(ranks):
        return None
    spare = [c for c in _SPARE if c not in text]
    width = 0
    for term, rank in zip(operands, ranks, strict=True):
        if "..." in term:
            if rank is None:
                return None
            width = max(width, rank - (len(term) - 3))
    if width > len(spare):
        return None
    ellipsis = "".join(spare[:width])
    letters: list[str] = []
    for term, rank in zip(operands, ranks, strict=True):
        if "..." in term:
            assert rank is not None
            own = rank - (len(term) - 3)
            term = term.replace("...", ellipsis[width - own :] if own else "")
        if not term.isalpha() or len(set(term)) != len(term) or (rank is not None and len(term) != rank):
            return None
        letters.append(term)
    if arrow:
        output = output_text.replace("...", ellipsis)
        if not (output.isalpha() or output == "") or len(set(output)) != len(output):
            return None
    else:  # implicit: the ellipsis, then the letters that occur once, in alphabetical order
        counts = {c: sum(t.count(c) for t in operands) for c in set(inputs_text) if c.isalpha()}
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1))
    if any(c not in "".join(letters) for c in output):
        return None
    return letters, output


class EinsumAsMatMul(NodeRewrite):
    """Rewrite float ``Einsum`` into ``Transpose`` / ``ReduceSum`` / ``MatMul`` (or ``Mul``) nodes."""

    name = "einsum_as_matmul"
    op_types = frozenset({"Einsum"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "Einsum" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | None:
        operands = [v for v in node.inputs if v is not None]
        if not operands or len(operands) != len(node.inputs):
            return None
        if any(ctx.types.elem(v) not in _FLOATS for v in operands):
            return None
        shapes = [ctx.types.shape(v) for v in operands]
        parsed = parse_equation(string_attribute(node, "equation", ""), [None if s is None else len(s) for s in shapes])
        if parsed is None:
            return None
        letters, output = parsed
        y = node.outputs[0].name or "einsum"
        w = ctx.writer(y)
        terms = list(zip(operands, letters, strict=True))
        value, have = terms[0]
        for index in range(1, len(terms)):
            later = output + "".join(t for _, t in terms[index + 1 :])
            value, have = _contract(w, (value, have), terms[index], later)
        value, have = _sum_out(w, value, have, output)
        if have != output:
            w.op("Transpose", [value], out=y, perm=[have.index(c) for c in output])
        else:
            w.op("Identity", [value], out=y)
        return w.nodes


einsum_as_matmul = on_proto(
    EinsumAsMatMul,
    "einsum_as_matmul",
    """Rewrite, in place, float ``Einsum`` into ``Transpose``, ``ReduceSum`` and ``MatMul`` (or ``Mul``) nodes.

    Returns:
        The number of Einsum nodes rewritten.
    """,
)


def _sum_out(w: Writer, value: ir.Value, have: str, keep: str) -> tuple[ir.Value, str]:
    """Sum ``value`` over its letters that ``keep`` does not have."""
    gone = [i for i, c in enumerate(have) if c not in keep]
    if not gone:
        return value, have
    return w.reduce("ReduceSum", value, gone, keepdims=0), "".join(c for c in have if c in keep)


def _transpose(w: Writer, value: ir.Value, have: str, order: str) -> ir.Value:
    if have == order:
        return value
    return w.op("Transpose", [value], perm=[have.index(c) for c in order])


def _contract(w: Writer, left: tuple[ir.Value, str], right: tuple[ir.Value, str], later: str) -> tuple[ir.Value, str]:
    """The product of two operands summed over the letters they share that ``later`` does not need."""
    a, la = _sum_out(w, left[0], left[1], later + right[1])
    b, lb = _sum_out(w, right[0], right[1], later + la)
    batch = "".join(c for c in la if c in lb and c in later)
    summed = "".join(c for c in la if c in lb and c not in later)
    own_a = "".join(c for c in la if c not in lb)
    own_b = "".join(c for c in lb if c not in la)
    if len(own_a) <= 1 and len(own_b) <= 1 and len(summed) <= 1:
        at = _transpose(w, a, la, batch + own_a + summed)
        bt = _transpose(w, b, lb, batch + summed + own_b)
        nb = len(batch)
        if not own_a:
            at = w.unsqueeze(at, [nb])
        if not summed:
            at = w.unsqueeze(at, [nb + 1])
            bt = w.unsqueeze(bt, [nb])
        if not own_b:
            bt = w.unsqueeze(bt, [nb + 1])
        product = w.op("MatMul", [at, bt])
        dummies = [nb + i for i, own in enumerate((own_a, own_b)) if not own]
        if dummies:
            product = w.squeeze(product, dummies)
        return product, batch + own_a + own_b
    full = batch + own_a + own_b + summed
    aligned = []
    for value, have in ((a, la), (b, lb)):
        order = "".join(c for c in full if c in have)
        moved = _transpose(w, value, have, order)
        missing = [i for i, c in enumerate(full) if c not in have]
        aligned.append(w.unsqueeze(moved, missing) if missing else moved)
    product = w.op("Mul", aligned)
    if summed:
        product = w.reduce("ReduceSum", product, list(range(len(full) - len(summed), len(full))), keepdims=0)
    return product, batch + own_a + own_b

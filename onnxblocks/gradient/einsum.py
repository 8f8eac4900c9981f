"""Einsum as Transpose, ReduceSum and MatMul: ONNX Runtime 1.19.2 has no gradient builder for
``Einsum``.

``torch.einsum`` exports as ``Einsum``. ``einsum_as_matmul`` writes it with ops that
have gradients (the steps are :mod:`onnxblocks.gradient.contraction`'s):

* the equation is parsed: explicit or implicit output (the ellipsis, then the letters that
  occur once, in alphabetical order), ``...`` expanded when the operands' ranks are known
  (broadcast from the right, as numpy does);
* a letter repeated within one operand is read along its diagonal (``"ii->i"``, ``"iij->j"``);
* the operands are contracted two at a time, the pair whose result is smallest first when
  every size is static (else left to right); a letter only one of the pair has and that
  nothing later needs is summed first; each pair is one ``MatMul`` batched over the letters
  both have that are needed later, with the transposes and reshapes that takes;
* a final ``Transpose`` puts the letters in the output's order.

So no tensor of the forward or of its gradient is larger than the largest operand or the
result of a pair (the output, for two operands): ``"sec,sm->ecm"`` is one
``[e*c, s] @ [s, m]`` product, as torch computes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnxblocks.gradient.contraction import Term, contract, diagonals, to_output
from onnxblocks.ir.attributes import string_attribute
from onnxblocks.ir.rewrite import NodeRewrite, NoMatch, RewriteContext, fail, is_default_domain

__all__ = ["EinsumAsMatMul", "parse_equation"]

_FLOATS = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
)
_SPARE = "".join(chr(c) for c in range(ord("A"), ord("Z") + 1)) + "".join(
    chr(c) for c in range(ord("a"), ord("z") + 1)
)


def parse_equation(equation: str, ranks: Sequence[int | None]) -> tuple[list[str], str] | None:
    """The letters of each operand and of the output, the ellipsis expanded; None when that cannot
    be done.

    Args:
        equation: The Einsum equation.
        ranks: Each operand's rank (None when unknown: then it may not use ``...``).
    """
    parsed = _parse(equation, ranks)
    return None if isinstance(parsed, NoMatch) else parsed


def _parse(equation: str, ranks: Sequence[int | None]) -> tuple[list[str], str] | NoMatch:
    """:func:`parse_equation`'s result, or :func:`fail` saying why the equation does not parse."""
    text = equation.replace(" ", "")
    inputs_text, arrow, output_text = text.partition("->")
    operands = inputs_text.split(",")
    if len(operands) != len(ranks):
        return fail("the equation has not one term per input")
    spare = [c for c in _SPARE if c not in text]
    width = 0
    for term, rank in zip(operands, ranks, strict=True):
        if "..." in term:
            if rank is None:
                return fail("an operand with '...' is of unknown rank")
            width = max(width, rank - (len(term) - 3))
    if width > len(spare):
        return fail("'...' spans more axes than there are spare letters")
    ellipsis = "".join(spare[:width])
    letters: list[str] = []
    for term, rank in zip(operands, ranks, strict=True):
        if "..." in term:
            assert rank is not None
            own = rank - (len(term) - 3)
            term = term.replace("...", ellipsis[width - own :] if own else "")
        if not (term.isalpha() or term == "") or (rank is not None and len(term) != rank):
            return fail("an operand's letters do not match its rank")
        letters.append(term)
    if arrow:
        output = output_text.replace("...", ellipsis)
        if not (output.isalpha() or output == "") or len(set(output)) != len(output):
            return fail("the output is not distinct letters")
    else:  # implicit: the ellipsis, then the letters that occur once, in alphabetical order
        counts = {c: sum(t.count(c) for t in operands) for c in set(inputs_text) if c.isalpha()}
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1))
    if any(c not in "".join(letters) for c in output):
        return fail("an output letter is in no operand")
    return letters, output


class EinsumAsMatMul(NodeRewrite):
    """Rewrite float ``Einsum`` into ``Transpose`` / ``ReduceSum`` / ``Reshape`` / ``MatMul``
    nodes.
    """

    name = "einsum_as_matmul"
    op_types = frozenset({"Einsum"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "Einsum" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        operands = [v for v in node.inputs if v is not None]
        if not operands or len(operands) != len(node.inputs):
            return fail("no operand, or one is missing")
        if any(ctx.types.elem(v) not in _FLOATS for v in operands):
            return fail("an operand is not of a known floating-point type")
        shapes = [ctx.types.shape(v) for v in operands]
        parsed = _parse(
            string_attribute(node, "equation", ""), [None if s is None else len(s) for s in shapes]
        )
        if isinstance(parsed, NoMatch):
            return parsed
        letters, output = parsed
        if ctx.opset < 14 and any(0 in s for s in shapes if s is not None):
            # Reshape reads a 0 as "keep the input's dim" before opset 14's allowzero
            return fail("an operand has a 0 dim and the opset is below 14")
        y = node.outputs[0].name or "einsum"
        w = ctx.writer(y)
        terms = [
            diagonals(w, Term(v, t, tuple(s) if s is not None else (None,) * len(t)))
            for v, t, s in zip(operands, letters, shapes, strict=True)
        ]
        while len(terms) > 1:
            i, j = _next_pair(terms, output)
            later = output + "".join(t.letters for k, t in enumerate(terms) if k not in (i, j))
            terms[i] = contract(w, terms[i], terms[j], later)
            del terms[j]
        to_output(w, terms[0], output, y)
        return w.nodes


def _next_pair(terms: Sequence[Term], output: str) -> tuple[int, int]:
    """The pair of terms to contract next: the smallest result when every size is static, else
    the first two.
    """
    sizes: dict[str, int] = {}
    for term in terms:
        for c, d in zip(term.letters, term.dims, strict=True):
            if d is None:
                return 0, 1
            sizes[c] = max(sizes.get(c, 1), d)
    best: tuple[int, int, int] | None = None
    for i in range(len(terms)):
        for j in range(i + 1, len(terms)):
            later = output + "".join(t.letters for k, t in enumerate(terms) if k not in (i, j))
            kept = set(terms[i].letters + terms[j].letters) & set(later)
            cost = math.prod(sizes[c] for c in kept)
            if best is None or cost < best[0]:
                best = (cost, i, j)
    assert best is not None
    return best[1], best[2]

"""Tensor contraction as ``MatMul``: operands whose axes are named by letters, contracted two at a
time.

A :class:`Term` is a tensor with one letter per axis (an Einsum operand). The steps
:mod:`onnxblocks.gradient.einsum` chains, each with ops ONNX Runtime can differentiate
and none writing a tensor larger than what it reads or what the contraction returns:

* :func:`diagonals`: a letter repeated within one term (``"ii"``) becomes one axis, the
  diagonal: the two axes moved last, merged (``Reshape``) and read with a stride of n + 1
  (``Slice``);
* :func:`sum_out`: letters nothing later needs are summed (``ReduceSum``);
* :func:`contract`: two terms become one; the letters both have and something later needs
  are batch axes, the letters both have and nothing later needs are contracted, the others
  are free. Each term is transposed to ``[batch, free, contracted]`` (the right one to
  ``[batch, contracted, free]``), reshaped to ``[batch, M, K]`` / ``[batch, K, N]`` and
  multiplied by one ``MatMul`` (batch axes broadcast as in numpy); the product is reshaped
  back to ``[batch, free of the left, free of the right]``. Without a contracted letter and
  with static batch sizes the pair is a broadcast ``Mul`` (an outer product within the batch),
  as large as its result;
* :func:`to_output`: the last term summed and transposed to the output's letters.

Sizes unknown before run time are read with ``Shape`` / ``Gather`` and combined with ``Mul``
and ``Concat`` into the reshapes' targets. A contracted letter of size 1 in one term and more in
the other (torch broadcasts it) is summed out of each term first when that 1 is static; a 1
known only at run time reaches ``MatMul``, which refuses the mismatch (exporters keep sizes of 1
static).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnxblocks.ir.writer import INT64_MAX, Writer

__all__ = ["Term", "broadcast_dim", "contract", "diagonals", "sum_out", "to_output"]

#: A size known when the graph is written (an int), or an int64 ``[1]`` value computed at run time.
Size = int | ir.Value


@dataclass
class Term:
    """A tensor with one letter per axis and the static size of each axis (None when unknown)."""

    value: ir.Value
    letters: str
    dims: tuple[int | None, ...]
    #: ``Shape(value)``, written the first time a size unknown statically is read.
    shape: ir.Value | None = None

    def dim(self, letter: str) -> int | None:
        """The static size of the (first) axis named ``letter``."""
        return self.dims[self.letters.index(letter)]


def broadcast_dim(a: int | None, b: int | None) -> int | None:
    """The size two broadcast axes give (None when it is known only at run time)."""
    if a is not None and b is not None:
        return b if a == 1 else a
    known = a if a is not None else b
    return known if known != 1 else None


def _size(w: Writer, term: Term, axis: int) -> Size:
    """The size of ``term``'s axis ``axis``: static, or ``Shape(value)[axis]`` as an int64
    ``[1]``.
    """
    dim = term.dims[axis]
    if dim is not None:
        return dim
    if term.shape is None:
        term.shape = w.shape(term.value)
    return w.op("Gather", [term.shape, w.ints([axis])], axis=0)


def _product(w: Writer, sizes: Sequence[Size]) -> Size:
    """The product of sizes (an int when all are static)."""
    static = math.prod(s for s in sizes if isinstance(s, int))
    dynamic = [s for s in sizes if not isinstance(s, int)]
    if not dynamic:
        return static
    product = dynamic[0]
    for s in dynamic[1:]:
        product = w.op("Mul", [product, s])
    return product if static == 1 else w.op("Mul", [product, w.ints([static])])


def _reshape(w: Writer, value: ir.Value, sizes: Sequence[Size]) -> ir.Value:
    """``Reshape(value)`` to ``sizes``; a 0 among them is a zero length, never "copy the input's
    dim".
    """
    if all(isinstance(s, int) for s in sizes):
        target = w.ints([int(s) for s in sizes])  # type: ignore[arg-type]
    else:
        pieces: list[ir.Value] = []
        run: list[int] = []
        for s in sizes:
            if isinstance(s, int):
                run.append(s)
                continue
            if run:
                pieces.append(w.ints(run))
                run = []
            pieces.append(s)
        if run:
            pieces.append(w.ints(run))
        target = w.concat(pieces)
    return w.op("Reshape", [value, target], allowzero=1 if w.opset >= 14 else None)


def transpose(w: Writer, term: Term, order: str) -> Term:
    """``term`` with its axes in the order of ``order`` (its letters, each once)."""
    if term.letters == order:
        return term
    perm = [term.letters.index(c) for c in order]
    value = w.op("Transpose", [term.value], perm=perm)
    return Term(value, order, tuple(term.dims[i] for i in perm))


def sum_out(w: Writer, term: Term, keep: str) -> Term:
    """``term`` summed over its letters that ``keep`` does not have."""
    gone = [i for i, c in enumerate(term.letters) if c not in keep]
    if not gone:
        return term
    value = w.reduce("ReduceSum", term.value, gone, keepdims=0)
    kept = [i for i in range(len(term.letters)) if i not in gone]
    return Term(value, "".join(term.letters[i] for i in kept), tuple(term.dims[i] for i in kept))


def diagonals(w: Writer, term: Term) -> Term:
    """``term`` with each letter it repeats read along the diagonal (one axis per letter)."""
    while True:
        letters = term.letters
        repeated = next((c for c in letters if letters.count(c) > 1), None)
        if repeated is None:
            return term
        p = letters.index(repeated)
        q = letters.index(repeated, p + 1)
        rest = [i for i in range(len(letters)) if i not in (p, q)]
        n_dim = term.dims[p] if term.dims[p] is not None else term.dims[q]
        n = n_dim if n_dim is not None else _size(w, term, p)
        moved = w.op("Transpose", [term.value], perm=[*rest, p, q])
        flat = _reshape(w, moved, [*(_size(w, term, i) for i in rest), _product(w, [n, n])])
        step = w.ints([n + 1]) if isinstance(n, int) else w.op("Add", [n, w.ints([1])])
        diagonal = w.op("Slice", [flat, w.ints([0]), w.ints([INT64_MAX]), w.ints([-1]), step])
        kept = "".join(letters[i] for i in rest) + repeated
        term = Term(diagonal, kept, (*(term.dims[i] for i in rest), n_dim))


def contract(w: Writer, left: Term, right: Term, later: str) -> Term:
    """The product of two terms summed over the letters they share that ``later`` does not need.

    Args:
        w: The writer.
        left: The left term (its letters each once: :func:`diagonals` first).
        right: The right term.
        later: The letters needed after this pair (the output's and the other terms').

    Returns:
        The term of letters ``batch + free of left + free of right``.
    """
    a = sum_out(w, left, later + right.letters)
    b = sum_out(w, right, later + a.letters)
    shared = [c for c in a.letters if c in b.letters]
    # a contracted letter of size 1 on one side broadcasts: sum the other side alone
    lone = {c for c in shared if c not in later and (a.dim(c) == 1) != (b.dim(c) == 1)}
    if lone:
        a = sum_out(w, a, "".join(c for c in a.letters if c not in lone))
        b = sum_out(w, b, "".join(c for c in b.letters if c not in lone))
    batch = "".join(c for c in a.letters if c in b.letters and c in later)
    summed = "".join(c for c in a.letters if c in b.letters and c not in later)
    free_a = "".join(c for c in a.letters if c not in b.letters)
    free_b = "".join(c for c in b.letters if c not in a.letters)
    letters = batch + free_a + free_b
    batch_dims = tuple(broadcast_dim(a.dim(c), b.dim(c)) for c in batch)
    dims = (*batch_dims, *(a.dim(c) for c in free_a), *(b.dim(c) for c in free_b))
    nb = len(batch)
    static_batch = all(a.dim(c) is not None and b.dim(c) is not None for c in batch)
    # nothing to sum: a broadcast product as large as its result; ONNX Runtime's Mul gradient needs
    # the broadcast shape, so batch sizes known only at run time take the MatMul below (K = 1)
    if not summed and static_batch:
        at = transpose(w, a, batch + free_a).value
        bt = transpose(w, b, batch + free_b).value
        if free_b:
            at = w.unsqueeze(at, list(range(nb + len(free_a), nb + len(free_a) + len(free_b))))
        if free_a:
            bt = w.unsqueeze(bt, list(range(nb, nb + len(free_a))))
        return Term(w.op("Mul", [at, bt]), letters, dims)
    at_term = transpose(w, a, batch + free_a + summed)
    bt_term = transpose(w, b, batch + summed + free_b)
    at, bt = at_term.value, bt_term.value
    if len(free_a) != 1 or len(summed) != 1:
        m = _product(w, [_size(w, at_term, nb + i) for i in range(len(free_a))])
        k = _product(w, [_size(w, at_term, nb + len(free_a) + i) for i in range(len(summed))])
        at = _reshape(w, at, [*(_size(w, at_term, i) for i in range(nb)), m, k])
    if len(free_b) != 1 or len(summed) != 1:
        k = _product(w, [_size(w, bt_term, nb + i) for i in range(len(summed))])
        n = _product(w, [_size(w, bt_term, nb + len(summed) + i) for i in range(len(free_b))])
        bt = _reshape(w, bt, [*(_size(w, bt_term, i) for i in range(nb)), k, n])
    product = w.op("MatMul", [at, bt])
    if len(free_a) == 1 and len(free_b) == 1:
        return Term(product, letters, dims)
    merged = Term(product, "", (*batch_dims, None, None))
    sizes = [
        *(_size(w, merged, i) for i in range(nb)),
        *(_size(w, at_term, nb + i) for i in range(len(free_a))),
        *(_size(w, bt_term, nb + len(summed) + i) for i in range(len(free_b))),
    ]
    return Term(_reshape(w, product, sizes), letters, dims)


def to_output(w: Writer, term: Term, output: str, out: str) -> None:
    """Write ``term`` summed to and ordered as ``output``, into the value named ``out``."""
    term = sum_out(w, term, output)
    if term.letters == output:
        w.op("Identity", [term.value], out=out)
    else:
        w.op("Transpose", [term.value], out=out, perm=[term.letters.index(c) for c in output])

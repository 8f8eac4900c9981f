"""Which repeated blocks to recompute under a byte budget (``recompute="auto"`` or ``<bytes>``).

The estimate is static: each value's bytes from its shape and element type in the training
graph, a symbolic or unknown dimension counted as 1 (so a budget for a model exported with a
symbolic batch or sequence is a budget per unit of each such dimension; export with the
training shapes for a budget in bytes). What the backward keeps from the forward is

* the values read by the backward that no candidate block recomputes (the blocks' inputs and
  outputs, values outside every block): kept whatever is chosen;
* for each block not recomputed, the activations its backward reads;
* for a recomputed block, its activations while its backward runs (its clones run just before
  its gradient and their outputs die after it), beside those of the blocks before it that are
  not recomputed (the backward runs from the last block to the first, freeing as it goes).

The estimate is the most of these alive at once. Blocks are added one at a time, each time the
one that lowers the estimate most, until it fits the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.ir import types

__all__ = ["RecomputePlan", "auto_budget", "plan", "value_bytes"]


@dataclass(frozen=True)
class RecomputePlan:
    """The blocks a budget recomputes, with the static estimates behind the choice.

    Attributes:
        chosen: Module paths of the blocks to recompute, largest activations first.
        budget: The byte budget the choice fits.
        estimate: Estimated bytes the backward keeps from the forward with ``chosen`` recomputed.
        without: The same estimate with nothing recomputed.
        fixed: The part of it no choice removes (blocks' borders, values outside every block).
        blocks: Module path -> bytes of the activations the block's backward reads.
    """

    chosen: tuple[str, ...]
    budget: int
    estimate: int
    without: int
    fixed: int
    blocks: Mapping[str, int]


def value_bytes(value: ir.Value) -> int:
    """Bytes of ``value`` from its type and shape (declared or inferred: run
    :func:`onnxblocks.ir.types.infer_types` first); symbolic or unknown dims count as 1, a value
    without a known type or shape as 0.
    """
    elem, dims = types.elem_type(value), types.dims(value)
    if elem is None or dims is None:
        return 0
    count = 1
    for dim in dims:
        count *= dim if isinstance(dim, int) and dim > 0 else 1
    return (count * ir.DataType(elem).bitwidth + 7) // 8


def auto_budget(graph: ir.Graph) -> int:
    """``"auto"``'s budget: a third of the graph's initializer bytes (its weights).

    A step then holds its weights and at most a third more of activations (the small-memory
    goal of docs/lora.md), whatever the model's size.
    """
    return sum(value_bytes(v) for v in graph.initializers.values()) // 3


def plan(
    blocks: Mapping[str, Sequence[ir.Value]],
    fixed: Sequence[ir.Value],
    budget: int,
    *,
    strict: bool,
) -> RecomputePlan:
    """Choose the blocks to recompute so the estimate fits ``budget``.

    Args:
        blocks: Each candidate block's module path -> the activations its backward reads, in
            forward order.
        fixed: Values the backward reads that no choice removes.
        budget: Bytes the backward may keep from the forward.
        strict: Refuse a budget no choice meets (a byte budget); else recompute every block
            (``"auto"``).

    Raises:
        InvalidValueError: with ``strict``, for a budget below the estimate with every block
            recomputed.
    """
    sizes = {path: sum(value_bytes(v) for v in values) for path, values in blocks.items()}
    base = sum(value_bytes(v) for v in set(fixed))
    order = list(sizes)
    chosen: list[str] = []
    while _estimate(base, order, sizes, chosen) > budget and len(chosen) < len(order):
        rest = [p for p in order if p not in chosen]
        # the block that lowers the estimate most; on a tie the larger, then the earlier
        chosen.append(
            min(rest, key=lambda p: (_estimate(base, order, sizes, [*chosen, p]), -sizes[p]))
        )
    estimate = _estimate(base, order, sizes, chosen)
    without = base + sum(sizes.values())
    if estimate > budget and strict:
        raise InvalidValueError(
            f"recompute={budget} (bytes) cannot be met: with every one of the {len(order)} "
            f"repeated blocks recomputed the backward still keeps about {estimate} bytes "
            f"(blocks' inputs and values outside the blocks; without recomputation "
            f"{without}). Pass recompute={estimate} or more, or recompute='layers'."
        )
    return RecomputePlan(
        chosen=tuple(p for p in order if p in chosen),
        budget=budget,
        estimate=estimate,
        without=without,
        fixed=base,
        blocks=sizes,
    )


def _estimate(base: int, order: list[str], sizes: Mapping[str, int], chosen: list[str]) -> int:
    """The most bytes kept at once: when the backward starts (every block not recomputed), or
    while a recomputed block's backward runs (its own activations and those of the blocks
    before it that are not recomputed: the later ones died with their backward).
    """
    kept = sum(sizes[p] for p in order if p not in chosen)
    peak, before = kept, 0
    for path in order:
        if path in chosen:
            peak = max(peak, before + sizes[path])
        else:
            before += sizes[path]
    return base + peak

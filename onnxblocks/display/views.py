"""Which nodes a picture shows: the whole graph, one part, a block's nodes, or a neighbourhood.

:func:`select` turns the view options of :func:`onnxblocks.display.show` into a
:class:`Selection`: the nodes drawn normally and, optionally, the nodes around
them drawn dimmed for context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from onnxblocks._core.errors import InvalidValueError, UnknownNameError, did_you_mean
from onnxblocks.display.graph import GraphIndex

#: The named views and the node parts each one shows.
VIEWS: dict[str, tuple[str, ...]] = {
    "full": ("forward", "loss", "backward", "accumulation", "optimizer"),
    "forward": ("forward", "loss"),
    "loss": ("loss",),
    "backward": ("backward", "accumulation"),
    "optimizer": ("optimizer",),
}

_FAMILIES = (("forward", "loss"), ("backward", "accumulation"), ("optimizer",))


@dataclass
class Selection:
    """The nodes a picture shows.

    Attributes:
        nodes: Indices of the focused nodes, in graph order.
        context: Indices of neighbouring nodes drawn dimmed, in graph order.
        description: What was selected, in words (for the caption).
        highlight: Value names to emphasise (e.g. the parameter a neighbourhood is around).
    """

    nodes: list[int]
    context: list[int] = field(default_factory=list)
    description: str = ""
    highlight: set[str] = field(default_factory=set)


def select(
    index: GraphIndex,
    view: str = "full",
    nodes: Iterable[str] | None = None,
    around: str | Sequence[str] | None = None,
    depth: int = 1,
    context: int = 0,
) -> Selection:
    """Select the nodes to draw.

    Args:
        index: The graph.
        view: ``"full"``, ``"forward"``, ``"loss"``, ``"backward"`` or ``"optimizer"``.
            Ignored when ``nodes`` or ``around`` is given.
        nodes: Names of the nodes to show (e.g. ``block.nodes``).
        around: A node or value name (or several): show its neighbourhood.
        depth: How many hops around ``around`` to include.
        context: How many hops of neighbours to add, dimmed, around the selection.

    Returns:
        The selection.

    Raises:
        ValueError: for an unknown view or a negative depth.
        UnknownNameError: for a node or value name the graph does not have.
    """
    if depth < 0 or context < 0:
        raise InvalidValueError(
            f"depth and context must be >= 0, got depth={depth}, context={context}."
        )
    highlight: set[str] = set()
    if nodes is not None:
        chosen = sorted({_node_index(index, n) for n in nodes})
        description = f"{len(chosen)} selected node(s)"
    elif around is not None:
        names = [around] if isinstance(around, str) else list(around)
        node_start: set[int] = set()
        value_start: set[int] = set()
        for name in names:
            if name in index.by_name or (name.startswith("#") and name[1:].isdigit()):
                node_start.add(_node_index(index, name))
            elif name in index.producer or name in index.consumers:
                highlight.add(name)
                if name in index.producer:
                    value_start.add(index.producer[name])
                value_start.update(index.consumers.get(name, ()))
            else:
                known = list(index.by_name) + list(index.consumers) + list(index.producer)
                raise UnknownNameError(
                    f"'{name}' is neither a node nor a value of the graph."
                    f"{did_you_mean(name, known)} "
                    "Pass a node name, a parameter, or a value name."
                )
        # A value's producer and consumers are its first hop.
        chosen = sorted(
            _grow(index, node_start, depth) | _grow(index, value_start, max(depth - 1, 0))
        )
        description = f"neighbourhood of {', '.join(names)} (depth {depth})"
    else:
        if view not in VIEWS:
            raise InvalidValueError(
                f"Unknown view '{view}'.{did_you_mean(view, VIEWS)} Choose one of {sorted(VIEWS)}."
            )
        parts = VIEWS[view]
        chosen = [i for i, p in enumerate(index.parts) if p in parts]
        description = "whole graph" if view == "full" else f"{view} part"
    extra: list[int] = []
    if context:
        # Context stays in the families of the selected nodes (a loss block's context is the
        # forward graph, not the gradient nodes that were built from it).
        chosen_parts = {index.parts[i] for i in chosen}
        allowed = {p for family in _FAMILIES if chosen_parts & set(family) for p in family}
        extra = sorted(_grow(index, set(chosen), context, allowed) - set(chosen))
    return Selection(chosen, extra, description, highlight)


def _node_index(index: GraphIndex, name: str) -> int:
    try:
        return index.node(name).index
    except KeyError as exc:
        raise UnknownNameError(str(exc.args[0])) from None


def _grow(index: GraphIndex, start: set[int], hops: int, parts: set[str] | None = None) -> set[int]:
    """``start`` plus every node within ``hops`` edges of it (either direction), optionally only
    in ``parts``.
    """
    seen = set(start)
    frontier = set(start)
    for _ in range(hops):
        nxt: set[int] = set()
        for i in frontier:
            nxt |= index.predecessors(i)
            nxt |= index.successors(i)
        if parts is not None:
            nxt = {i for i in nxt if index.parts[i] in parts}
        frontier = nxt - seen
        if not frontier:
            break
        seen |= frontier
    return seen

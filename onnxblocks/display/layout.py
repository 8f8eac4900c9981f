"""A small layered (Sugiyama-style) layout in pure Python.

Steps, each linear or near-linear in boxes + edges:

1. **Cycle breaking.** Boxes are put in topological order (ties and cycles,
   possible after grouping, are broken by their given graph order); an edge
   pointing back in that order is reversed for layering.
2. **Layering.** Longest path from the sources; sources are then pulled down to
   sit just above their first consumer (so parameters sit next to their use).
3. **Dummy boxes** on edges that span several layers, so they route around
   boxes (within a budget; beyond it long edges are drawn straight).
4. **Ordering.** A few down and up sweeps sorting each layer by the barycentre of
   its neighbours in the previous layer.
5. **Coordinates.** Each box moves toward the mean x of its neighbours; overlaps
   are resolved by averaging a left-to-right and a right-to-left packing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

#: Horizontal gap between boxes in a layer, vertical gap between layers (px).
H_GAP = 18.0
V_GAP = 34.0
MARGIN = 10.0
DUMMY_WIDTH = 8.0


@dataclass
class Layout:
    """Positions of boxes and the points of each edge.

    Attributes:
        boxes: ``key -> (x, y, width, height)`` with (x, y) the top-left corner.
        edges: ``(source key, target key, points)``; points run from the source's
            bottom (or top, for an edge drawn upward) to the target.
        width: Total width in px.
        height: Total height in px.
    """

    boxes: dict[str, tuple[float, float, float, float]]
    edges: list[tuple[str, str, list[tuple[float, float]]]]
    width: float
    height: float


def layered_layout(
    keys: Sequence[str],
    sizes: Sequence[tuple[float, float]],
    edges: Sequence[tuple[str, str]],
    sweeps: int = 4,
    iterations: int = 4,
) -> Layout:
    """Lay out boxes top to bottom in layers.

    Args:
        keys: Box ids, in graph order (the order breaks cycles and seeds the ordering).
        sizes: ``(width, height)`` of each box.
        edges: ``(source, target)`` pairs of keys; unknown keys and self-loops are ignored.
        sweeps: Barycentric ordering sweeps (each is one down and one up pass).
        iterations: Coordinate refinement passes.

    Returns:
        The layout.
    """
    acyclic = _acyclic_order(keys, edges)
    keys = [keys[i] for i in acyclic]
    sizes = [sizes[i] for i in acyclic]
    n = len(keys)
    pos_of = {k: i for i, k in enumerate(keys)}
    widths = [s[0] for s in sizes]
    heights = [s[1] for s in sizes]
    dag: list[tuple[int, int]] = []
    real_edges: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for a, b in edges:
        if a not in pos_of or b not in pos_of or a == b:
            continue
        u, v = pos_of[a], pos_of[b]
        if (u, v) in seen:
            continue
        seen.add((u, v))
        real_edges.append((u, v))
        dag.append((u, v) if u < v else (v, u))

    # Layering: longest path, then pull sources down next to their consumers.
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for u, v in dag:
        preds[v].append(u)
        succs[u].append(v)
    layer = [0] * n
    for v in range(n):
        if preds[v]:
            layer[v] = max(layer[u] for u in preds[v]) + 1
    for v in range(n - 1, -1, -1):
        if not preds[v] and succs[v]:
            layer[v] = max(min(layer[s] for s in succs[v]) - 1, 0)

    # Dummies for long edges (within a budget).
    node_layer = list(layer)
    width_of = list(widths)
    chains: dict[tuple[int, int], list[int]] = {}
    budget = 4 * n + 200
    spans = sorted(dag, key=lambda e: node_layer[e[1]] - node_layer[e[0]])
    adj_up: list[list[int]] = [[] for _ in range(n)]
    adj_down: list[list[int]] = [[] for _ in range(n)]
    for u, v in spans:
        span = node_layer[v] - node_layer[u]
        if span <= 1 or span - 1 > budget:
            if span == 1:
                adj_down[u].append(v)
                adj_up[v].append(u)
            continue
        budget -= span - 1
        chain = []
        prev = u
        for level in range(node_layer[u] + 1, node_layer[v]):
            d = len(node_layer)
            node_layer.append(level)
            width_of.append(DUMMY_WIDTH)
            adj_down.append([])
            adj_up.append([])
            adj_down[prev].append(d)
            adj_up[d].append(prev)
            chain.append(d)
            prev = d
        adj_down[prev].append(v)
        adj_up[v].append(prev)
        chains[(u, v)] = chain
    total = len(node_layer)
    n_layers = max(node_layer, default=-1) + 1
    layers: list[list[int]] = [[] for _ in range(n_layers)]
    for v in range(total):
        layers[node_layer[v]].append(v)

    # Ordering: barycentric sweeps.
    rank = [0.0] * total
    for lay in layers:
        for r, v in enumerate(lay):
            rank[v] = r

    def sort_layer(lay: list[int], neighbours: list[list[int]]) -> None:
        keyed = []
        for v in lay:
            nb = neighbours[v]
            keyed.append((sum(rank[u] for u in nb) / len(nb) if nb else rank[v], rank[v], v))
        keyed.sort()
        lay[:] = [v for _, _, v in keyed]
        for r, v in enumerate(lay):
            rank[v] = r

    for _ in range(sweeps):
        for lay in layers[1:]:
            sort_layer(lay, adj_up)
        for lay in reversed(layers[:-1]):
            sort_layer(lay, adj_down)

    # Coordinates.
    x = [0.0] * total
    for lay in layers:
        cursor = 0.0
        for v in lay:
            x[v] = cursor
            cursor += width_of[v] + H_GAP
    for it in range(iterations):
        order: list[list[int]] = layers[1:] if it % 2 == 0 else list(reversed(layers[:-1]))
        neighbours = adj_up if it % 2 == 0 else adj_down
        for lay in order:
            _place(lay, x, width_of, neighbours)
    # Centre each layer's content under the widest one is unnecessary; shift to the margin.
    min_x = min((x[v] for v in range(total)), default=0.0)
    layer_heights = [max((heights[v] for v in lay if v < n), default=0.0) for lay in layers]
    layer_y: list[float] = []
    cursor_y = MARGIN
    for h in layer_heights:
        layer_y.append(cursor_y)
        cursor_y += h + V_GAP
    boxes: dict[str, tuple[float, float, float, float]] = {}
    for v in range(n):
        level = node_layer[v]
        y = layer_y[level] + (layer_heights[level] - heights[v]) / 2
        boxes[keys[v]] = (x[v] - min_x + MARGIN, y, widths[v], heights[v])
    width = max((bx + bw for bx, _, bw, _ in boxes.values()), default=0.0) + MARGIN
    height = cursor_y - V_GAP + MARGIN if layers else 2 * MARGIN

    def centre_x(v: int) -> float:
        return x[v] - min_x + MARGIN + width_of[v] / 2

    def mid_y(v: int) -> float:
        level = node_layer[v]
        return layer_y[level] + layer_heights[level] / 2

    out_edges: list[tuple[str, str, list[tuple[float, float]]]] = []
    for u, v in real_edges:
        lo, hi = (u, v) if u < v else (v, u)
        downward = node_layer[u] < node_layer[v] or (node_layer[u] == node_layer[v] and u < v)
        src_box, dst_box = boxes[keys[u]], boxes[keys[v]]
        start = (src_box[0] + src_box[2] / 2, src_box[1] + (src_box[3] if downward else 0.0))
        end = (dst_box[0] + dst_box[2] / 2, dst_box[1] + (0.0 if downward else dst_box[3]))
        middle = [(centre_x(d), mid_y(d)) for d in chains.get((lo, hi), [])]
        if u > v:
            middle.reverse()
        out_edges.append((keys[u], keys[v], [start, *middle, end]))
    _spread_ports(out_edges, boxes)
    return Layout(boxes, out_edges, width, height)


def _spread_ports(
    edges: list[tuple[str, str, list[tuple[float, float]]]],
    boxes: dict[str, tuple[float, float, float, float]],
) -> None:
    """Spread the ends of edges meeting at one side of a box, ordered by where they come from."""
    ends: dict[tuple[str, float], list[tuple[float, int, int]]] = {}
    for k, (src, dst, points) in enumerate(edges):
        ends.setdefault((src, points[0][1]), []).append((points[1][0], k, 0))
        ends.setdefault((dst, points[-1][1]), []).append((points[-2][0], k, len(points) - 1))
    for (key, y), items in ends.items():
        if len(items) < 2:
            continue
        x, _, w, _ = boxes[key]
        items.sort()
        span = w * 0.6
        for r, (_, k, p) in enumerate(items):
            edges[k][2][p] = (x + w * 0.2 + span * r / (len(items) - 1), y)


def _acyclic_order(keys: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[int]:
    """Indices of ``keys`` in topological order.

    When every remaining box has an unplaced predecessor (a cycle), the earliest
    in the given order goes next.
    """
    pos_of = {k: i for i, k in enumerate(keys)}
    succs: list[set[int]] = [set() for _ in keys]
    indegree = [0] * len(keys)
    for a, b in edges:
        u, v = pos_of.get(a), pos_of.get(b)
        if u is None or v is None or u == v or v in succs[u]:
            continue
        succs[u].add(v)
        indegree[v] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    waiting = list(range(len(keys)))  # by given order, for breaking cycles
    heapq.heapify(waiting)
    placed = [False] * len(keys)
    order: list[int] = []
    while len(order) < len(keys):
        if ready:
            u = heapq.heappop(ready)
            if placed[u]:
                continue
        else:
            u = heapq.heappop(waiting)
            if placed[u]:
                continue
        placed[u] = True
        order.append(u)
        for v in succs[u]:
            indegree[v] -= 1
            if indegree[v] == 0 and not placed[v]:
                heapq.heappush(ready, v)
    return order


def _place(lay: list[int], x: list[float], width: list[float], neighbours: list[list[int]]) -> None:
    """Move the boxes of one layer toward their neighbours' centres without overlap."""
    if not lay:
        return
    desired = []
    for v in lay:
        nb = neighbours[v]
        centre = sum(x[u] + width[u] / 2 for u in nb) / len(nb) if nb else x[v] + width[v] / 2
        desired.append(centre - width[v] / 2)
    left = list(desired)
    for k in range(1, len(lay)):
        left[k] = max(left[k], left[k - 1] + width[lay[k - 1]] + H_GAP)
    right = list(desired)
    for k in range(len(lay) - 2, -1, -1):
        right[k] = min(right[k], right[k + 1] - width[lay[k]] - H_GAP)
    for k, v in enumerate(lay):
        x[v] = (left[k] + right[k]) / 2

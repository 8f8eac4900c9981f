"""Collapse a large graph into at most ``cap`` boxes, so pictures stay readable and fast.

Three steps, each tried only when the previous one leaves too many boxes:

1. **Name prefix and repeats.** Nodes are grouped by the scope in their name
   (``/layers.3/attn/MatMul`` is in scope ``layers.3/attn``) and by their part
   (forward, backward ...), at the deepest scope depth that fits. Sibling
   groups whose scope differs only by a number and that hold the same ops
   (``layers.0`` ... ``layers.11``) become one box with a count.
2. **Chains.** Runs of boxes joined one-to-one become one box.

If a graph still has more than ``cap`` boxes, the first ``cap - 1`` in graph order
are kept and one box says how many nodes are not drawn.

Every step is linear in the number of nodes and edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from onnxblocks.display.graph import GraphIndex

_DIGITS = re.compile(r"\d+")


@dataclass
class Group:
    """Nodes drawn as one box.

    Attributes:
        members: Node indices, in graph order.
        part: The part the nodes belong to (``forward``, ``backward`` ...), or ``mixed``.
        label: The box's title (a scope, ``layers.[0-11]/attn``, or an op type).
        repeat: How many sibling groups with the same ops this box stands for.
        truncated: True for the box standing for nodes that were not drawn.
    """

    members: list[int]
    part: str
    label: str
    repeat: int = 1
    truncated: bool = False
    scopes: list[str] = field(default_factory=list)

    @property
    def order(self) -> int:
        """Graph position of the median member: the drawing order, and which way cycles are broken.

        The median, not the first member, so that a few early helpers (a weight's
        ``Identity``) do not pull a whole group to the top.
        """
        return self.members[len(self.members) // 2] if self.members else 1 << 62


def scope_of(name: str) -> tuple[str, ...]:
    """The scope of a node name: its ``/``-separated components without the last one."""
    if "/" not in name:
        return ()
    parts = [c for c in name.split("/") if c]
    return tuple(parts[:-1])


def collapse(
    index: GraphIndex, node_ids: list[int], cap: int, target: int | None = None
) -> tuple[list[Group], str]:
    """Group ``node_ids`` into at most ``cap`` boxes, preferably at most ``target``.

    The deepest name-scope grouping with at most ``target`` boxes wins, if it
    goes at least two scopes deep; otherwise repeats are merged at depth 2 or 1
    (``layers.[0-47]/attn x48``). Failing that, the same with at most ``cap``
    boxes; failing that, chains are merged and the rest is cut.

    Args:
        index: The graph.
        node_ids: The nodes to draw, in graph order.
        cap: The most boxes to return (at least 2).
        target: A comfortable number of boxes (default ``min(cap, 80)``).

    Returns:
        The groups in graph order, and how the nodes were grouped, in words.
    """
    cap = max(cap, 2)
    target = min(cap, 80) if target is None else min(max(target, 2), cap)
    if len(node_ids) <= cap:
        return [Group([i], index.parts[i], index.nodes[i].op_type) for i in node_ids], "not grouped"
    scopes = _scopes(index, node_ids)
    max_depth = max((len(s) for s in scopes.values()), default=0)
    attempts: dict[tuple[bool, int], list[Group]] = {}

    def attempt(merge: bool, depth: int) -> list[Group]:
        if (merge, depth) not in attempts:
            attempts[(merge, depth)] = _by_prefix(index, node_ids, scopes, depth, merge)
        return attempts[(merge, depth)]

    def describe(merge: bool, depth: int) -> str:
        return f"grouped by name scope (depth {depth})" + (", repeats merged" if merge else "")

    for limit in (target, cap):
        fits = [d for d in range(max_depth, 0, -1) if len(attempt(False, d)) <= limit]
        deepest = fits[0] if fits else 0
        # Separate groups read best (no cycles between merged repeats), unless only the top scope
        # fits.
        if deepest >= 2 or (deepest and deepest == max_depth):
            return attempt(False, deepest), describe(False, deepest)
        for depth in sorted({min(2, max_depth), 1}, reverse=True) if max_depth else ():
            if len(attempt(True, depth)) <= limit:
                return attempt(True, depth), describe(True, depth)
        if deepest:
            return attempt(False, deepest), describe(False, deepest)
    how = ""
    groups = [Group([i], index.parts[i], index.nodes[i].op_type) for i in node_ids]
    if attempts:
        (merge, depth), groups = min(attempts.items(), key=lambda kv: len(kv[1]))
        how = describe(merge, depth) + ", "
    groups = _merge_chains(index, groups)
    how += "chains merged"
    if len(groups) <= cap:
        return groups, how
    kept = groups[: cap - 1]
    dropped = [m for g in groups[cap - 1 :] for m in g.members]
    kept.append(Group(sorted(dropped), "mixed", f"{len(dropped):,} more nodes", truncated=True))
    return kept, how + f", truncated to {cap} boxes"


def group_edges(index: GraphIndex, groups: list[Group]) -> list[tuple[int, int]]:
    """Edges between groups (by position in ``groups``), without duplicates or self-loops."""
    gid: dict[int, int] = {}
    for k, g in enumerate(groups):
        for m in g.members:
            gid[m] = k
    edges: set[tuple[int, int]] = set()
    for k, g in enumerate(groups):
        for m in g.members:
            for v in index.nodes[m].inputs:
                p = index.producer.get(v)
                if p is not None and p in gid and gid[p] != k:
                    edges.add((gid[p], k))
    return sorted(edges)


def _scopes(index: GraphIndex, node_ids: list[int]) -> dict[int, tuple[str, ...]]:
    """The scope of each node; an unscoped node fed by no node takes the scope of its first
    consumer.

    Exporters emit such feeders (``Identity`` of a shared weight, ``Constant``)
    without a scope; they belong with the layer that uses them.
    """
    chosen = set(node_ids)
    scopes = {i: scope_of(index.nodes[i].name) for i in node_ids}
    for i in reversed(node_ids):
        if scopes[i] or any(p in chosen for p in index.predecessors(i)):
            continue
        consumers = sorted(c for c in index.successors(i) if c in chosen and scopes[c])
        if consumers:
            scopes[i] = scopes[consumers[0]]
    return scopes


def _by_prefix(
    index: GraphIndex,
    node_ids: list[int],
    scopes: dict[int, tuple[str, ...]],
    depth: int,
    merge: bool,
) -> list[Group]:
    """Groups keyed by (part, scope prefix); with ``merge``, repeats become one group.

    Without ``merge``, a node whose scope is shallower than ``depth`` (the
    residual ``Add`` directly in ``layers.3``, beside ``layers.3/attn``) stays a
    box of its own, so that grouping does not create cycles. Merging groups such
    nodes by their own scope, and gathers the nodes that have no scope by (part,
    op type), so that a mostly scoped graph with many unscoped helpers (gradient
    accumulators, say) stays small.
    """
    keyed: dict[tuple, list[int]] = {}
    for i in node_ids:
        scope = scopes[i][:depth]
        if scope and (merge or len(scopes[i]) >= depth):
            key: tuple = (index.parts[i], scope)
        elif merge:
            key = (index.parts[i], "#op", index.nodes[i].op_type)
        else:
            key = (index.parts[i], "#", i)
        keyed.setdefault(key, []).append(i)
    groups: list[Group] = []
    if not merge:
        for key, members in keyed.items():
            groups.append(_group_for(index, key, members))
        groups.sort(key=lambda g: g.order)
        return groups
    merged: dict[tuple, list[tuple[tuple, list[int]]]] = {}
    for key, members in keyed.items():
        if len(key) == 3:  # unscoped nodes of one op type: one group already
            merged[key] = [(key, members)]
            continue
        signature = tuple(sorted(index.op_counts(members).items()))
        normal = (key[0], tuple(_DIGITS.sub("#", c) for c in key[1]), signature)
        merged.setdefault(normal, []).append((key, members))
    for items in merged.values():
        if len(items) == 1:
            groups.append(_group_for(index, *items[0]))
            continue
        members = sorted(m for _, ms in items for m in ms)
        labels = ["/".join(k[1]) for k, _ in items]
        groups.append(
            Group(members, items[0][0][0], _range_label(labels), repeat=len(items), scopes=labels)
        )
    groups.sort(key=lambda g: g.order)
    return groups


def _group_for(index: GraphIndex, key: tuple, members: list[int]) -> Group:
    if len(key) == 3:  # one unscoped node, or the unscoped nodes of one op type
        return Group(members, key[0], index.nodes[members[0]].op_type, repeat=len(members))
    label = "/".join(key[1])
    return Group(members, key[0], label, scopes=[label])


def _range_label(labels: list[str]) -> str:
    """``["layers.0/attn", "layers.1/attn", ...]`` -> ``"layers.[0-11]/attn"``."""
    pieces = [_DIGITS.split(label) for label in labels]
    numbers = [_DIGITS.findall(label) for label in labels]
    if len({tuple(p) for p in pieces}) != 1 or not numbers[0]:
        return labels[0] + " …"
    out = pieces[0][0]
    for k in range(len(numbers[0])):
        values = sorted({int(n[k]) for n in numbers})
        out += str(values[0]) if len(values) == 1 else f"[{values[0]}-{values[-1]}]"
        out += pieces[0][k + 1]
    return out


def _merge_chains(index: GraphIndex, groups: list[Group]) -> list[Group]:
    """Merge runs of groups linked one-to-one (same part) into single groups."""
    edges = group_edges(index, groups)
    outs: dict[int, list[int]] = {}
    ins: dict[int, list[int]] = {}
    for a, b in edges:
        outs.setdefault(a, []).append(b)
        ins.setdefault(b, []).append(a)
    head = list(range(len(groups)))

    def find(k: int) -> int:
        while head[k] != k:
            head[k] = head[head[k]]
            k = head[k]
        return k

    for a, b in edges:
        if (
            len(outs.get(a, ())) == 1
            and len(ins.get(b, ())) == 1
            and groups[a].part == groups[b].part
        ):
            head[find(b)] = find(a)
    merged: dict[int, list[int]] = {}
    for k in range(len(groups)):
        merged.setdefault(find(k), []).append(k)
    out: list[Group] = []
    for ks in merged.values():
        if len(ks) == 1:
            out.append(groups[ks[0]])
            continue
        members = sorted(m for k in ks for m in groups[k].members)
        ops = index.op_counts(members)
        label = "chain: " + ", ".join(list(ops)[:3]) + (" …" if len(ops) > 3 else "")
        out.append(Group(members, groups[ks[0]].part, label))
    out.sort(key=lambda g: g.order)
    return out

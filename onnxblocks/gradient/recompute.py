"""Recomputation (activation checkpointing) written into the training graph.

The gradient graph reads forward activations ("saved" values). Without recomputation every one of
them lives from the forward until its last backward reader, so a step holds the activations of
every layer at once. With recomputation, the training graph keeps only what crosses a segment's
border (a transformer layer's input, shared values such as rotary tables) and each segment's
forward nodes are cloned (``<name>_recompute``) for its backward readers.

A runtime runs a node as soon as its inputs are ready, so clones that read only forward values
would run during the forward and undo the saving (ONNX Runtime's common-subexpression elimination
would even merge them with the originals). Each value a clone reads from outside its segment is
therefore read through ``Reshape(v, Shape(v) + Size(g) * 0)``, where ``g`` is the gradient that
arrives at the segment's output: the clones run once the backward reaches the segment, and their
outputs die after their backward readers. ``Size`` of a computed value is not constant, so ONNX
Runtime's constant folding keeps the dependency (an empty ``Shape`` slice would be folded when
the shape is static); the ``Reshape`` to the same shape aliases its input and copies nothing.

Random ops (``Dropout``, ``RandomNormalLike``...) are not cloned: their outputs (the dropout mask
with them) are kept from the forward, so a recomputed segment sees the same mask and the numbers
equal those without recomputation.

Segments are found by module path (the dynamo exporter's ``pkg.torch.onnx.name_scopes``
metadata, else the TorchScript exporter's node names ``/model/layers.3/...``, else the output
names, as LoRA's ``model.layers.3.self_attn.q_proj.lora.matmul_0``): ``"layers"`` takes every
repeated block (``layers.N``, ``layer.N``, ``h.N``, ``blocks.N``, ``block.N``); a list of module
paths takes the nodes under each path as one segment.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.naming import NameAuthority
from onnxblocks.gradient.recompute_plan import RecomputePlan, auto_budget, plan
from onnxblocks.gradient.segments import check_found, check_recompute, module_scopes, segment_of
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.types import infer_types

__all__ = [
    "RecomputeReport",
    "check_recompute",
    "module_scopes",
    "recompute_segments",
    "recompute_training_model",
]

logger = logging.getLogger(__name__)

#: Ops whose outputs differ from run to run: kept from the forward, never cloned.
_RANDOM = frozenset(
    {
        "Dropout",
        "BitmaskDropout",
        "BiasDropout",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)
_SUFFIX = "_recompute"


@dataclass
class RecomputeReport:
    """What :func:`recompute_segments` did.

    Attributes:
        segments: The module path of each recomputed segment, in graph order.
        cloned: How many forward nodes were cloned, in all.
        skipped: Segments left as they were, with the reason.
        plan: For ``"auto"`` or a byte budget, the blocks chosen and the estimates behind them.
    """

    segments: list[str] = field(default_factory=list)
    cloned: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    plan: RecomputePlan | None = None


def _plan(
    model: ir.Model, policy: str | int, segments: dict[str, _Segment], forward: set[ir.Node]
) -> RecomputePlan:
    """The blocks ``"auto"`` or a byte budget recomputes, from the static estimate."""
    infer_types(model)
    saved = {v for s in segments.values() for v in s.saved}
    fixed = [
        out
        for node in forward
        for out in node.outputs
        if out not in saved and any(use.node not in forward for use in out.uses())
    ]
    blocks = {path: s.saved for path, s in segments.items()}
    if isinstance(policy, int):
        return plan(blocks, fixed, policy, strict=True)
    return plan(blocks, fixed, auto_budget(model.graph), strict=False)


def _ancestors(outputs: Sequence[ir.Value]) -> set[ir.Node]:
    seen: set[ir.Node] = set()
    stack = [v.producer() for v in outputs]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(v.producer() for v in node.inputs if v is not None)
    return seen


def _descendants(nodes: Iterable[ir.Node]) -> set[ir.Node]:
    seen: set[ir.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for out in node.outputs:
            stack.extend(use.node for use in out.uses())
    return seen


def _constant(value: ir.Value) -> bool:
    """A value fixed when the model is built (an initializer that is no input, a Constant)."""
    producer = value.producer()
    if producer is not None:
        return producer.op_type == "Constant"
    return value.const_value is not None and not value.is_graph_input()


class _Segment:
    """One segment's forward nodes and the values its backward reads."""

    def __init__(self, path: str, nodes: list[ir.Node], forward: set[ir.Node]) -> None:
        self.path = path
        self.nodes = set(nodes)
        self.order = nodes
        kept: set[ir.Value] = set()
        self.saved: list[ir.Value] = []
        for node in nodes:
            for out in node.outputs:
                readers = {use.node for use in out.uses()}
                outside = any(r in forward and r not in self.nodes for r in readers)
                if outside or out.is_graph_output() or node.op_type in _RANDOM:
                    kept.add(out)
                elif any(r not in forward for r in readers):
                    self.saved.append(out)
        self.kept = kept

    def clones_needed(self) -> list[ir.Node]:
        """The segment's nodes the saved values depend on (through values not kept), in order."""
        need: set[ir.Node] = set()
        stack = list(self.saved)
        while stack:
            value = stack.pop()
            producer = value.producer()
            if producer is None or producer not in self.nodes or value in self.kept:
                continue
            if producer in need:
                continue
            need.add(producer)
            stack.extend(v for v in producer.inputs if v is not None)
        return [n for n in self.order if n in need]


def recompute_segments(
    model: ir.Model,
    policy: str | int | tuple[str, ...],
    forward_outputs: Sequence[str],
    scopes: Mapping[str, str] | None = None,
) -> RecomputeReport:
    """Clone each segment's forward for its backward readers (in place, on the training model).

    Args:
        model: The training model (forward, loss and gradient graph).
        policy: ``"layers"``, ``"auto"``, a byte budget or module paths, as
            :func:`check_recompute` returns them.
        forward_outputs: The forward graph's outputs (the loss first): what the forward computes.
        scopes: Node name -> module path, read from the forward model (:func:`module_scopes`).

    Returns:
        The segments recomputed and those skipped, with the reason.

    Raises:
        UnknownNameError: for a module path that names no node of the graph.
        InvalidValueError: for ``"layers"``, ``"auto"`` or a budget on a graph without repeated
            blocks, or a budget no choice of blocks meets.
    """
    report = RecomputeReport()
    if policy == "none":
        return report
    graph = model.graph
    by_name = {v.name: v for v in graph.outputs}
    forward = _ancestors([by_name[n] for n in forward_outputs if n in by_name])
    groups: dict[str, list[ir.Node]] = {}
    for node in graph:
        if node in forward:
            key = segment_of(node, policy, scopes or {})
            if key is not None:
                groups.setdefault(key, []).append(node)
    check_found(policy, groups)
    segments = {path: _Segment(path, nodes, forward) for path, nodes in groups.items()}
    if policy == "auto" or isinstance(policy, int):
        report.plan = _plan(model, policy, segments, forward)
        segments = {p: segments[p] for p in segments if p in set(report.plan.chosen)}
    names = graph_names(graph)
    values = {out.name: out for node in graph for out in node.outputs if out.name}
    for path, segment in segments.items():
        done = _recompute_one(graph, segment, values, names, forward)
        if isinstance(done, str):
            report.skipped[path] = done
            logger.debug("recompute: segment %s left as it is: %s", path, done)
            continue
        report.segments.append(path)
        report.cloned += done
    if report.segments:
        graph.sort()
    return report


def recompute_training_model(
    model: ir.Model,
    policy: str | int | tuple[str, ...],
    forward_outputs: Sequence[str],
    scopes: Mapping[str, str] | None = None,
) -> None:
    """:func:`recompute_segments` on the training model's IR (in place), with its report logged.

    Raises:
        UnknownNameError, InvalidValueError: as :func:`recompute_segments`.
    """
    if policy == "none":
        return
    report = recompute_segments(model, policy, forward_outputs, scopes)
    if report.plan is not None:
        logger.info(
            "recompute: budget %d bytes, estimate %d bytes kept (%d without recomputation)",
            report.plan.budget,
            report.plan.estimate,
            report.plan.without,
        )
    logger.info(
        "recompute: %d segments, %d forward nodes cloned; left alone: %s",
        len(report.segments),
        report.cloned,
        report.skipped or "none",
    )


def _recompute_one(
    graph: ir.Graph,
    segment: _Segment,
    values: dict[str, ir.Value],
    names: NameAuthority,
    forward: set[ir.Node],
) -> str | int:
    """Clone ``segment`` for its backward readers: the clone count, or why nothing was done."""
    if not segment.saved:
        return "its backward reads none of its activations"
    readers = {use.node for v in segment.saved for use in v.uses() if use.node not in forward}
    later = _descendants(readers)
    triggers = [
        values[gradient_name(v.name)]
        for v in segment.kept
        if v.name and gradient_name(v.name) in values
    ]
    triggers = [t for t in triggers if t.producer() not in later and t.producer() not in forward]
    if not triggers:
        return "no gradient of its outputs arrives before its backward"
    clones = segment.clones_needed()
    hint = segment.path
    made: list[ir.Node] = []

    def add(op: str, inputs: list[ir.Value], **attrs: int) -> ir.Value:
        node = ir.Node(
            "",
            op,
            inputs,
            attributes=[ir.AttrInt64(k, v) for k, v in attrs.items()],
            name=names.fresh(f"{hint}/{op}{_SUFFIX}"),
        )
        node.outputs[0].name = names.fresh(f"{hint}.{op.lower()}{_SUFFIX}")
        made.append(node)
        return node.outputs[0]

    zero = None
    for trigger in sorted(triggers, key=lambda t: t.name or ""):
        size = add("Size", [trigger])
        term = add("Mul", [size, _int_zero(graph, names)])
        zero = term if zero is None else add("Add", [zero, term])
    assert zero is not None
    routed: dict[ir.Value, ir.Value] = {}
    mapping: dict[ir.Value, ir.Value] = {}

    def read(value: ir.Value | None) -> ir.Value | None:
        if value is None or value in mapping:
            return mapping.get(value) if value is not None else None
        if _constant(value):
            return value
        if value not in routed:
            shape = add("Add", [add("Shape", [value]), zero])
            routed[value] = add("Reshape", [value, shape])
            if value.type is not None:
                routed[value].type, routed[value].shape = value.type, value.shape
        return routed[value]

    for node in clones:
        clone = ir.Node(
            node.domain,
            node.op_type,
            [read(v) for v in node.inputs],
            attributes=list(node.attributes.values()),
            num_outputs=len(node.outputs),
            name=names.fresh(f"{node.name or node.op_type}{_SUFFIX}"),
            version=node.version,
        )
        for old, new in zip(node.outputs, clone.outputs, strict=True):
            new.name = names.fresh(f"{old.name or node.op_type}{_SUFFIX}")
            if old.type is not None:
                new.type, new.shape = old.type, old.shape
            mapping[old] = new
        made.append(clone)
    for value in segment.saved:
        for use in list(value.uses()):
            if use.node not in forward:
                use.node.replace_input_with(use.idx, mapping[value])
    graph.extend(made)
    return len(clones)


def _int_zero(graph: ir.Graph, names: NameAuthority) -> ir.Value:
    """An int64 scalar 0 initializer of ``graph`` (one per graph)."""
    for value in graph.initializers.values():
        if value.meta.get("onnxblocks.recompute_zero"):
            return value
    name = names.fresh(f"recompute{_SUFFIX}.zero")
    value = ir.Value(name=name, const_value=ir.tensor(0, dtype=ir.DataType.INT64, name=name))
    value.dtype, value.shape = ir.DataType.INT64, ir.Shape([])
    value.meta["onnxblocks.recompute_zero"] = True
    graph.register_initializer(value)
    return value

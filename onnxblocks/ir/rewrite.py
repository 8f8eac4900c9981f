"""The one rewrite base: replace each node a predicate picks by the nodes a rewrite writes.

A :class:`NodeRewrite` is an :class:`onnxblocks.ir.passes.Pass`. Its
:meth:`~NodeRewrite.rewrite` reads one selected node through the
:class:`RewriteContext` (opset, the types on the values, constants, a
:class:`~onnxblocks.ir.writer.Writer`) and returns the new nodes, or
:func:`fail` saying why it keeps the node ("the input's shape is not known"). Each
output of the old node is taken over by the new node output of the same name
(``out=`` in the writer), so a rewrite reads like the maths and the def-use chains
are rewired by :func:`onnxblocks.ir.edit.replace_node`.

The reasons a rewrite did not apply are logged at debug level (logger
``onnxblocks.ir.rewrite``) and kept on the pass (:attr:`NodeRewrite.misses`): how a
newcomer learns what each rule needs. The portable lowering's context
(:class:`onnxblocks.portable.lowering_context.LoweringContext`) is this context too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.attributes import ints_attribute
from onnxblocks.ir.edit import replace_node
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.types import ValueTypes
from onnxblocks.ir.writer import Writer

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NoMatch:
    """Why a rewrite left a node as it is (false in a boolean test).

    Attributes:
        reason: What the rewrite needed and did not find, e.g. "the input's shape is not known".
    """

    reason: str

    def __bool__(self) -> bool:
        return False


def fail(reason: str) -> NoMatch:
    """The answer of a rewrite that does not apply to a node, saying why."""
    return NoMatch(reason)


def note_miss(misses: list[tuple[str, str]], pass_name: str, node: ir.Node, reason: str) -> None:
    """Keep in ``misses`` why the pass ``pass_name`` left ``node`` as it is, and log it at debug
    level (for :class:`NodeRewrite` and the portable lowering alike).
    """
    misses.append((node.name or "", reason))
    logger.debug("%s left %s %r: %s", pass_name, node.op_type, node.name, reason)


def opset_of(model: ir.Model) -> int:
    """The model's default-domain opset (the library's default when it imports none)."""
    for domain in ("", "ai.onnx"):
        if domain in model.opset_imports:
            return model.opset_imports[domain]
    return _limits.DEFAULT_ONNX_OPSET


def is_default_domain(node: ir.Node) -> bool:
    """True for a node of the ai.onnx domain."""
    return node.domain in ("", "ai.onnx")


def optional_input(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``, or None when it is absent."""
    return node.inputs[index] if len(node.inputs) > index else None


def name_of(value: ir.Value) -> str:
    """The name of a value (every value a pass reads by name is named)."""
    return value.name or ""


class RewriteContext:
    """What a :class:`NodeRewrite` reads: the opset, and types, names and constants computed on
    first use.

    Types and constants are computed from the graph before any replacement of the pass.
    """

    #: The writer class :meth:`writer` makes.
    writer_class: type[Writer] = Writer

    def __init__(self, model: ir.Model, opset: int | None = None) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = opset_of(model) if opset is None else opset

    @cached_property
    def types(self) -> ValueTypes:
        """The reader of the types on the graph's values (inferred onto them on first use)."""
        return ValueTypes.infer(self.model)

    @cached_property
    def names(self) -> NameAuthority:
        """The graph's name authority."""
        return graph_names(self.graph)

    @cached_property
    def constants(self) -> ConstantTable:
        """Constants, folded with the opset and the inferred types."""
        return ConstantTable(self.graph, self.opset, self.types)

    @cached_property
    def plain_constants(self) -> ConstantTable:
        """Constants, folded with the opset, without inferring types (cheaper)."""
        return ConstantTable(self.graph, self.opset)

    def dtype(self, value: ir.Value | None) -> np.dtype | None:
        """The numpy dtype of ``value``, or None when its element type is unknown."""
        return self.types.dtype(value)

    def reduction_axes(self, node: ir.Node) -> list[int] | None:
        """A Reduce* node's axes, from its ``axes`` input (opset 18) or attribute; None when known
        only at run time.

        An empty list means no axes were given (every axis, or none with ``noop_with_empty_axes``).
        """
        axes_input = optional_input(node, 1)
        if axes_input is None:
            return ints_attribute(node, "axes", [])
        value = self.constants.folded(axes_input)
        return None if value is None else [int(a) for a in value.reshape(-1)]

    def writer(self, hint: str | ir.Node) -> Writer:
        """A :attr:`writer_class` at the model's opset naming its values after ``hint`` (a node:
        its name, else its op type).
        """
        if isinstance(hint, ir.Node):
            hint = hint.name or hint.op_type
        return self.writer_class(self.names, self.opset, hint)


class NodeRewrite(Pass):
    """Replace each top-level node :meth:`select` picks by the nodes :meth:`rewrite` returns.

    Nothing is done (and nothing inferred) when no node is selected or the model's
    opset is below :attr:`min_opset`. Every selected node is rewritten before any is
    replaced, so each rewrite reads the graph as it was; replacements then take the
    places of the nodes they replace. Changes are counted per op type replaced.
    """

    #: The lowest default-domain opset the rewrite writes for (None: any).
    min_opset: int | None = 13
    #: The op types :meth:`select` can pick (None: unknown), for :func:`may_apply`.
    op_types: frozenset[str] | None = None

    def select(self, node: ir.Node) -> bool:
        """True for a node to rewrite."""
        raise NotImplementedError

    #: Why the last run left selected nodes as they were: (node name, reason).
    misses: list[tuple[str, str]]

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        """The nodes replacing ``node`` (outputs named as ``node``'s), or :func:`fail` saying why
        it keeps the node (a bare None keeps it too, kept in :attr:`misses` as "no reason given").

        The returned list may hold ``node`` itself (edited in place): the others are
        then inserted before it and nothing is replaced.
        """
        raise NotImplementedError

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        self.misses = []
        targets = [n for n in model.graph if self.select(n)]
        if not targets:
            return {}
        opset = opset_of(model)
        if self.min_opset is not None and opset < self.min_opset:
            self.misses = [
                (n.name or "", f"the model's opset is below {self.min_opset}") for n in targets
            ]
            return {}
        ctx = RewriteContext(model, opset)
        planned = [(node, self.rewrite(node, ctx)) for node in targets]
        changes: dict[str, int] = {}
        for node, new_nodes in planned:
            if new_nodes is None or isinstance(new_nodes, NoMatch):
                reason = new_nodes.reason if new_nodes is not None else "no reason given"
                note_miss(self.misses, self.name, node, reason)
                continue
            changes[node.op_type] = changes.get(node.op_type, 0) + 1
            apply_rewrite(node, new_nodes)
        return changes


def apply_rewrite(node: ir.Node, new_nodes: Sequence[ir.Node]) -> None:
    """Put ``new_nodes`` where ``node`` is; each output of ``node`` is replaced by the new output
    of its name.
    """
    if any(n is node for n in new_nodes):
        graph = node.graph
        assert graph is not None, f"node {node.name!r} belongs to no graph"
        before = [n for n in new_nodes if n is not node]
        if before:
            graph.insert_before(node, before)
        return
    produced = {v.name: v for n in new_nodes for v in n.outputs if v.name}
    replace_node(node, new_nodes, [produced.get(v.name) if v.name else None for v in node.outputs])


def may_apply(passes: Sequence[Pass], model: onnx.ModelProto | ir.Model) -> bool:
    """False when no pass of ``passes`` can change ``model``, so the IR need not be built at all.

    That is when every pass declares the op types it rewrites (``op_types``) and none
    of them is a top-level op of ``model``.
    """
    present: set[str] | None = None
    for p in passes:
        op_types = getattr(p, "op_types", None)
        if op_types is None:
            return True
        if present is None:
            nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
            present = {n.op_type for n in nodes}
        if op_types & present:
            return True
    return False


def changed(result: Mapping[str, int]) -> int:
    """The total of a pass's changes."""
    return sum(result.values())


def run_pass(pass_: Pass, model: ir.Model) -> Mapping[str, int]:
    """Run ``pass_`` on ``model``; return its changes by kind."""
    return getattr(pass_(model), "changes", {})

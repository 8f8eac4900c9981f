"""Protobuf graph helpers kept for the packages that still edit ``ModelProto`` s (no onnxruntime here).

The gradient passes edit the IR (:mod:`onnxblocks.ir`, :mod:`onnxblocks.gradient._rewrite`);
these helpers remain for callers outside ``gradient/`` until they move to the IR too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import numpy_helper

from onnxblocks._core.naming import NameAuthority

# re-exported: the passes read values through `_graph`
from onnxblocks.gradient._values import attribute as attribute
from onnxblocks.gradient._values import elem_type as elem_type
from onnxblocks.gradient._values import float_attribute as float_attribute
from onnxblocks.gradient._values import floats_attribute as floats_attribute
from onnxblocks.gradient._values import infer_types as infer_types
from onnxblocks.gradient._values import int_attribute as int_attribute
from onnxblocks.gradient._values import ints_attribute as ints_attribute
from onnxblocks.gradient._values import set_attribute as set_attribute
from onnxblocks.gradient._values import shape_of as shape_of
from onnxblocks.gradient._values import static_dims as static_dims
from onnxblocks.gradient._values import string_attribute as string_attribute
from onnxblocks.gradient._values import strings_attribute as strings_attribute


def name_authority(graph: onnx.GraphProto) -> NameAuthority:
    """A NameAuthority that knows every value and node name of ``graph``."""
    used: set[str] = set()
    used.update(i.name for i in graph.input)
    used.update(i.name for i in graph.initializer)
    used.update(o.name for o in graph.output)
    used.update(v.name for v in graph.value_info)
    for node in graph.node:
        used.update(node.output)
        used.update(node.input)
        if node.name:
            used.add(node.name)
    return NameAuthority(used)


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Map each value name to the nodes that read it (subgraph reads included, attributed to the outer node)."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in set(node.input) | subgraph_reads(node):
            if name:
                readers[name].append(node)
    return readers


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` read (outer values included; recursively)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                names.update(inner.input)
                names |= subgraph_reads(inner)
    return names


def copy_structure(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model`` (callers pass working models whose large weights are stubs)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def constant_node(name: str, value: np.ndarray, names: NameAuthority) -> onnx.NodeProto:
    """A ``Constant`` node whose output ``name`` holds ``value``."""
    return onnx.helper.make_node(
        "Constant", [], [name], name=names.fresh("Constant"), value=numpy_helper.from_array(value, name)
    )


def is_default_domain(node: onnx.NodeProto) -> bool:
    """True for a node of the ai.onnx domain."""
    return node.domain in ("", "ai.onnx")


class NodeWriter:
    """Writes the nodes of one rewrite: fresh names, opset-aware forms of ops whose inputs changed.

    Each method appends its nodes to :attr:`nodes` and returns the name of the
    (first) output. ``out=`` gives an output its final name (the name of the value
    being rewritten); other outputs get fresh names built from ``hint``.
    """

    def __init__(self, names: NameAuthority, opset: int, hint: str) -> None:
        self.names = names
        self.opset = opset
        self.hint = hint
        self.nodes: list[onnx.NodeProto] = []

    def fresh(self, suffix: str) -> str:
        """A new value name ``<hint>.<suffix>_<n>``."""
        return self.names.fresh(f"{self.hint}.{suffix}")

    def op(self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "", **attrs: Any) -> str:
        """One node with one output."""
        (output,) = self.ops(op_type, inputs, [out or self.fresh(op_type.lower())], domain=domain, **attrs)
        return output

    def ops(self, op_type: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: Any) -> list[str]:
        """One node with the given outputs (``attrs``: any value ``onnx.helper.make_attribute`` takes)."""
        self.nodes.append(
            onnx.helper.make_node(
                op_type, inputs, outputs, name=self.names.fresh(op_type), domain=domain or None, **attrs
            )
        )
        return outputs

    def const(
        self, value: np.ndarray | float | int | list, dtype: npt.DTypeLike | None = None, suffix: str = "const"
    ) -> str:
        """A Constant node with ``value`` (numpy dtype ``dtype``)."""
        array = np.asarray(value, dtype=dtype)
        name = self.fresh(suffix)
        self.nodes.append(constant_node(name, array, self.names))
        return name

    def ints(self, values: list[int] | tuple[int, ...]) -> str:
        """An int64 1-D constant."""
        return self.const(np.array(list(values), dtype=np.int64), suffix="ints")

    def unsqueeze(self, x: str, axes: list[int], out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)], out)
        return self.op("Unsqueeze", [x], out, axes=axes)

    def squeeze(self, x: str, axes: list[int], out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)], out)
        return self.op("Squeeze", [x], out, axes=axes)

    def reduce_mean(self, x: str, axes: list[int], keepdims: int = 1, out: str | None = None) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.ints(axes)], out, keepdims=keepdims)
        return self.op("ReduceMean", [x], out, axes=axes, keepdims=keepdims)

    def slice(
        self,
        x: str,
        starts: list[int],
        ends: list[int],
        axes: list[int],
        steps: list[int] | None = None,
        out: str | None = None,
    ) -> str:
        inputs = [x, self.ints(starts), self.ints(ends), self.ints(axes)]
        if steps is not None:
            inputs.append(self.ints(steps))
        return self.op("Slice", inputs, out)

    def split(self, x: str, lengths: list[int], axis: int, outputs: list[str] | None = None) -> list[str]:
        outputs = outputs or [self.fresh("piece") for _ in lengths]
        if self.opset >= 13:
            return self.ops("Split", [x, self.ints(lengths)], outputs, axis=axis)
        return self.ops("Split", [x], outputs, axis=axis, split=list(lengths))

    def index_range(self, start: str, limit: str, delta: str) -> str:
        """``Range(start, limit, delta)`` to be used as ``Gather`` indices.

        An ``Abs`` (the indices are not negative) sits between them: ONNX Runtime's
        GatherToSliceFusion turns ``Gather(x, Range(...))`` into a ``Slice`` that reads
        a limit of -1 as "the last element", so a descending range to -1 (a flip) would
        select nothing; its NoopElimination removes an ``Add`` of 0.
        """
        return self.op("Abs", [self.op("Range", [start, limit, delta])])

    def pad(self, x: str, pads: list[int], out: str | None = None) -> str:
        if self.opset >= 11:
            return self.op("Pad", [x, self.ints(pads)], out)
        return self.op("Pad", [x], out, pads=pads)

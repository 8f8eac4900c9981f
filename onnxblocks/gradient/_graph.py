"""Small graph helpers shared by the gradient passes (no onnxruntime here)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import cached_property

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core import limits as _limits
from onnxblocks._core import weights as _weights
from onnxblocks._core.naming import NameAuthority


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
        for name in set(node.input) | _subgraph_reads(node):
            if name:
                readers[name].append(node)
    return readers


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for inner in g.node:
                names.update(inner.input)
                names |= _subgraph_reads(inner)
    return names


#: Ops :meth:`ConstantTable.folded` evaluates when all their inputs are constants (index arithmetic).
_FOLDABLE = frozenset(
    {
        "Constant",
        "ConstantOfShape",
        "Concat",
        "Cast",
        "Unsqueeze",
        "Squeeze",
        "Slice",
        "Reshape",
        "Transpose",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Gather",
        "Identity",
        "Range",
        "Expand",
        "Flatten",
        "Min",
        "Max",
        "Abs",
        "Floor",
        "Ceil",
        "Sqrt",
    }
)
#: Largest result (elements) folding produces.
_FOLD_LIMIT = 4096


class ConstantTable:
    """Values of a graph's Constant nodes and inline initializers, by name (indexed once)."""

    def __init__(
        self, graph: onnx.GraphProto, opset: int | None = None, types: dict[str, onnx.TypeProto] | None = None
    ) -> None:
        self._initializers = {i.name: i for i in graph.initializer}
        self._constants = {
            n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output
        }
        self._producers = {o: n for n in graph.node for o in n.output if o}
        self._opset = opset
        self._types = types or {}
        self._folded: dict[str, np.ndarray | None] = {}

    def value(self, name: str) -> np.ndarray | None:
        """The value of ``name``, or None when it is not a known constant (held weights included)."""
        init = self._initializers.get(name)
        if init is not None:
            if _weights.is_stub(init) or init.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(init)
        node = self._constants.get(name)
        if node is None:
            return None
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
            if attr.name == "value_int":
                return np.array(attr.i, dtype=np.int64)
            if attr.name == "value_ints":
                return np.array(list(attr.ints), dtype=np.int64)
            if attr.name == "value_float":
                return np.array(attr.f, dtype=np.float32)
            if attr.name == "value_floats":
                return np.array(list(attr.floats), dtype=np.float32)
        return None

    def folded(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The value of ``name``, also when small index arithmetic on constants computes it, else None.

        The torchscript exporter without constant folding computes pads, scales and
        shapes with Concat / Cast / Slice... of Constants; onnx's reference evaluator
        runs those nodes (results up to 4096 elements).
        """
        direct = self.value(name)
        if direct is not None or self._opset is None:
            return direct
        if name in self._folded:
            return self._folded[name]
        self._folded[name] = None  # also guards cycles
        node = self._producers.get(name)
        if node is not None and node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            self._folded[name] = self._static_shape(node)
            return self._folded[name]
        if node is None or node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx") or depth > 24:
            return None
        inputs = [self.folded(i, depth + 1) if i else None for i in node.input]
        if any(v is None for v, i in zip(inputs, node.input, strict=True) if i):
            return None
        try:
            from onnx.reference import ReferenceEvaluator

            graph = onnx.helper.make_graph(
                [node],
                "fold",
                [
                    onnx.helper.make_tensor_value_info(i, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for i, v in zip(node.input, inputs, strict=True)
                    if i
                ],
                [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o],
            )
            model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", self._opset)])
            feeds = {i: v for i, v in zip(node.input, inputs, strict=True) if i}
            results = ReferenceEvaluator(model).run(None, feeds)
        except Exception:
            return None
        for output, result in zip([o for o in node.output if o], results, strict=False):
            array = np.asarray(result)
            self._folded[output] = array if array.size <= _FOLD_LIMIT else None
        return self._folded.get(name)

    def _static_shape(self, node: onnx.NodeProto) -> np.ndarray | None:
        """``Shape(x)`` when the (sliced) shape of ``x`` is static in the inferred types (or x is a folded constant)."""
        known = self.folded(node.input[0]) if node.input[0] in self._producers else self.value(node.input[0])
        dims = list(known.shape) if known is not None else shape_of(self._types, node.input[0])
        if dims is None:
            return None
        dims = _shape_slice(node, dims)
        if any(d is None for d in dims):
            return None
        return np.array(dims, dtype=np.int64)


def _shape_slice(node: onnx.NodeProto, dims: list) -> list:
    start = int(attribute(node, "start", 0))  # type: ignore[arg-type]
    end = attribute(node, "end")
    return dims[start:] if end is None else dims[start : int(end)]  # type: ignore[call-overload]


def infer_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model`` from onnx shape inference (best effort, no weight bytes read).

    Data propagation is on: shapes computed with ``Shape`` / ``Concat`` / ``Gather``
    (as the exporters and the passes write ``Reshape`` targets) stay known.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    for init in g.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    return types


def shape_of(types: dict[str, onnx.TypeProto], name: str) -> list[int | None] | None:
    """Static dims of a tensor value (None for a symbolic or unknown dim), or None for an unknown rank."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in t.tensor_type.shape.dim]


def elem_type(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    """Element type of a tensor value, or None if unknown."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return None
    return t.tensor_type.elem_type or None


def attribute(node: onnx.NodeProto, name: str, default: object = None) -> object:
    """The value of a node attribute, or ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    """Set (or replace) a node attribute."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


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


def replace_nodes(graph: onnx.GraphProto, replacements: dict[int, list[onnx.NodeProto]]) -> None:
    """Replace the node at each index by its list of nodes, keeping the graph's order."""
    if not replacements:
        return
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(graph.node):
        nodes.extend(replacements.get(i, [node]))
    del graph.node[:]
    graph.node.extend(nodes)


class RewriteContext:
    """What a :func:`rewrite_nodes` pass reads: the model's opset, and types, names and constants computed on first use.

    All are computed from the graph as it was before any replacement.
    """

    def __init__(self, model: onnx.ModelProto, opset: int) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = opset

    @cached_property
    def types(self) -> dict[str, onnx.TypeProto]:
        """:func:`infer_types` of the model."""
        return infer_types(self.model)

    @cached_property
    def names(self) -> NameAuthority:
        """:func:`name_authority` of the graph."""
        return name_authority(self.graph)

    @cached_property
    def constants(self) -> ConstantTable:
        """A :class:`ConstantTable` that folds with the opset and the inferred types."""
        return ConstantTable(self.graph, self.opset, self.types)

    @cached_property
    def plain_constants(self) -> ConstantTable:
        """A :class:`ConstantTable` that folds with the opset, without inferring types (cheaper)."""
        return ConstantTable(self.graph, self.opset)

    def dtype(self, name: str) -> np.dtype | None:
        """The numpy dtype of value ``name``, or None when its element type is unknown."""
        elem = elem_type(self.types, name)
        return None if elem is None else onnx.helper.tensor_dtype_to_np_dtype(elem)

    def writer(self, hint: str) -> NodeWriter:
        """A :class:`NodeWriter` at the model's opset naming its values after ``hint``."""
        return NodeWriter(self.names, self.opset, hint)


def rewrite_nodes(
    model: onnx.ModelProto,
    select: Callable[[onnx.NodeProto], bool],
    rewrite: Callable[[onnx.NodeProto, RewriteContext], list[onnx.NodeProto] | None],
    *,
    min_opset: int | None = 13,
) -> int:
    """Replace each top-level node ``select`` picks by the nodes ``rewrite(node, ctx)`` returns (None keeps it).

    Nothing is done (and nothing inferred) when no node is selected or the model's
    default-domain opset is below ``min_opset``. Replacements are spliced in after
    every selected node has been seen, keeping the graph's order.

    Returns:
        The number of nodes replaced.
    """
    targets = [i for i, n in enumerate(model.graph.node) if select(n)]
    if not targets:
        return 0
    opset = _limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET
    if min_opset is not None and opset < min_opset:
        return 0
    ctx = RewriteContext(model, opset)
    replacements: dict[int, list[onnx.NodeProto]] = {}
    for index in targets:
        nodes = rewrite(model.graph.node[index], ctx)
        if nodes is not None:
            replacements[index] = nodes
    replace_nodes(model.graph, replacements)
    return len(replacements)


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

    def op(self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "", **attrs: object) -> str:
        """One node with one output."""
        (output,) = self.ops(op_type, inputs, [out or self.fresh(op_type.lower())], domain=domain, **attrs)
        return output

    def ops(self, op_type: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: object) -> list[str]:
        """One node with the given outputs."""
        self.nodes.append(
            onnx.helper.make_node(
                op_type, inputs, outputs, name=self.names.fresh(op_type), domain=domain or None, **attrs
            )
        )
        return outputs

    def const(self, value: np.ndarray | float | int | list, dtype: object = None, suffix: str = "const") -> str:
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

"""What a lowering reads and writes: the graph's types and producers, and a node writer with
helpers.

A lowering is a function ``(node, ctx) -> list[ir.Node]`` that replaces one
training-only node (an ``onnx_ir`` node of the model being lowered) by standard
ONNX nodes writing outputs of the same names. It reads the element type, rank or
static dims of values through :class:`LoweringContext` (the types on the values,
:mod:`onnxblocks.ir.types`, inferred once for the graph and node by node as the pass
rewrites it) and writes through a
:class:`Writer` (:class:`onnxblocks.ir.writer.Writer`), whose helpers build the
run-time shape arithmetic (``Shape``, ``Gather``, ``Slice``...) that keeps dynamic
dims dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core.contracts import GRADIENT_OF
from onnxblocks._core.errors import PortabilityError
from onnxblocks.ir import types as _types
from onnxblocks.ir import writer as _writer
from onnxblocks.ir.edit import values_by_name
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.rewrite import RewriteContext

#: Largest int64: an open end for ``Slice``.
INT64_MAX = _writer.INT64_MAX
#: A float32 tensor of unknown shape (Scan bodies' inputs and outputs).
FLOAT_TENSOR = ir.TensorType(ir.DataType.FLOAT)


def numpy_type(elem_type: Any) -> np.dtype:
    """The numpy dtype of an ONNX element type (``onnx.TensorProto.FLOAT``, ``ir.DataType``) or a
    numpy dtype.
    """
    if isinstance(elem_type, (int, ir.DataType)) and not isinstance(elem_type, bool):
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(elem_type)))
    return np.dtype(elem_type)


class Writer(_writer.Writer):
    """The IR :class:`~onnxblocks.ir.writer.Writer`, whose constants also take an ONNX element
    type.
    """

    def const(
        self, value: np.ndarray | float | int | list, dtype: Any = None, suffix: str = "const"
    ) -> ir.Value:
        """A ``Constant`` node holding ``value`` (``dtype``: a numpy dtype or an ONNX element
        type).
        """
        array = np.asarray(value, dtype=None if dtype is None else numpy_type(dtype))
        return self.named_const(self.fresh(suffix), array)

    def scalar(
        self, value: float | int, dtype: Any = np.float32, shape: Sequence[int] = ()
    ) -> ir.Value:
        """A constant of ``dtype`` (numpy, or an ONNX element type; float32 when None) holding
        ``value``.
        """
        return super().scalar(value, numpy_type(dtype if dtype is not None else np.float32), shape)

    def body_input(self, hint: str) -> ir.Value:
        """A fresh float input of a subgraph (a ``Scan`` body) written with this writer."""
        return ir.Value(name=self.fresh(hint), type=FLOAT_TENSOR)


class LoweringContext(RewriteContext):
    """The state of one lowering pass over a model: the one rewrite context
    (:class:`~onnxblocks.ir.rewrite.RewriteContext`), with the portable mode, the original
    graph's producers and the types inferred node by node as the pass rewrites.

    Attributes:
        model: The model being lowered (edited in place by the pass).
        mode: The portable mode (``"standard"`` or ``"onnxruntime"``,
        :mod:`onnxblocks.portable.ops`): which
            contrib ops a lowering may write (none in ``"standard"``).
        opset: Its default-domain opset; lowerings write nodes of this opset.
        original_producers: The node writing each value in the original graph (training-only nodes
        included).

    Args:
        model: The model to lower.
        mode: The portable mode.
        hints: Values typed elsewhere (a first lowering's result), by name: each of the graph's
            own values takes its hint's type where the hint knows more of its shape than
            inference on ``model`` does.
    """

    writer_class = Writer

    def __init__(
        self,
        model: ir.Model,
        mode: str = "standard",
        hints: dict[str, ir.Value] | None = None,
    ) -> None:
        super().__init__(model)
        self.mode = mode
        graph = model.graph
        self.types  # noqa: B018  # the types are inferred onto the values before any lowering
        self._by_name = values_by_name(graph)
        # only for the graph's own values: a name a lowering makes may stand for another value each
        # time
        if hints:
            for name, value in self._by_name.items():
                hint = hints.get(name)
                if hint is not None and _types.known_dims(hint) > _types.known_dims(value):
                    _types.copy_type(value, hint)
        #: How many broadcast reductions were left (in part) to run-time shape arithmetic.
        self.undecided_axes = 0
        #: How many nodes of each op type were lowered.
        self.counts: dict[str, int] = {}
        self.names = graph_names(graph)
        self.original_producers: dict[str, ir.Node] = {
            v.name: n for n in graph for v in n.outputs if v.name
        }
        self._original_inputs = {n: tuple(n.inputs) for n in graph}
        self._opsets = [onnx.helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()]
        self._constants: dict[str, np.ndarray | None] = {}

    # -------------------------------------------------------------- reading values
    def elem_type(self, value: ir.Value | None, default: int | None = None) -> int | None:
        """Element type of ``value`` (``default`` when unknown)."""
        return _types.elem_type(value) or default

    def float_type(self, value: ir.Value | None) -> int:
        """Element type of the float value ``value`` (float32 when unknown)."""
        return self.elem_type(value) or onnx.TensorProto.FLOAT

    def shape(self, value: ir.Value | None) -> list[int | None] | None:
        """Static dims of ``value`` (None for a symbolic dim), or None when its rank is unknown."""
        dims = self.dims(value)
        return None if dims is None else [d if isinstance(d, int) else None for d in dims]

    def dims(self, value: ir.Value | None) -> list[int | str | None] | None:
        """Dims of ``value``: an int when static, the symbol's name when symbolic, None when
        unknown.
        """
        return _types.dims(value)

    def shape_source(self, shape_value: ir.Value | None) -> ir.Value | None:
        """The tensor whose ``Shape`` (whole, no start/end) ``shape_value`` is, or None."""
        node = shape_value.producer() if shape_value is not None else None
        if node is None or node.op_type != "Shape" or node.domain not in ("", "ai.onnx"):
            return None
        if (
            node.attributes.get_int("start", 0) != 0
            or node.attributes.get_int("end", None) is not None
        ):
            return None
        return node.inputs[0]

    def rank(self, value: ir.Value | None) -> int | None:
        """Rank of ``value``, or None when unknown."""
        dims = self.shape(value)
        return None if dims is None else len(dims)

    def require_rank(self, node: ir.Node, value: ir.Value | None) -> int:
        """Rank of ``value``, or a :class:`PortabilityError` naming the node when it is unknown."""
        rank = self.rank(value)
        if rank is None:
            name = value.name if value is not None else ""
            raise PortabilityError(
                f"{describe(node)}: the rank of its input '{name}' is unknown, and its "
                "standard-op form needs it. "
                "Export the model with shape information (torch.onnx.export does), or give the "
                "graph inputs a "
                "rank."
            )
        return rank

    def require_opset(self, node: ir.Node, version: int, what: str) -> None:
        """Raise :class:`PortabilityError` when the model's opset is below ``version``."""
        if self.opset < version:
            raise PortabilityError(
                f"{describe(node)}: its standard-op form needs {what}, from ai.onnx opset "
                f"{version}, but the model "
                f"imports opset {self.opset}. Re-export the model with "
                f"opset_version={max(version, 17)}."
            )

    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        """The value of ``value`` when a ``Constant`` node or an inline initializer holds it (no
        file is read).
        """
        if value is None:
            return None
        key = value.name or str(id(value))
        if key in self._constants:
            return self._constants[key]
        array = None
        producer = value.producer()
        if producer is None or (
            producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")
        ):
            tensor = ir.convenience.get_const_tensor(value)
            if tensor is not None and not isinstance(tensor, ir.ExternalTensor):
                array = tensor.numpy()
        self._constants[key] = array
        return array

    def original_inputs(self, node: ir.Node) -> tuple[ir.Value | None, ...]:
        """The inputs ``node`` had in the original graph (a lowered node no longer reads them)."""
        return self._original_inputs.get(node, tuple(node.inputs))

    def value(self, name: str) -> ir.Value | None:
        """The value of the top-level graph named ``name`` (a graph input, initializer or node
        output), or None.
        """
        return values_by_name(self.model.graph).get(name)

    def original_value(self, name: str) -> ir.Value | None:
        """The value named ``name`` in the graph as it was before this lowering (it keeps its
        type when a lowering replaces its producer), or None.
        """
        return self._by_name.get(name)

    def producer(self, value: ir.Value | None) -> ir.Node | None:
        """The node writing ``value`` (None for graph inputs and initializers)."""
        return value.producer() if value is not None else None

    # -------------------------------------------------------------- writing values
    def writer(self, hint: str | ir.Node) -> Writer:
        """A :class:`Writer` naming new values after ``hint`` (a node: its name, else its op
        type).
        """
        w = super().writer(hint)
        assert isinstance(w, Writer)
        return w

    def set_type(
        self,
        value: ir.Value | None,
        like: ir.Value | None = None,
        elem_type: int | None = None,
        shape: Any = None,
    ) -> None:
        """Give ``value``, when untyped, the type of ``like``, or ``elem_type`` and ``shape``."""
        if value is None or _types.has_type(value):
            return
        if like is not None:
            _types.copy_type(value, like)
        elif elem_type:
            _types.set_type(value, onnx.helper.make_tensor_type_proto(elem_type, shape))

    def record(self, nodes: Sequence[ir.Node]) -> None:
        """Infer the types of ``nodes``' outputs, node by node (best effort)."""
        for node in nodes:
            if all(_types.has_type(o) for o in node.outputs if o.name):
                continue
            self._infer(node)
            for out in node.outputs:
                match = GRADIENT_OF.match(out.name) if out.name else None
                if match and not _types.has_type(out):
                    self.set_type(out, like=self.original_value(match.group("value")))

    def _infer(self, node: ir.Node) -> None:
        if node.domain not in ("", "ai.onnx"):
            return
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, "")
        except onnx.defs.SchemaError:
            return
        inputs: dict[str, onnx.TypeProto] = {}
        data: dict[str, onnx.TensorProto] = {}
        for v in node.inputs:
            if v is None or not v.name:
                continue
            known = _types.type_proto(v)
            if known is not None:
                inputs[v.name] = known
            array = self.constant(v)
            if array is not None:
                data[v.name] = onnx.numpy_helper.from_array(array, v.name)
        try:
            proto = ir.serde.serialize_node(node)
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, proto, inputs, data, None, self._opsets, self.model.ir_version or 8
            )
        except Exception:  # inference is best effort: a lowering that needs a type says so
            return
        for out in node.outputs:
            found = inferred.get(out.name or "")
            if found is not None and not _types.has_type(out):
                _types.set_type(out, found)


def describe(node: ir.Node) -> str:
    """``"Node 'name' (domain:Op)"`` for error messages."""
    domain = node.domain or "ai.onnx"
    return f"Node '{node.name}' ({domain}:{node.op_type})"


def unsupported(node: ir.Node, what: str) -> PortabilityError:
    """The error for a node whose form (``what``) the lowering does not cover."""
    return PortabilityError(
        f"{describe(node)}: {what} has no standard-op form in onnxblocks.portable, so the model "
        "cannot be made "
        "portable. Change that part of the model (see docs/portable.md for what is covered), or "
        "generate "
        "non-portable artifacts (portable=False) for ONNX Runtime's training build."
    )


def inputs(node: ir.Node, count: int) -> list[Any]:
    """The first ``count`` inputs of ``node`` (``ir.Value``), None for the missing ones.

    Typed ``Any``: which inputs are optional is each op's own contract, checked by its lowering.
    """
    values = list(node.inputs[:count])
    return values + [None] * (count - len(values))


def outputs(node: ir.Node, count: int) -> list[str]:
    """The names of the first ``count`` outputs of ``node``, ``""`` for the missing (unused
    optional) ones.
    """
    names = [v.name or "" for v in node.outputs[:count]]
    return names + [""] * (count - len(names))


def attributes(node: ir.Node, *names: str) -> dict[str, Any]:
    """``node``'s attributes (those named in ``names`` when given), to copy onto a standard node."""
    return {k: a for k, a in node.attributes.items() if not names or k in names}


def name_of(value: ir.Value | None) -> str:
    """The name of ``value`` (``""`` for a missing optional input), for messages and name hints."""
    return value.name or "" if value is not None else ""

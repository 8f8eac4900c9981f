"""The value index of a model being built: its values by name, and their types.

A build holds one ``ir.Model``. The index maps each name the graph defines (graph
inputs, initializers, node outputs) to its ``ir.Value``; types live on those values,
read through :mod:`onnxblocks.ir.types` (declared on the value, or inferred and kept in
its ``meta``). Each write of the accessor indexes only what it added, so a block that
adds k nodes to an N-node graph costs O(k), not O(N). Types nobody declared or inferred
are inferred once, for the whole graph, on first demand.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnxblocks._core.errors import InvalidTypeError, UnknownNameError, did_you_mean, preview
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir import types as _types


class ValueIndex:
    """Names, values and types of one graph, kept in step with it.

    Attributes:
        names: The graph's :class:`~onnxblocks._core.naming.NameAuthority`.
    """

    def __init__(self, model: ir.Model) -> None:
        self._ir = model
        self._values: dict[str, ir.Value] = {}
        self._inferred_all = False
        self.names = NameAuthority()
        self._index_all()

    def where(self) -> str:
        """A prefix naming what is being built, for error messages (none here)."""
        return ""

    def _sync(self) -> None:
        """Bring the index up to date before a read or write (the accessor reads edits back)."""

    def _index_all(self) -> None:
        """Index every value and name of the graph (a new or replaced model)."""
        graph = self._ir.graph
        self._values.clear()
        self._inferred_all = False
        for value in [*graph.inputs, *graph.initializers.values()]:
            self._index_value(value)
        for node in graph:
            self._index_node(node)
        for value in graph.outputs:
            if value.name:
                self.names.reserve(value.name)

    def _index_value(self, value: ir.Value) -> None:
        if value.name:
            self._values[value.name] = value
            self.names.reserve(value.name)

    def _index_node(self, node: ir.Node) -> None:
        if node.name:
            self.names.reserve(node.name)
        for out in node.outputs:
            self._index_value(out)

    def value(self, name: str) -> ir.Value:
        """The ``ir.Value`` of ``name``.

        Raises:
            UnknownNameError: if ``name`` is not a value of the model.
        """
        self.require(name)
        return self._values[name]

    def has_value(self, name: str) -> bool:
        """True when ``name`` is a graph input, initializer or node output."""
        self._sync()
        return name in self._values

    def value_names(self) -> set[str]:
        """Every value name defined in the graph."""
        self._sync()
        return set(self._values)

    def input_names(self) -> list[str]:
        """The graph inputs' names, in order."""
        self._sync()
        return [v.name or "" for v in self._ir.graph.inputs]

    def output_names(self) -> list[str]:
        """The graph outputs' names, in order."""
        self._sync()
        return [v.name or "" for v in self._ir.graph.outputs]

    def require(self, name: str, role: str = "input") -> None:
        """Raise a clear error when ``name`` is not a value of the model.

        Raises:
            TypeError: if ``name`` is not a string.
            UnknownNameError: naming the value, the block being built, the graph's
                inputs and outputs, and close matches.
        """
        if not isinstance(name, str):
            raise InvalidTypeError(
                f"{self.where()}{role} must be a value name (str), not {type(name).__name__}: "
                f"{name!r}."
            )
        if self.has_value(name):
            return
        raise UnknownNameError(
            f"{self.where()}{role} '{name}' is not a value of the "
            f"model.{did_you_mean(name, self._values)} "
            f"Graph inputs: {preview(self.input_names())}; graph outputs: "
            f"{preview(self.output_names())}. "
            "Pass the name of an existing value, or create an input first (e.g. "
            "onnxblocks.blocks.InputLike)."
        )

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The TypeProto of a value, inferring types once for the whole graph if needed."""
        self._sync()
        value = self._values.get(name)
        if value is None:
            return None
        found = _types.type_proto(value)
        # a node's checked type and a graph input's are final; a declared output or value_info
        # without a shape is left to inference, as is a value nobody typed
        final = _types.INFERRED in value.meta or value.is_graph_input()
        if (found is None or (_rank_unknown(found) and not final)) and not self._inferred_all:
            self._inferred_all = True
            try:
                _types.infer_types(self._ir)
            except Exception:  # inference is best effort: unknown types stay unknown
                return found
            found = _types.type_proto(value)
        return found

    def elem_type(self, name: str) -> int | None:
        """The tensor element type of a value (``onnx.TensorProto.FLOAT`` ...), or None if
        unknown.
        """
        t = self.type_of(name)
        if t is None:
            return None
        kind = t.WhichOneof("value")
        if kind == "tensor_type":
            return t.tensor_type.elem_type or None
        if (
            kind == "sequence_type"
            and t.sequence_type.elem_type.WhichOneof("value") == "tensor_type"
        ):
            return t.sequence_type.elem_type.tensor_type.elem_type or None
        return None

    def shape_of(self, name: str) -> list[int | str | None] | None:
        """The shape of a tensor value: ints, symbolic dim names, or None per dim; None if
        unknown rank.
        """
        t = self.type_of(name)
        if t is None or _rank_unknown(t) or t.WhichOneof("value") != "tensor_type":
            return None
        dims: list[int | str | None] = []
        for d in t.tensor_type.shape.dim:
            kind = d.WhichOneof("value")
            dims.append(
                d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None
            )
        return dims

    def declared_type(self, name: str) -> onnx.TypeProto | None:
        """The type value ``name`` declares (as a graph input, output or in ``value_info``), not
        what inference found; None when it declares none.
        """
        self._sync()
        value = self._values.get(name)
        if value is None or value.type is None:
            return None
        return ir.serde.serialize_value(value).type

    def set_type(self, name: str, type_proto: onnx.TypeProto) -> None:
        """Record the type of a value (used for ops whose schema onnx does not know)."""
        self._sync()
        value = self._values.get(name)
        if value is not None:
            _types.put_type(value, type_proto)


def _rank_unknown(t: onnx.TypeProto) -> bool:
    """True for a tensor type without a shape (inference may know more)."""
    return t.WhichOneof("value") == "tensor_type" and not t.tensor_type.HasField("shape")

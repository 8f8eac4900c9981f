"""The value index of a model being built: which names it defines, and their types.

The index follows the graph incrementally: each call visits only the entries
appended since the last one (also by code that edits the proto directly), so a
block that adds k nodes to an N-node graph costs O(k), not O(N). Types missing
from the graph are inferred once, for the whole graph, on first demand.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxblocks._core.errors import InvalidTypeError, UnknownNameError, did_you_mean, preview
from onnxblocks._core.naming import NameAuthority

_FIELDS = ("input", "initializer", "node", "value_info", "output")


class ValueIndex:
    """Names, definitions and types of the values of one graph, kept in step with it.

    Attributes:
        names: The graph's :class:`~onnxblocks._core.naming.NameAuthority`.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._types: dict[str, onnx.TypeProto] = {}
        self._defined: set[str] = set()
        self._seen = dict.fromkeys(_FIELDS, 0)
        self._inferred_all = False
        self.names = NameAuthority()
        self._sync()

    def where(self) -> str:
        """A prefix naming what is being built, for error messages (none here)."""
        return ""

    def _sync(self) -> None:
        """Index graph entries appended since the last call."""
        g = self._model.graph
        fields = {
            "input": g.input,
            "initializer": g.initializer,
            "node": g.node,
            "value_info": g.value_info,
            "output": g.output,
        }
        if any(len(fields[k]) < self._seen[k] for k in fields):
            self._reset()
        for vi in g.input[self._seen["input"] :]:
            self._defined.add(vi.name)
            self.names.reserve(vi.name)
            if vi.type.WhichOneof("value"):
                self._types[vi.name] = vi.type
        for init in g.initializer[self._seen["initializer"] :]:
            self._defined.add(init.name)
            self.names.reserve(init.name)
            self._types.setdefault(
                init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims))
            )
        for node in g.node[self._seen["node"] :]:
            if node.name:
                self.names.reserve(node.name)
            for out in node.output:
                if out:
                    self._defined.add(out)
                    self.names.reserve(out)
        for vi in g.value_info[self._seen["value_info"] :] + g.output[self._seen["output"] :]:
            self.names.reserve(vi.name)
            kind = vi.type.WhichOneof("value")
            if kind and (
                kind != "tensor_type" or vi.type.tensor_type.HasField("shape")
            ):  # else: left to inference
                self._types.setdefault(vi.name, vi.type)
        self._seen = {k: len(v) for k, v in fields.items()}

    def _reset(self) -> None:
        """Forget everything indexed (the graph was replaced or shrunk); the next sync re-reads
        it.
        """
        self._types.clear()
        self._defined.clear()
        self._seen = dict.fromkeys(_FIELDS, 0)
        self._inferred_all = False

    def has_value(self, name: str) -> bool:
        """True when ``name`` is a graph input, initializer or node output."""
        self._sync()
        return name in self._defined

    def value_names(self) -> set[str]:
        """Every value name defined in the graph."""
        self._sync()
        return set(self._defined)

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
        g = self._model.graph
        raise UnknownNameError(
            f"{self.where()}{role} '{name}' is not a value of the "
            f"model.{did_you_mean(name, self._defined)} "
            f"Graph inputs: {preview(i.name for i in g.input)}; graph outputs: "
            f"{preview(o.name for o in g.output)}. "
            "Pass the name of an existing value, or create an input first (e.g. "
            "onnxblocks.blocks.InputLike)."
        )

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The TypeProto of a value, inferring types once for the whole graph if needed."""
        self._sync()
        if name in self._types:
            return self._types[name]
        if not self._inferred_all:
            self._infer_all()
            return self._types.get(name)
        return None

    def _infer_all(self) -> None:
        """Run onnx shape inference once over the skeleton and record every type it finds."""
        self._inferred_all = True
        try:
            inferred = onnx.shape_inference.infer_shapes(
                self._model, strict_mode=False, data_prop=True
            )
        except Exception:  # inference is best effort: unknown types stay unknown
            return
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.type.WhichOneof("value"):
                self._types.setdefault(vi.name, vi.type)

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
        if (
            t is None
            or t.WhichOneof("value") != "tensor_type"
            or not t.tensor_type.HasField("shape")
        ):
            return None
        dims: list[int | str | None] = []
        for d in t.tensor_type.shape.dim:
            kind = d.WhichOneof("value")
            dims.append(
                d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None
            )
        return dims

    def set_type(self, name: str, type_proto: onnx.TypeProto) -> None:
        """Record the type of a value (used for ops whose schema onnx does not know)."""
        self._types[name] = type_proto

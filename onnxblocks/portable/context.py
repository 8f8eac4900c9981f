"""What a lowering reads and writes: the graph's types, names, producers, and a node writer with helpers.

A lowering is a function ``(node, ctx) -> list[NodeProto]`` that replaces one
training-only node by standard ONNX nodes writing the same output names. It reads
the element type, rank or static dims of values through :class:`LoweringContext`
(onnx shape inference of the graph, kept up to date node by node as the pass
rewrites it) and writes through a :class:`Writer`, whose helpers build the
run-time shape arithmetic (``Shape``, ``Gather``, ``Slice``...) that keeps dynamic
dims dynamic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import PortabilityError
from onnxblocks.gradient import _graph

#: ``<value>_grad`` or ``<value>_grad_<n>`` (ORT's partial gradients): the gradient of ``<value>``.
GRADIENT_OF = re.compile(r"^(?P<value>.+)_grad(_\d+)?$")
#: Largest int64: an open end for ``Slice``.
INT64_MAX = int(np.iinfo(np.int64).max)


class Writer(_graph.NodeWriter):
    """A :class:`~onnxblocks.gradient._graph.NodeWriter` with the helpers the lowerings share."""

    def scalar(self, value: float | int, elem_type: int | None, shape: Sequence[int] = ()) -> str:
        """A constant of ``elem_type`` (float32 when None) holding ``value``, of shape ``shape`` (a scalar)."""
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type or onnx.TensorProto.FLOAT)
        return self.const(np.full(tuple(shape), value, dtype=dtype), suffix="scalar")

    def shape(self, x: str, start: int | None = None, end: int | None = None) -> str:
        """``Shape(x)[start:end]`` (int64 1-D), with ``Shape``'s own slicing from opset 15."""
        if start is None and end is None:
            return self.op("Shape", [x])
        if self.opset >= 15:
            attrs: dict[str, Any] = {"start": start or 0} | ({"end": end} if end is not None else {})
            return self.op("Shape", [x], **attrs)
        return self.slice(self.op("Shape", [x]), [start or 0], [INT64_MAX if end is None else end], [0])

    def dim(self, x: str, axis: int) -> str:
        """``Shape(x)[axis]`` as an int64 ``[1]`` (``axis`` may be negative)."""
        return self.op("Gather", [self.op("Shape", [x]), self.ints([axis])], axis=0)

    def cast(self, x: str, to: int, out: str | None = None) -> str:
        return self.op("Cast", [x], out, to=to)

    def reduce(self, op_type: str, x: str, axes: str | Sequence[int] | None, keepdims: int, **kw: Any) -> str:
        """``ReduceSum`` / ``ReduceMean`` / ... over ``axes`` (a list, or an int64 value at opset 13+/18+)."""
        out = kw.pop("out", None)
        axes_input_since = 13 if op_type == "ReduceSum" else 18
        if axes is None:
            return self.op(op_type, [x], out, keepdims=keepdims, **kw)
        if self.opset >= axes_input_since:
            axes_value = axes if isinstance(axes, str) else self.ints(list(axes))
            return self.op(op_type, [x, axes_value], out, keepdims=keepdims, **kw)
        if isinstance(axes, str):
            raise ValueError(f"{op_type} takes run-time axes from opset {axes_input_since}")
        return self.op(op_type, [x], out, axes=list(axes), keepdims=keepdims, **kw)

    def reshape(self, x: str, shape: str | Sequence[int], out: str | None = None) -> str:
        target = shape if isinstance(shape, str) else self.ints(list(shape))
        return self.op("Reshape", [x, target], out)

    def concat(self, parts: Sequence[str], axis: int = 0, out: str | None = None) -> str:
        return self.op("Concat", list(parts), out, axis=axis)


class LoweringContext:
    """The state of one lowering pass over a model.

    Attributes:
        model: The model being lowered (its graph is rewritten at the end of the pass).
        opset: Its default-domain opset; lowerings write nodes of this opset.
        types: Known value types, updated as nodes are lowered.
        producers: The node writing each value (as the pass has seen them so far).
        readers: The nodes reading each value in the original graph.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.opset = _limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET
        self.types: dict[str, onnx.TypeProto] = _graph.infer_types(model)
        self.names = _graph.name_authority(model.graph)
        self.producers: dict[str, onnx.NodeProto] = {o: n for n in model.graph.node for o in n.output if o}
        #: The node writing each value in the original graph (training-only nodes included).
        self.original_producers = dict(self.producers)
        self.readers = _graph.consumers(model.graph)
        self._constants: dict[str, onnx.TensorProto] = {}
        self._initializers = {i.name: i for i in model.graph.initializer}

    # -------------------------------------------------------------- reading values
    def elem_type(self, name: str, default: int | None = None) -> int | None:
        """Element type of ``name`` (``default`` when unknown)."""
        return _graph.elem_type(self.types, name) or default

    def float_type(self, name: str) -> int:
        """Element type of the float value ``name`` (float32 when unknown)."""
        return self.elem_type(name) or onnx.TensorProto.FLOAT

    def shape(self, name: str) -> list[int | None] | None:
        """Static dims of ``name`` (None for a symbolic dim), or None when its rank is unknown."""
        return _graph.shape_of(self.types, name)

    def dims(self, name: str) -> list[int | str | None] | None:
        """Dims of ``name``: an int when static, the symbol's name when symbolic, None when unknown."""
        t = self.types.get(name)
        if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            return None
        out: list[int | str | None] = []
        for d in t.tensor_type.shape.dim:
            kind = d.WhichOneof("value")
            out.append(d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
        return out

    def shape_source(self, shape_value: str) -> str | None:
        """The tensor whose ``Shape`` (whole, no start/end) ``shape_value`` is, or None."""
        node = self.producers.get(shape_value)
        if node is None or node.op_type != "Shape" or not _graph.is_default_domain(node):
            return None
        if _graph.int_attribute(node, "start", 0) != 0 or _graph.int_attribute(node, "end", None) is not None:
            return None
        return node.input[0]

    def rank(self, name: str) -> int | None:
        """Rank of ``name``, or None when unknown."""
        dims = self.shape(name)
        return None if dims is None else len(dims)

    def require_rank(self, node: onnx.NodeProto, name: str) -> int:
        """Rank of ``name``, or a :class:`PortabilityError` naming the node when it is unknown."""
        rank = self.rank(name)
        if rank is None:
            raise PortabilityError(
                f"{describe(node)}: the rank of its input '{name}' is unknown, and its standard-op form needs it. "
                "Export the model with shape information (torch.onnx.export does), or give the graph inputs a "
                "rank."
            )
        return rank

    def require_opset(self, node: onnx.NodeProto, version: int, what: str) -> None:
        """Raise :class:`PortabilityError` when the model's opset is below ``version``."""
        if self.opset < version:
            raise PortabilityError(
                f"{describe(node)}: its standard-op form needs {what}, from ai.onnx opset {version}, but the model "
                f"imports opset {self.opset}. Re-export the model with opset_version={max(version, 17)}."
            )

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when a ``Constant`` node or a small inline initializer holds it."""
        tensor = self._constants.get(name)
        if tensor is None:
            node = self.producers.get(name)
            if node is not None and node.op_type == "Constant" and _graph.is_default_domain(node):
                value = _graph.attribute(node, "value")
                tensor = value if isinstance(value, onnx.TensorProto) else None
        if tensor is None:
            init = self._initializers.get(name)
            if init is not None and (init.raw_data or _has_typed_data(init)) and not init.external_data:
                tensor = init
        if tensor is None:
            return None
        self._constants[name] = tensor
        return onnx.numpy_helper.to_array(tensor)

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The node writing ``name`` (None for graph inputs and initializers)."""
        return self.producers.get(name)

    # -------------------------------------------------------------- writing values
    def writer(self, node: onnx.NodeProto) -> Writer:
        """A :class:`Writer` naming new values after ``node``."""
        return Writer(self.names, self.opset, node.name or node.op_type)

    def set_type(self, name: str, like: str | None = None, elem_type: int | None = None, shape: Any = None) -> None:
        """Record the type of ``name``: that of value ``like``, or ``elem_type`` with ``shape``."""
        if not name or name in self.types:
            return
        if like is not None:
            if like in self.types:
                self.types[name] = self.types[like]
            return
        if elem_type:
            self.types[name] = onnx.helper.make_tensor_type_proto(elem_type, shape)

    def record(self, nodes: Sequence[onnx.NodeProto]) -> None:
        """Note the producers of ``nodes``' outputs and infer their types, node by node (best effort)."""
        for node in nodes:
            for out in node.output:
                if out:
                    self.producers[out] = node
            if all(not o or o in self.types for o in node.output):
                continue
            self._infer(node)
            for out in node.output:
                match = GRADIENT_OF.match(out) if out else None
                if match and out not in self.types:
                    self.set_type(out, like=match.group("value"))

    def _infer(self, node: onnx.NodeProto) -> None:
        if not _graph.is_default_domain(node):
            return
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, "")
        except onnx.defs.SchemaError:
            return
        inputs = {i: self.types[i] for i in node.input if i in self.types}
        data: dict[str, onnx.TensorProto] = {}
        for i in node.input:
            if i and self.constant(i) is not None:
                data[i] = self._constants[i]
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, inputs, data, None, list(self.model.opset_import), self.model.ir_version or 8
            )
        except Exception:  # inference is best effort: a lowering that needs a type says so
            return
        for name, value in inferred.items():
            if name and name not in self.types:
                self.types[name] = value


def _has_typed_data(tensor: onnx.TensorProto) -> bool:
    return bool(tensor.float_data or tensor.int32_data or tensor.int64_data or tensor.double_data or tensor.uint64_data)


def describe(node: onnx.NodeProto) -> str:
    """``"Node 'name' (domain:Op)"`` for error messages."""
    domain = node.domain or "ai.onnx"
    return f"Node '{node.name}' ({domain}:{node.op_type})"


def unsupported(node: onnx.NodeProto, what: str) -> PortabilityError:
    """The error for a node whose form (``what``) the lowering does not cover."""
    return PortabilityError(
        f"{describe(node)}: {what} has no standard-op form in onnxblocks.portable, so the model cannot be made "
        "portable. Change that part of the model (see docs/portable.md for what is covered), or generate "
        "non-portable artifacts (portable=False) for ONNX Runtime's training build."
    )


def inputs(node: onnx.NodeProto, count: int) -> list[str]:
    """The first ``count`` inputs of ``node``, ``""`` for the missing ones."""
    names = list(node.input[:count])
    return names + [""] * (count - len(names))


def outputs(node: onnx.NodeProto, count: int) -> list[str]:
    """The first ``count`` outputs of ``node``, ``""`` for the missing ones."""
    names = list(node.output[:count])
    return names + [""] * (count - len(names))

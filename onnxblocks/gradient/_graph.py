"""Small graph helpers shared by the gradient passes (no onnxruntime here)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks.blocks import weights as _weights
from onnxblocks.blocks.naming import NameAuthority


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


class ConstantTable:
    """Values of a graph's Constant nodes and inline initializers, by name (indexed once)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._initializers = {i.name: i for i in graph.initializer}
        self._constants = {
            n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output
        }

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


def infer_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model`` from onnx shape inference (best effort, no weight bytes read)."""
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

"""Writing into the graph of a build: nodes, inputs, initializers, constants and outputs.

:class:`GraphWriter` holds the build's one ``ir.Model`` (indexed by
:class:`~onnxblocks.blocks.value_index.ValueIndex`) and is the one place a build adds to
it. Each node added through :meth:`GraphWriter.op` is checked on its own
(:func:`onnxblocks.blocks.checking.check_node`) and its output types inferred from its
inputs', so a build costs O(nodes added). Once code took the protobuf view
(:mod:`onnxblocks.blocks.proto_view`), each write is mirrored into it, and an edit made
to the view is read back before the next read or write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.blocks.checking import DEFAULT_DOMAIN_VERSIONS, check_node, newer_opset_needed
from onnxblocks.blocks.proto_view import ProtoView, one_view_check
from onnxblocks.blocks.value import Value
from onnxblocks.blocks.value_index import ValueIndex
from onnxblocks.ir import serde as _serde
from onnxblocks.ir import types as _types
from onnxblocks.ir.writer import node_from_proto


class GraphWriter(ValueIndex):
    """Adds nodes, graph inputs, initializers, constants and outputs to a build's ``ir.Model``.

    Attributes:
        names: The graph's :class:`~onnxblocks._core.naming.NameAuthority`.
        block_stack: The blocks being built, outermost first (for error messages).
    """

    def __init__(self, model: onnx.ModelProto | ir.Model) -> None:
        self.block_stack: list[Any] = []
        self._const_data: dict[str, onnx.TensorProto] = {}
        self._view = ProtoView()
        self._pending: onnx.ModelProto | None = None  # a replacement not converted yet
        self._view_checked = False  # inside a call that checked the view already
        super().__init__(model if isinstance(model, ir.Model) else _serde.from_proto(model))

    @property
    def ir_model(self) -> ir.Model:
        """The build's ``ir.Model`` (edit it through the accessor, not directly)."""
        self._sync()
        return self._ir

    def proto(self) -> onnx.ModelProto:
        """A new ``ModelProto`` of the working model; edits to it do not reach the build."""
        self._read_view()
        if self._pending is not None:
            copy = onnx.ModelProto()
            copy.CopyFrom(self._pending)
            return copy
        self._sync()
        return _serde.to_proto(self._ir, initializer_types=False)

    @property
    def metadata_props(self) -> dict[str, str]:
        """The model's metadata (a copy)."""
        self._sync()
        return dict(self._ir.metadata_props)

    def node_count(self) -> int:
        """How many nodes the graph has."""
        self._sync()
        return len(self._ir.graph)

    def nodes_since(self, count: int) -> list[ir.Node]:
        """The nodes appended after the graph had ``count`` nodes, in order."""
        self._sync()
        graph = self._ir.graph
        added: list[ir.Node] = []
        for node in reversed(graph):
            if len(added) >= len(graph) - count:
                break
            added.append(node)
        return added[::-1]

    def producer(self, name: str) -> ir.Node | None:
        """The node computing value ``name``, or None (a graph input, initializer or unknown)."""
        self._sync()
        value = self._values.get(name)
        return None if value is None else value.producer()

    def _sync(self) -> None:
        if not self._view_checked:
            self._read_view()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._set_model(_serde.from_proto(pending))

    def _read_view(self) -> None:
        """Read the protobuf view back when code edited it (it replaces a pending model)."""
        edited = self._view.edited()
        if edited is not None:
            self._pending = None
            self._set_model(_serde.from_proto(edited))

    def _set_model(self, model: ir.Model) -> None:
        self._ir = model
        self._index_all()
        self._const_data = {k: v for k, v in self._const_data.items() if k in self._values}

    def replace_model(self, model: onnx.ModelProto | ir.Model) -> None:
        """Make ``model`` the working model and re-index names and types.

        The view (``self.base``) stays the same object and shows the new model.
        """
        self._sync()
        self._const_data.clear()
        if isinstance(model, ir.Model):
            self._set_model(model)
            self._view.replace(self.proto)
        else:  # converted when the build is read or written again (often never)
            self._pending = model
            self._set_model(ir.Model(ir.Graph([], [], nodes=[]), ir_version=model.ir_version))
            self._view.replace(lambda: model)

    def where(self) -> str:
        """A prefix naming the block being built, for error messages."""
        if not self.block_stack:
            return ""
        return " > ".join(type(b).__name__ for b in self.block_stack) + ": "

    def ensure_domain(self, domain: str, version: int | None = None) -> None:
        """Make the model import ``domain`` (at its default version unless given)."""
        if domain in ("", "ai.onnx") or self.domain_version(domain) is not None:
            return
        version = version or DEFAULT_DOMAIN_VERSIONS.get(domain, 1)
        self._ir.opset_imports[domain] = version
        self._view.ensure_opset(domain, version)

    def domain_version(self, domain: str) -> int | None:
        """The opset version the model imports for ``domain``."""
        self._sync()
        return self._opsets().get("" if domain == "ai.onnx" else domain)

    def _opsets(self) -> dict[str, int]:
        """The opset imports by domain, ai.onnx as ``""``."""
        return {("" if d == "ai.onnx" else d): v for d, v in self._ir.opset_imports.items()}

    @one_view_check
    def op(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        *,
        domain: str = "",
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        output_types: Sequence[onnx.TypeProto | None] | None = None,
        **attributes: Any,
    ) -> Value | tuple[Value, ...]:
        """Add one node, check it, infer its output types, and return its outputs.

        Args:
            op_type: The operator, e.g. ``"Add"``.
            inputs: Input value names; ``None`` or ``""`` for an omitted optional input.
            domain: The operator's domain; it is imported into the model if needed.
            outputs: How many outputs to create (fresh names), or the names to use.
            name: The node's name; a fresh one is generated when omitted.
            output_types: Types of the outputs, for ops whose schema onnx does not know.
            **attributes: Node attributes; ``None`` values are left out.

        Returns:
            One :class:`Value` for a single output, else a tuple of them.

        Raises:
            UnknownNameError: if an input is not a value of the model.
            TypeError, ValueError: if onnx's schema rejects the node or its input types.
        """
        self._sync()
        in_names = ["" if i is None else str(i) for i in inputs]
        for i in in_names:
            if i:
                self.require(i)
        if isinstance(outputs, int):
            out_names = [self.names.fresh(f"{op_type.lower()}_out") for _ in range(outputs)]
        else:
            out_names = [str(o) for o in outputs]
            for o in out_names:
                if o in self._values:
                    raise InvalidValueError(
                        f"{self.where()}output name '{o}' of {op_type} is already a value of the "
                        "model; "
                        "choose another name or leave the name out to get a fresh one."
                    )
                self.names.reserve(o)
        node = helper.make_node(
            op_type,
            in_names,
            out_names,
            name=name or self.names.fresh(op_type),
            domain=domain or None,
            **{k: v for k, v in attributes.items() if v is not None},
        )
        self.ensure_domain(domain)
        if not domain and self._upgrade_for(op_type):
            self._sync()
        types = check_node(node, self._opsets(), self.type_of, self._const_data, self.where())
        if output_types is not None:
            types.update(
                {o: t for o, t in zip(out_names, output_types, strict=False) if t is not None}
            )
        self._append(node, types)
        values = tuple(Value(o) for o in out_names)
        return values[0] if len(values) == 1 else values

    def _append(self, node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> None:
        """Append a checked node to the graph, its outputs typed, and mirror it into the view."""
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            # a subgraph reads outer values by name: onnx-ir resolves them over the whole model
            model = self.proto()
            model.graph.node.append(node)
            self._set_model(_serde.from_proto(model))
            self._view.add_node(node)
            for name, t in types.items():
                self.set_type(name, t)
            return
        written = node_from_proto(node, self._values)
        self._ir.graph.append(written)
        self._index_node(written)
        for value in written.outputs:
            found = types.get(value.name or "")
            if found is not None and found.WhichOneof("value"):
                _types.put_type(value, found)
        self._view.add_node(node)

    def annotate_last_node(
        self, attributes: Sequence[onnx.AttributeProto], doc_string: str = ""
    ) -> None:
        """Give the last node added attributes its check could not take (e.g. an empty list) and
        a doc string.
        """
        self._sync()
        node = next(reversed(self._ir.graph))
        for attribute in attributes:
            node.attributes[attribute.name] = ir.serde.deserialize_attribute(attribute)
        if doc_string:
            node.doc_string = doc_string
        self._view.amend_last_node(attributes, doc_string)

    def _upgrade_for(self, op_type: str) -> bool:
        """Convert the working model to the gradient builder's opset (13) when ``op_type`` needs a
        newer one.

        This is the conversion the gradient builder applies to models below opset 11
        (:func:`onnxblocks.gradient.builder.upgrade_old_opset`), run before a block adds an
        op the model's opset lacks, e.g. ``SoftmaxCrossEntropyLoss`` (opset 12) for a
        ``CrossEntropyLoss`` on an opset-10 model.

        Returns:
            True when the model was converted.

        Raises:
            ValueError: when onnx's version converter cannot convert the model.
        """
        from onnxblocks.gradient.builder import UPGRADE_OPSET  # a lower layer, loaded on first use

        if not newer_opset_needed(op_type, self.domain_version(""), UPGRADE_OPSET):
            return False
        from onnxblocks.ir.opset import convert_opset  # converting walks subgraphs (the IR layer)

        converted = convert_opset(
            self.proto(), UPGRADE_OPSET, f"the model (for {op_type}, which needs a newer opset)"
        )
        self.replace_model(converted)
        return True

    def add_input(
        self, name: str, elem_type: int, shape: Sequence[int | str | None] | None
    ) -> Value:
        """Add a graph input, or return the existing input of that name.

        Raises:
            ValueError: if ``name`` is already a value that is not a graph input.
        """
        self._sync()
        if name in self._values:
            if name in self.input_names():
                return Value(name)
            raise InvalidValueError(
                f"{self.where()}cannot create graph input '{name}': the model already has a "
                "value of that "
                "name that is not a graph input. Choose another name."
            )
        return self.add_typed_input(helper.make_tensor_value_info(name, elem_type, shape))

    def add_typed_input(self, info: onnx.ValueInfoProto) -> Value:
        """Add a graph input of the name and type ``info`` declares (any type: a sequence...).

        Raises:
            ValueError: if the name is already a value of the model.
        """
        self._sync()
        if info.name in self._values:
            raise InvalidValueError(
                f"{self.where()}cannot create graph input '{info.name}': the model already has a "
                "value of that name. Choose another name."
            )
        value = ir.Value(name=info.name)
        if info.type.WhichOneof("value"):
            _types.declare_type(value, info.type)
        self._ir.graph.inputs.append(value)
        self._index_value(value)
        self._view.add_input(info)
        return Value(info.name)

    def add_initializer(self, name: str, array: np.ndarray) -> Value:
        """Add an initializer holding ``array`` (stored inline) and return it.

        Raises:
            ValueError: if ``name`` is already a value of the model.
        """
        self._sync()
        if name in self._values:
            raise InvalidValueError(
                f"{self.where()}cannot add initializer '{name}': the model already has a value "
                "of that name. Choose another name."
            )
        tensor = numpy_helper.from_array(np.asarray(array), name)
        data = ir.serde.TensorProtoTensor(tensor)
        value = ir.Value(name=name, const_value=data, type=ir.TensorType(data.dtype))
        value.shape = ir.Shape(data.shape)
        self._ir.graph.register_initializer(value)
        self._index_value(value)
        self._view.add_initializer(tensor)
        return Value(name)

    def constant(self, value: Any, dtype: Any = None, name_hint: str = "const") -> Value:
        """Add a Constant node holding ``value`` (scalar, list or array) and return its output.

        ``dtype`` is a numpy dtype or an ONNX element type; numbers default to float32.
        """
        if isinstance(dtype, int) and not isinstance(dtype, bool):
            dtype = helper.tensor_dtype_to_np_dtype(dtype)
        array = np.asarray(value, dtype=dtype)
        if dtype is None and array.dtype == np.float64:
            array = array.astype(np.float32)
        tensor = numpy_helper.from_array(array, self.names.fresh(name_hint + "_value"))
        out = self.op("Constant", [], value=tensor, outputs=[self.names.fresh(name_hint)])
        assert isinstance(out, Value)
        self._const_data[out] = tensor
        return out

    @one_view_check
    def set_outputs(self, names: Sequence[str]) -> None:
        """Make ``names`` the graph outputs, in order, with their inferred types.

        Raises:
            UnknownNameError: if a name is not a value of the model.
        """
        self._sync()
        graph = self._ir.graph
        before = list(graph.outputs)
        declared = {v.name for v in before}
        outs: list[ir.Value] = []
        for n in names:
            self.require(n, role="output")
            value = self._values[n]
            outs.append(value)
            if (
                n in declared
                and value.type is not None
                and (not isinstance(value.type, ir.TensorType) or value.shape is not None)
            ):
                continue
            t = self.type_of(n)  # inferred; also for a declared output whose rank is unknown
            if t is not None and (n not in declared or t.tensor_type.HasField("shape")):
                _types.declare_type(value, t)
        kept = {id(v) for v in outs}
        defined = {id(v) for v in [*graph.inputs, *graph.initializers.values()]}
        for value in before:  # a former output keeps its type as inferred, not declared
            if id(value) not in kept and id(value) not in defined and value.type is not None:
                value.meta[_types.INFERRED] = (value.type, value.shape)
                value.type, value.shape = None, None
        graph.outputs.clear()
        graph.outputs.extend(outs)
        self._view.set_outputs([ir.serde.serialize_value(v) for v in outs])

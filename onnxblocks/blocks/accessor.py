"""The model accessor: the model a build adds nodes to, with its names, types and held weights.

:class:`ModelAccessor` adds nodes (:meth:`ModelAccessor.op`), graph inputs,
constants and outputs on top of the :class:`~onnxblocks.blocks.value_index.ValueIndex`
of the working model, and finishes the model once the build ends. Opening a
build (``base`` / ``empty_base``) lives in :mod:`onnxblocks.blocks.opening`.

Validation model: each node added through :meth:`ModelAccessor.op` is checked on
its own (:func:`onnxblocks.blocks.checking.check_node`). The whole model is
checked once, when it is finished (:meth:`ModelAccessor.finish`), on a skeleton
that holds no weight bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxblocks._core import active_build as _context
from onnxblocks._core import limits as _limits
from onnxblocks._core import weights as _weights
from onnxblocks._core.errors import InvalidValueError, StateError, UnknownNameError, did_you_mean
from onnxblocks._core.html import HtmlDisplay
from onnxblocks._core.validation import check_skeleton
from onnxblocks.blocks.checking import DEFAULT_DOMAIN_VERSIONS, check_node
from onnxblocks.blocks.value import Value
from onnxblocks.blocks.value_index import ValueIndex


class ModelAccessor(ValueIndex, HtmlDisplay):
    """Holds the model a build adds nodes to, with its names, types and held weights.

    Attributes:
        weights: The :class:`~onnxblocks._core.weights.WeightStore` of held initializers.
        names: The graph's :class:`~onnxblocks._core.naming.NameAuthority`.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        model_path: str | os.PathLike | None = None,
        store: _weights.WeightStore | None = None,
    ) -> None:
        self._path = os.fspath(model_path) if model_path is not None else None
        self.weights = store if store is not None else _weights.WeightStore()
        self._open = True
        self._finished_cache: onnx.ModelProto | None = None
        self.block_stack: list[Any] = []
        self._const_data: dict[str, onnx.TensorProto] = {}
        super().__init__(model)

    # ------------------------------------------------------------------ access
    @property
    def model(self) -> onnx.ModelProto:
        """The model being built.

        Inside the ``with`` block this is the working model, whose large
        initializers are stubs. After the ``with`` block it is the finished,
        complete model (computed once).
        """
        if self._open:
            return self._model
        if self._finished_cache is None:
            self._finished_cache = self.materialize(self._model)
        return self._finished_cache

    @property
    def working_model(self) -> onnx.ModelProto:
        """The working model (stubs in place of large initializers), open or closed."""
        return self._model

    @property
    def path(self) -> str:
        """Path of the base model file.

        Raises:
            RuntimeError: if the build was opened without ``model_path``.
        """
        if self._path is None:
            raise StateError("This build has no model path: pass model_path= to onnxblocks.base().")
        return self._path

    @property
    def has_path(self) -> bool:
        """True when the build knows the base model's file path."""
        return self._path is not None

    @property
    def custom_op_libraries(self) -> tuple[str, ...]:
        """Custom op libraries registered with :func:`custom_op_library` for this build."""
        return _context.custom_op_libraries()

    # ------------------------------------------------------------ building
    def replace_model(self, model: onnx.ModelProto) -> None:
        """Make ``model``'s contents the working model, in place, and re-index names and types.

        The working ModelProto object stays the same (code holding ``self.base`` sees the change).
        """
        self._model.CopyFrom(model)
        self._const_data.clear()
        self._reset()
        self._sync()

    def where(self) -> str:
        """A prefix naming the block being built, for error messages."""
        if not self.block_stack:
            return ""
        return " > ".join(type(b).__name__ for b in self.block_stack) + ": "

    def ensure_domain(self, domain: str, version: int | None = None) -> None:
        """Make the model import ``domain`` (at its default version unless given)."""
        if domain in ("", "ai.onnx"):
            return
        _limits.ensure_opset(self._model, domain, version or DEFAULT_DOMAIN_VERSIONS.get(domain, 1))

    def domain_version(self, domain: str) -> int | None:
        """The opset version the model imports for ``domain``."""
        domain = "" if domain == "ai.onnx" else domain
        for opset in self._model.opset_import:
            if ("" if opset.domain == "ai.onnx" else opset.domain) == domain:
                return opset.version
        return None

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
                if o in self._defined:
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
        types = self._check_node(node)
        if output_types is not None:
            types.update(
                {o: t for o, t in zip(out_names, output_types, strict=False) if t is not None}
            )
        self._model.graph.node.append(node)
        self._sync()
        self._types.update(types)
        values = tuple(Value(o) for o in out_names)
        return values[0] if len(values) == 1 else values

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

        version = self.domain_version("")
        if version is None or version >= UPGRADE_OPSET or not onnx.defs.has(op_type):
            return False
        try:
            onnx.defs.get_schema(op_type, version, "")
            return False
        except onnx.defs.SchemaError:
            pass
        try:
            onnx.defs.get_schema(op_type, UPGRADE_OPSET, "")
        except onnx.defs.SchemaError:
            return False
        from onnxblocks.ir.opset import convert_opset  # converting walks subgraphs (the IR layer)

        converted = convert_opset(
            self._model, UPGRADE_OPSET, f"the model (for {op_type}, which needs a newer opset)"
        )
        self.replace_model(converted)
        return True

    def _check_node(self, node: onnx.NodeProto) -> dict[str, onnx.TypeProto]:
        opsets = {
            ("" if o.domain == "ai.onnx" else o.domain): o.version for o in self._model.opset_import
        }
        return check_node(node, opsets, self.type_of, self._const_data, self.where())

    def add_input(
        self, name: str, elem_type: int, shape: Sequence[int | str | None] | None
    ) -> Value:
        """Add a graph input, or return the existing input of that name.

        Raises:
            ValueError: if ``name`` is already a value that is not a graph input.
        """
        self._sync()
        if name in self._defined:
            if any(i.name == name for i in self._model.graph.input):
                return Value(name)
            raise InvalidValueError(
                f"{self.where()}cannot create graph input '{name}': the model already has a "
                "value of that "
                "name that is not a graph input. Choose another name."
            )
        self._model.graph.input.append(helper.make_tensor_value_info(name, elem_type, shape))
        self._sync()
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

    def set_outputs(self, names: Sequence[str]) -> None:
        """Make ``names`` the graph outputs, in order, with their inferred types.

        Raises:
            UnknownNameError: if a name is not a value of the model.
        """
        existing = {o.name: o for o in self._model.graph.output}
        outs = []
        for n in names:
            self.require(n, role="output")
            declared = existing.get(n)
            if declared is not None and (
                declared.type.WhichOneof("value") != "tensor_type"
                or declared.type.tensor_type.HasField("shape")
            ):
                outs.append(declared)
                continue
            t = self.type_of(n)  # inferred; also for a declared output whose rank is unknown
            vi = onnx.ValueInfoProto(name=n)
            if t is not None and (declared is None or t.tensor_type.HasField("shape")):
                vi.type.CopyFrom(t)
            elif declared is not None:
                vi.CopyFrom(declared)
            outs.append(vi)
        del self._model.graph.output[:]
        self._model.graph.output.extend(outs)
        self._sync()

    # ------------------------------------------------------------ finishing
    def tensor(self, name: str) -> np.ndarray:
        """The data of an initializer as a numpy array, held or inline.

        Raises:
            UnknownNameError: if the model has no initializer ``name``.
        """
        if name in self.weights:
            return self.weights.source(name).array()
        for init in self._model.graph.initializer:
            if init.name == name:
                return numpy_helper.to_array(init)
        raise UnknownNameError(
            f"The model has no initializer '{name}'."
            f"{did_you_mean(name, (i.name for i in self._model.graph.initializer))}"
        )

    def materialize(self, model: onnx.ModelProto | None = None) -> onnx.ModelProto:
        """A complete copy of ``model`` (default: the working model) with every stub replaced by
        its data.
        """
        src = self._model if model is None else model
        out = onnx.ModelProto()
        out.CopyFrom(src)
        for init in out.graph.initializer:
            if _weights.is_stub(init) and init.name in self.weights:
                init.CopyFrom(self.weights.source(init.name).to_tensor_proto())
        return out

    def finish(self, materialize: bool = True) -> onnx.ModelProto:
        """Check the finished model once and return a copy ready to save or run.

        The check runs on a skeleton without weight bytes. The IR version is
        stamped so that the installed onnxruntime loads the model.

        Raises:
            ValueError: naming graph inputs or outputs whose rank is unknown.
            onnx.checker.ValidationError: if the model is invalid.
        """
        from onnxblocks.gradient.intake import check_ranks  # a lower layer, loaded on first use

        check_ranks(self._model, "the model")
        check_skeleton(self._model)
        if materialize:
            model = self.materialize()
        else:
            model = onnx.ModelProto()
            model.CopyFrom(self._model)
        return _limits.stamp_versions(model)

    def close(self) -> None:
        """Mark the build as ended (``.model`` then returns the complete model)."""
        self._open = False

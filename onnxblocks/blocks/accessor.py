"""The model accessor: which model the blocks of a build add nodes to.

``base(model)`` and ``empty_base()`` open a build. The active accessor lives in a
:class:`contextvars.ContextVar`, so builds in two threads (or two asyncio tasks)
never see each other, and a nested build restores the outer one when it ends.

The accessor works on a copy of the caller's model in which large initializers
are stubs (see :mod:`onnxblocks.blocks.weights`): the caller's ModelProto is
never mutated and its weights are never copied while the graph is built.

Validation model: each node added through :meth:`ModelAccessor.op` is checked on
its own (schema, attributes, input names, and type inference from its inputs'
types). The whole model is checked once, when it is finished
(:meth:`ModelAccessor.finish`), on a skeleton that holds no weight bytes.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxblocks import _limits
from onnxblocks._proto import copy_fields
from onnxblocks.blocks import weights as _weights
from onnxblocks.blocks.naming import NameAuthority
from onnxblocks.blocks.value import Value
from onnxblocks.errors import NoActiveModelError, UnknownNameError, did_you_mean, preview

_ACTIVE: contextvars.ContextVar[ModelAccessor | None] = contextvars.ContextVar("onnxblocks_accessor", default=None)
_CUSTOM_OP_LIBRARIES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "onnxblocks_custom_op_libraries", default=()
)

# Domains whose schemas onnx knows, so their nodes can be checked locally.
_ONNX_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"}
_DEFAULT_DOMAIN_VERSIONS = {"com.microsoft": _limits.MS_OPSET, "ai.onnx.ml": 3}


class ModelAccessor:
    """Holds the model a build adds nodes to, with its names, types and held weights.

    Attributes:
        weights: The :class:`~onnxblocks.blocks.weights.WeightStore` of held initializers.
        names: The graph's :class:`~onnxblocks.blocks.naming.NameAuthority`.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        model_path: str | os.PathLike | None = None,
        store: _weights.WeightStore | None = None,
    ) -> None:
        self._model = model
        self._path = os.fspath(model_path) if model_path is not None else None
        self.weights = store if store is not None else _weights.WeightStore()
        self._types: dict[str, onnx.TypeProto] = {}
        self._defined: set[str] = set()
        self._seen = {"input": 0, "initializer": 0, "node": 0, "value_info": 0, "output": 0}
        self.names = NameAuthority()
        self._open = True
        self._finished_cache: onnx.ModelProto | None = None
        self.block_stack: list[Any] = []
        self._inferred_all = False
        self._const_data: dict[str, onnx.TensorProto] = {}
        self._sync()

    def _repr_html_(self) -> str | None:
        """Jupyter display: a summary and picture of the model being built."""
        try:
            from onnxblocks.display import repr_html
        except ImportError:
            return None
        return repr_html(self)

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
            raise RuntimeError("This build has no model path: pass model_path= to onnxblocks.base().")
        return self._path

    @property
    def has_path(self) -> bool:
        """True when the build knows the base model's file path."""
        return self._path is not None

    @property
    def custom_op_libraries(self) -> tuple[str, ...]:
        """Custom op libraries registered with :func:`custom_op_library` for this build."""
        return _CUSTOM_OP_LIBRARIES.get()

    # ------------------------------------------------------------ value table
    def _sync(self) -> None:
        """Index graph entries appended since the last call (also by code that edits the proto).

        Only the new entries are visited (slicing a repeated field copies just the
        slice), so a block that adds k nodes to an N-node graph costs O(k), not O(N).
        """
        g = self._model.graph
        fields = {"input": g.input, "initializer": g.initializer, "node": g.node, "value_info": g.value_info,
                  "output": g.output}
        if any(len(fields[k]) < self._seen[k] for k in fields):
            self._types.clear()
            self._defined.clear()
            self._seen = dict.fromkeys(self._seen, 0)
        for vi in g.input[self._seen["input"]:]:
            self._defined.add(vi.name)
            self.names.reserve(vi.name)
            if vi.type.WhichOneof("value"):
                self._types[vi.name] = vi.type
        for init in g.initializer[self._seen["initializer"]:]:
            self._defined.add(init.name)
            self.names.reserve(init.name)
            self._types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        for node in g.node[self._seen["node"]:]:
            if node.name:
                self.names.reserve(node.name)
            for out in node.output:
                if out:
                    self._defined.add(out)
                    self.names.reserve(out)
        for vi in g.value_info[self._seen["value_info"]:] + g.output[self._seen["output"]:]:
            self.names.reserve(vi.name)
            if vi.type.WhichOneof("value"):
                self._types.setdefault(vi.name, vi.type)
        self._seen = {k: len(v) for k, v in fields.items()}

    def replace_model(self, model: onnx.ModelProto) -> None:
        """Make ``model``'s contents the working model, in place, and re-index names and types.

        The working ModelProto object stays the same (code holding ``self.base`` sees the change).
        """
        self._model.CopyFrom(model)
        self._types.clear()
        self._defined.clear()
        self._const_data.clear()
        self._seen = dict.fromkeys(self._seen, 0)
        self._inferred_all = False
        self._sync()

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
            UnknownNameError: naming the value, the block being built, the graph's
                inputs and outputs, and close matches.
        """
        if not isinstance(name, str):
            raise TypeError(f"{self.where()}{role} must be a value name (str), not {type(name).__name__}: {name!r}.")
        if self.has_value(name):
            return
        g = self._model.graph
        raise UnknownNameError(
            f"{self.where()}{role} '{name}' is not a value of the model.{did_you_mean(name, self._defined)} "
            f"Graph inputs: {preview(i.name for i in g.input)}; graph outputs: {preview(o.name for o in g.output)}. "
            "Pass the name of an existing value, or create an input first (e.g. onnxblocks.blocks.InputLike)."
        )

    def where(self) -> str:
        """A prefix naming the block being built, for error messages."""
        if not self.block_stack:
            return ""
        return " > ".join(type(b).__name__ for b in self.block_stack) + ": "

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
            inferred = onnx.shape_inference.infer_shapes(self._model, strict_mode=False, data_prop=True)
        except Exception:
            return
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.type.WhichOneof("value"):
                self._types.setdefault(vi.name, vi.type)

    def elem_type(self, name: str) -> int | None:
        """The tensor element type of a value (``onnx.TensorProto.FLOAT`` ...), or None if unknown."""
        t = self.type_of(name)
        if t is None:
            return None
        kind = t.WhichOneof("value")
        if kind == "tensor_type":
            return t.tensor_type.elem_type or None
        if kind == "sequence_type" and t.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
            return t.sequence_type.elem_type.tensor_type.elem_type or None
        return None

    def shape_of(self, name: str) -> list[int | str | None] | None:
        """The shape of a tensor value: ints, symbolic dim names, or None per dim; None if unknown rank."""
        t = self.type_of(name)
        if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            return None
        dims: list[int | str | None] = []
        for d in t.tensor_type.shape.dim:
            kind = d.WhichOneof("value")
            dims.append(d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
        return dims

    def set_type(self, name: str, type_proto: onnx.TypeProto) -> None:
        """Record the type of a value (used for ops whose schema onnx does not know)."""
        self._types[name] = type_proto

    # ------------------------------------------------------------ building
    def ensure_domain(self, domain: str, version: int | None = None) -> None:
        """Make the model import ``domain`` (at its default version unless given)."""
        if domain in ("", "ai.onnx"):
            return
        _limits.ensure_opset(self._model, domain, version or _DEFAULT_DOMAIN_VERSIONS.get(domain, 1))

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
                    raise ValueError(
                        f"{self.where()}output name '{o}' of {op_type} is already a value of the model; "
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
        types = self._check_node(node)
        if output_types is not None:
            types.update({o: t for o, t in zip(out_names, output_types, strict=False) if t is not None})
        self._model.graph.node.append(node)
        self._sync()
        self._types.update(types)
        values = tuple(Value(o) for o in out_names)
        return values[0] if len(values) == 1 else values

    def _check_node(self, node: onnx.NodeProto) -> dict[str, onnx.TypeProto]:
        """Check one node against its schema and infer its output types from its inputs'."""
        domain = node.domain or ""
        if domain not in _ONNX_DOMAINS:
            return {}
        opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in self._model.opset_import}
        version = opsets.get(domain, _DEFAULT_DOMAIN_VERSIONS.get(domain, 1))
        try:
            schema = onnx.defs.get_schema(node.op_type, version, domain)
        except onnx.defs.SchemaError:
            raise ValueError(
                f"{self.where()}op '{node.op_type}' (domain '{domain or 'ai.onnx'}') does not exist at opset "
                f"{version} of the model. Check the op name, or import a newer opset."
            ) from None
        ctx = onnx.checker.C.CheckerContext()
        ctx.ir_version = _limits.MAX_IR_VERSION
        ctx.opset_imports = opsets
        try:
            onnx.checker.check_node(node, ctx)
        except onnx.checker.ValidationError as exc:
            raise ValueError(f"{self.where()}node {node.name} ({node.op_type}) is invalid: {exc}") from None
        input_types = {}
        input_data = {i: self._const_data[i] for i in node.input if i in self._const_data}
        for i in node.input:
            if not i:
                continue
            t = self.type_of(i)
            if t is None:
                return {}
            input_types[i] = t
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, input_types, input_data=input_data,
                opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        except Exception as exc:
            described = ", ".join(f"'{i}': {_describe(t)}" for i, t in input_types.items())
            raise TypeError(
                f"{self.where()}node {node.name} ({node.op_type}) does not accept its inputs ({described}): "
                f"{str(exc).strip()}. Make the inputs' dtypes and shapes fit the op (e.g. onnxblocks.blocks.Cast "
                "for dtypes)."
            ) from None
        return {k: v for k, v in inferred.items() if v.WhichOneof("value")}

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
            raise ValueError(
                f"{self.where()}cannot create graph input '{name}': the model already has a value of that "
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
            if n in existing:
                outs.append(existing[n])
                continue
            t = self.type_of(n)
            vi = onnx.ValueInfoProto(name=n)
            if t is not None:
                vi.type.CopyFrom(t)
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
        """A complete copy of ``model`` (default: the working model) with every stub replaced by its data."""
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
            onnx.checker.ValidationError: if the model is invalid.
        """
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


def _describe(t: onnx.TypeProto) -> str:
    if t.WhichOneof("value") == "tensor_type":
        dtype = onnx.TensorProto.DataType.Name(t.tensor_type.elem_type)
        dims = [d.dim_value or d.dim_param or "?" for d in t.tensor_type.shape.dim]
        return f"{dtype.lower()}{dims}"
    return t.WhichOneof("value") or "unknown"


def check_skeleton(model: onnx.ModelProto) -> None:
    """Run onnx's model checker once on ``model`` without touching weight bytes.

    Stubs and external-data initializers are turned into graph inputs of the same
    type in a throw-away skeleton, so the check costs O(graph), not O(weights).
    """
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip={"graph"})
    copy_fields(model.graph, skeleton.graph, skip={"initializer"})
    g, sg = model.graph, skeleton.graph
    input_names = {i.name for i in g.input}
    for init in g.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            if init.name not in input_names:
                sg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            sg.initializer.append(init)
    _limits.stamp_versions(skeleton)
    onnx.checker.check_model(skeleton)


def current() -> ModelAccessor:
    """The accessor of the build this code runs in.

    Raises:
        NoActiveModelError: outside ``onnxblocks.base(...)`` / ``onnxblocks.empty_base()``.
    """
    accessor = _ACTIVE.get()
    if accessor is None:
        raise NoActiveModelError(
            "No model is being built here. Call blocks inside `with onnxblocks.base(model):` "
            "or `with onnxblocks.empty_base():`."
        )
    return accessor


def active() -> ModelAccessor | None:
    """The active accessor, or None outside a build."""
    return _ACTIVE.get()


def working_copy(
    model: onnx.ModelProto,
    model_path: str | os.PathLike | None = None,
    hold_threshold: int | None = None,
) -> tuple[onnx.ModelProto, _weights.WeightStore]:
    """Copy a model's structure, holding large initializers aside as stubs.

    The caller's model is not mutated, and held initializers' bytes are not copied.
    """
    store = _weights.WeightStore()
    base_dir = Path(model_path).parent if model_path is not None else None
    copy = onnx.ModelProto()
    copy_fields(model, copy, skip={"graph"})
    copy_fields(model.graph, copy.graph, skip={"initializer"})
    g, cg = model.graph, copy.graph
    for init in g.initializer:
        if _weights.should_hold(init, hold_threshold):
            cg.initializer.append(store.hold(init, base_dir))
        else:
            cg.initializer.append(init)
    return copy, store


@contextmanager
def base(model: onnx.ModelProto, model_path: str | os.PathLike | None = None) -> Iterator[ModelAccessor]:
    """Open a build on top of ``model``.

    Example:
        >>> with onnxblocks.base(model) as accessor:
        ...     loss = onnxblocks.losses.MSELoss()("output")
        >>> finished = accessor.model

    Args:
        model: The base model. It is not mutated; its large initializers are not copied.
        model_path: The file the model was loaded from; needed when the model keeps
            its weights in external data files (loaded with ``load_external_data=False``).

    Yields:
        The :class:`ModelAccessor` of the build.

    Raises:
        TypeError: if ``model`` is not an ``onnx.ModelProto``.
        ValueError: if the model needs a newer opset than onnxruntime-training 1.19.2 supports.
    """
    if not isinstance(model, onnx.ModelProto):
        hint = " Load it first with onnx.load(path), or pass the path as model_path." if isinstance(
            model, (str, os.PathLike)) else ""
        raise TypeError(f"onnxblocks.base() takes an onnx.ModelProto, not {type(model).__name__}.{hint}")
    _limits.check_opset_supported(model)
    working, store = working_copy(model, model_path)
    with _activate(ModelAccessor(working, model_path, store)) as accessor:
        yield accessor


@contextmanager
def empty_base(opset_version: int | None = None) -> Iterator[ModelAccessor]:
    """Open a build on a new, empty model.

    Args:
        opset_version: The ai.onnx opset to import; defaults to the highest that
            onnxruntime-training 1.19.2 supports (21).

    Raises:
        ValueError: if ``opset_version`` is above what the runtime supports.
    """
    version = opset_version or _limits.MAX_ONNX_OPSET
    model = helper.make_model(
        helper.make_graph([], "graph", [], []),
        opset_imports=[helper.make_opsetid("", version), helper.make_opsetid(_limits.MS_DOMAIN, _limits.MS_OPSET)],
        producer_name="onnxblocks",
    )
    _limits.check_opset_supported(model, f"opset_version={version}")
    _limits.stamp_versions(model)
    with _activate(ModelAccessor(model)) as accessor:
        yield accessor


@contextmanager
def _activate(accessor: ModelAccessor) -> Iterator[ModelAccessor]:
    token = _ACTIVE.set(accessor)
    try:
        yield accessor
    finally:
        _ACTIVE.reset(token)
        accessor.close()


@contextmanager
def custom_op_library(path: str | os.PathLike) -> Iterator[str]:
    """Register a custom op library (a shared object) for the builds inside this block.

    ONNX Runtime loads it when it optimizes the model and builds its gradient.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    resolved = os.fspath(path)
    if not os.path.isfile(resolved):
        raise FileNotFoundError(
            f"Custom op library '{resolved}' does not exist. Pass the path of the compiled shared "
            "library (.so/.dll/.dylib) that registers your custom ops."
        )
    token = _CUSTOM_OP_LIBRARIES.set((*_CUSTOM_OP_LIBRARIES.get(), resolved))
    try:
        yield resolved
    finally:
        _CUSTOM_OP_LIBRARIES.reset(token)


def custom_op_libraries() -> tuple[str, ...]:
    """Custom op libraries registered in the current context."""
    return _CUSTOM_OP_LIBRARIES.get()

"""The inputs and outputs of the graphs on their way through ONNX Runtime's gradient builder.

:func:`~onnxblocks.gradient.builder.build_training_graphs` changes the signature
of its working copy of the forward model in steps, each undone or completed later:

* outputs: the user outputs are chosen and checked (loss first, a float scalar)
  (:func:`select_outputs`, :func:`check_loss`, :func:`keep_only_outputs`);
* parameters become graph inputs after the user inputs (:func:`parameters_to_inputs`);
* held constants (and the constants named by the caller) are graph inputs while
  ONNX Runtime works, and initializers again afterwards
  (:func:`held_constants_to_inputs`, :func:`restore_held_constants`);
* a loss that is not float32 gets a temporary float32 ``Cast`` for ONNX Runtime
  to seed (:func:`float_seed`, :func:`drop_float_seed`);
* the training model's inputs and outputs are put in the documented order
  (:func:`order_inputs_and_outputs`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core.contracts import (
    ACCUMULATED_SUFFIX,
    BUFFER_SUFFIX,
    GRADIENT_SUFFIX,
    gradient_name,
)
from onnxblocks._core.errors import (
    GradientError,
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.gradient.parameters import FLOAT_TYPES, ParameterPartition
from onnxblocks.ir.edit import values_by_name
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.proto import replace_field
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.types import infer_proto_types, proto_elem_type, proto_shape

#: Name endings by which ONNX Runtime's training API ``Module`` recognises gradients.
GRADIENT_ENDINGS = (
    GRADIENT_SUFFIX,
    GRADIENT_SUFFIX + BUFFER_SUFFIX,
    GRADIENT_SUFFIX + ACCUMULATED_SUFFIX,
)


# ------------------------------------------------------------------ outputs
def select_outputs(
    graph: ir.Graph | onnx.GraphProto, outputs: Sequence[str] | None
) -> tuple[str, ...]:
    """The user outputs, loss first: ``outputs``, or the graph's outputs when None.

    Raises:
        ValueError: when there is no output at all.
        UnknownNameError: for a name that is not a graph output.
    """
    declared = graph.output if isinstance(graph, onnx.GraphProto) else graph.outputs
    existing = [o.name or "" for o in declared]
    if outputs is None:
        if not existing:
            raise InvalidValueError(
                "The model has no graph output to use as the loss. Return the loss from the block."
            )
        return tuple(existing)
    names = tuple(str(n) for n in outputs)
    if not names:
        raise InvalidValueError("No output given: the first output must be the loss.")
    for name in names:
        if name not in existing:
            raise UnknownNameError(
                f"'{name}' is not a graph output of the model.{did_you_mean(name, existing)} "
                f"Graph outputs: {preview(existing)}."
            )
    return names


def check_loss(types: dict[str, onnx.TypeProto], loss: str) -> None:
    """Raise when the loss is known not to be a floating-point scalar (shape [] or all-ones dims).

    Args:
        types: What is known of the model's types, by value name (the loss's at least).
        loss: The loss's name.

    Raises:
        TypeError: for a loss whose element type is not floating point.
        ValueError: for a loss with a known dimension other than 1.
    """
    elem = proto_elem_type(types, loss)
    if elem is not None and elem not in FLOAT_TYPES:
        raise InvalidTypeError(
            f"The loss output '{loss}' has element type "
            f"{onnx.TensorProto.DataType.Name(elem).lower()}; the loss "
            "must be a floating-point scalar. Return a float loss as the first output (Cast it "
            "if needed)."
        )
    t = types.get(loss)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return
    shown = [
        d.dim_value if d.WhichOneof("value") == "dim_value" else (d.dim_param or "?")
        for d in t.tensor_type.shape.dim
    ]
    if any(d != 1 for d in shown):
        raise InvalidValueError(
            f"The loss output '{loss}' has shape {shown}, but the loss must be a scalar (shape [] "
            "or [1]): "
            "gradients start from it. Reduce it (e.g. a loss with reduction='mean' or 'sum', or "
            "onnxblocks.blocks.ReduceMean(keepdims=False)), and pass other outputs as additional "
            "outputs."
        )


def keep_only_outputs(graph: ir.Graph, names: Sequence[str]) -> None:
    """Make ``names`` the graph outputs, in order."""
    existing = {o.name: o for o in graph.outputs}
    outputs = [existing[n] for n in names]
    graph.outputs.clear()
    graph.outputs.extend(outputs)


def warn_gradient_like_names(user_inputs: Sequence[str], user_outputs: Sequence[str]) -> None:
    """Warn about user inputs/outputs that ONNX Runtime's training API would take for gradients.

    The warnings point at the caller of the function that calls this one
    (``build_training_graphs``'s caller).
    """
    inputs = [n for n in user_inputs if n.endswith(GRADIENT_ENDINGS)]
    outputs = [n for n in user_outputs if n.endswith(GRADIENT_ENDINGS)]
    if inputs:
        warnings.warn(
            f"Graph inputs {preview(inputs)} end like gradient buffers; ONNX Runtime's training "
            "API (Module) will "
            "treat them as gradient buffers and fail to feed them. Rename them in the base model.",
            UserWarning,
            stacklevel=3,
        )
    if outputs:
        warnings.warn(
            f"Outputs {preview(outputs)} end like gradients; ONNX Runtime's training API "
            "(Module) will not "
            "return them from train_step. Rename them (an InferenceSession still returns them).",
            UserWarning,
            stacklevel=3,
        )


# ------------------------------------------------------------------ inputs
def parameters_to_inputs(graph: ir.Graph, parameters: Sequence[str]) -> None:
    """Move the parameter initializers to graph inputs placed after the user inputs, in
    ``parameters`` order.

    Initializers that are also listed as graph inputs (old exporters'
    ``keep_initializers_as_inputs``)
    and are not parameters become plain constants: the training API would otherwise ask the user to
    feed them.
    """
    wanted = set(parameters)
    param_inputs = []
    for name in parameters:  # an input of the tensor's type; its bytes go to the checkpoint
        value = graph.initializers.pop(name)
        tensor = value.const_value
        if tensor is not None:
            value.type, value.shape = ir.TensorType(tensor.dtype), ir.Shape(tensor.shape.numpy())
        value.const_value = None
        param_inputs.append(value)
    constants = set(graph.initializers)
    user_inputs = [v for v in graph.inputs if v.name not in wanted and v.name not in constants]
    graph.inputs.clear()
    graph.inputs.extend(user_inputs + param_inputs)


def held_constants_to_inputs(
    model: onnx.ModelProto, also: Iterable[str] = ()
) -> list[onnx.TensorProto]:
    """Turn held stubs and the initializers named in ``also`` into graph inputs.

    Returns:
        Copies of the initializers that became inputs, for :func:`restore_held_constants`.
    """
    graph = model.graph
    lifted = set(also)

    def is_lifted(init: onnx.TensorProto) -> bool:
        return init.data_location == onnx.TensorProto.EXTERNAL or init.name in lifted

    held = [init for init in graph.initializer if is_lifted(init)]
    if not held:
        return []
    stubs = []
    for init in held:
        stub = onnx.TensorProto()
        stub.CopyFrom(init)
        stubs.append(stub)
    kept = [init for init in graph.initializer if not is_lifted(init)]
    replace_field(graph.initializer, kept)
    graph.input.extend(
        helper.make_tensor_value_info(s.name, s.data_type, list(s.dims)) for s in stubs
    )
    return stubs


def restore_held_constants(graph: ir.Graph, stubs: Sequence[onnx.TensorProto]) -> None:
    """Undo :func:`held_constants_to_inputs` on the IR of ONNX Runtime's output (dropping
    constants no node reads): each input becomes an initializer again, held stubs staying stubs.
    """
    if not stubs:
        return
    names = {s.name for s in stubs}
    lifted = {v.name: v for v in graph.inputs if v.name in names}
    for value in lifted.values():
        graph.inputs.remove(value)
    for stub in stubs:
        restored = lifted.get(stub.name)
        if restored is not None and restored.uses():
            restored.const_value = ir.serde.deserialize_tensor(stub)
            graph.register_initializer(restored)


def declare_output_gradients(
    model: onnx.ModelProto, types: dict[str, onnx.TypeProto], outputs: Sequence[str]
) -> None:
    """Declare ``<y>_grad`` of each of ``outputs`` as a graph input of ``y``'s type, in place.

    ONNX Runtime's vector-Jacobian graph reads them without declaring them; declared, its IR
    reads them as the inputs they are.
    """
    declared = {vi.name: vi for vi in model.graph.input}
    for name in outputs:
        info = helper.make_value_info(gradient_name(name), types[name])
        if info.name in declared:
            declared[info.name].CopyFrom(info)
        else:
            model.graph.input.append(info)


# ------------------------------------------------------------------ the loss seed
def float_seed(model: onnx.ModelProto, loss: str) -> str:
    """The value ONNX Runtime differentiates: the loss, or a float32 ``Cast`` of a non-float32 loss.

    ONNX Runtime seeds the backward pass with a float32 ``1`` for the loss's gradient,
    so a double (or float16) loss fails with "bound to different types". Its float32
    cast gets the seed instead and the ``Cast``'s gradient brings it back to the
    loss's type (exactly: the seed is 1). The cast is a temporary graph output
    (:func:`drop_float_seed` removes it).
    """
    types = infer_proto_types(model)
    elem = proto_elem_type(types, loss)
    if elem is None or elem == onnx.TensorProto.FLOAT:
        return loss
    ir_model = from_proto(model)
    graph = ir_model.graph
    names = graph_names(graph)
    value = next(v for v in graph.outputs if v.name == loss)  # the caller's loss is a graph output
    cast = ir.Node(
        "",
        "Cast",
        [value],
        [ir.AttrInt64("to", onnx.TensorProto.FLOAT)],
        outputs=[ir.Value(name=names.fresh(f"{loss}.float32"))],
        name=names.fresh("Cast"),
    )
    graph.append(cast)
    seed = cast.outputs[0]
    seed.type = ir.TensorType(ir.DataType.FLOAT)
    dims = proto_shape(types, loss)
    seed.shape = ir.Shape(dims) if dims is not None else None
    graph.outputs.append(seed)
    model.CopyFrom(to_proto(ir_model))
    return seed.name or ""


def drop_float_seed(graph: ir.Graph, seed: str) -> None:
    """Remove the temporary float32 loss output (and its Cast when nothing else reads it), on the
    IR of the model ONNX Runtime built (the builder's other restorations edit the same IR).
    """
    found = [v for v in graph.outputs if v.name == seed]
    for output in found:
        graph.outputs.remove(output)
    value = found[0] if found else values_by_name(graph).get(seed)
    producer = value.producer() if value is not None else None
    if value is not None and producer is not None and producer.graph is graph:
        if not value.uses() and not value.is_graph_output():
            graph.remove(producer, safe=True)


# ------------------------------------------------------------------ the training model
def order_inputs_and_outputs(
    graph: ir.Graph,
    signature: dict[str, onnx.ValueInfoProto],
    user_inputs: Sequence[str],
    partition: ParameterPartition,
    user_outputs: Sequence[str],
) -> None:
    """Inputs: user inputs, then parameters. Outputs: user outputs, parameter gradients, input
    gradients.

    Args:
        graph: The IR of the training model ONNX Runtime built (changed in place).
        signature: The forward model's graph inputs by name, for inputs ONNX Runtime dropped.
        user_inputs: The user inputs, in order.
        partition: The parameters (inputs after the user inputs) and the values with a gradient
            output.
        user_outputs: The user outputs, loss first.

    Raises:
        GradientError: when ONNX Runtime added inputs or left out outputs.
    """
    inputs = {str(v.name): v for v in graph.inputs}
    wanted_inputs = [*user_inputs, *partition.parameters]
    extra = [n for n in inputs if n not in set(wanted_inputs)]
    for name in wanted_inputs:  # ONNX Runtime dropped an input nothing reads: keep the signature
        if name not in inputs:
            inputs[name] = ir.serde.deserialize_value_info_proto(signature[name], None)
    refuse_extra_inputs(extra)
    graph.inputs.clear()
    graph.inputs.extend(inputs[n] for n in wanted_inputs)
    order_outputs(graph, [*user_outputs, *(gradient_name(n) for n in partition.requires_grad)])


def refuse_extra_inputs(extra: Sequence[str]) -> None:
    """Raise when ONNX Runtime's gradient builder added graph inputs the signature does not have.

    Raises:
        GradientError: naming them.
    """
    if extra:
        raise GradientError(
            f"ONNX Runtime's gradient builder added unexpected graph inputs {preview(extra)}. "
            "Please report this with the model."
        )


def order_outputs(graph: ir.Graph, wanted: Sequence[str]) -> None:
    """Make ``wanted`` the graph's outputs, in that order (ONNX Runtime's builder orders them its
    own way).

    Raises:
        GradientError: when the builder produced no output for a wanted name.
    """
    produced = {v.name: v for v in graph.outputs}
    absent = [n for n in wanted if n not in produced]
    if absent:
        raise GradientError(
            f"ONNX Runtime's gradient builder produced no output for {preview(absent)}. "
            "Please report this with the model."
        )
    dropped = [v for v in graph.outputs if v.name not in set(wanted)]
    graph.outputs.clear()
    graph.outputs.extend(produced[n] for n in wanted)
    for value in dropped:  # a dropped output's declaration goes with it
        if not value.is_graph_output():
            value.type, value.shape = None, None

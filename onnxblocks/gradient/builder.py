"""Build the training and eval models by delegating autodiff to ONNX Runtime.

ONNX Runtime's native gradient builder (``GradientGraphBuilder`` in
``onnxruntime.capi._pybind_state``) differentiates the forward graph. This module
prepares the forward graph for it and turns its result into the models ONNX
Runtime's training API runs:

1. The normalisation passes (:mod:`onnxblocks.gradient.normalize`) rewrite
   patterns the gradient builder cannot handle.
2. Trainable and frozen parameters become graph inputs, after the user inputs.
3. The eval model is this forward graph with training-mode ops switched off
   (:mod:`onnxblocks.gradient.eval_model`).
4. Held (large) initializers that are *not* parameters are constants whose bytes
   onnxblocks never copies; ONNX Runtime gets them as temporary graph inputs and
   they are turned back into held stubs afterwards.
5. ``get_optimized_model`` runs ONNX Runtime's pre-training transformers and
   ``GradientGraphBuilder`` adds the gradient graph.
6. Inputs and outputs are put in the documented order and the gradients are
   accumulated (:mod:`onnxblocks.gradient.accumulation`).

No weight bytes are serialized on the way: parameters are inputs and held
constants are inputs while ONNX Runtime works.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper

from onnxblocks import _limits
from onnxblocks.blocks.accessor import check_skeleton
from onnxblocks.errors import GradientError, UnknownNameError, did_you_mean, preview
from onnxblocks.gradient import _graph, accumulation, eval_model, normalize
from onnxblocks.gradient.parameters import FLOAT_TYPES, ParameterPartition, partition_parameters


@dataclass
class TrainingGraphs:
    """The result of :func:`build_training_graphs`.

    Both models may hold stubs for large constants (see
    :mod:`onnxblocks.blocks.weights`); materialize them with the build's
    accessor, or save them with ``onnxblocks.io.save_model(..., weights=store)``.

    Attributes:
        training: The training model (forward, loss, gradient and accumulation).
        eval: The eval model (forward and loss, training-mode ops off).
        partition: Which parameters are trainable or frozen, in input order.
        user_outputs: The outputs of the forward graph (loss first), in order.
        user_inputs: The inputs of the forward graph, in order.
        rewrites: How many nodes each normalisation pass rewrote.
    """

    training: onnx.ModelProto
    eval: onnx.ModelProto
    partition: ParameterPartition
    user_outputs: tuple[str, ...]
    user_inputs: tuple[str, ...]
    rewrites: dict[str, int] = field(default_factory=dict)


def build_training_graphs(
    model: onnx.ModelProto,
    requires_grad: Iterable[str],
    frozen_params: Iterable[str] = (),
    outputs: Sequence[str] | None = None,
    custom_op_libraries: Sequence[str] = (),
) -> TrainingGraphs:
    """Build the training and eval models of a forward model whose first output is the loss.

    Args:
        model: The forward model (not mutated). Its large initializers may be held stubs.
        requires_grad: Parameters to train and graph inputs whose gradient is wanted.
        frozen_params: Parameters fed from the checkpoint without a gradient.
        outputs: The user outputs, loss first; defaults to the model's graph outputs.
        custom_op_libraries: Shared libraries with custom ops, registered with ONNX Runtime.

    Returns:
        The training and eval models and the parameter partition.

    Raises:
        UnknownNameError: for an unknown parameter or output name.
        ValueError: for a parameter both trainable and frozen, or a loss that is not a scalar.
        TypeError: for a non-float trainable parameter or loss.
        GradientError: when ONNX Runtime cannot differentiate the graph.
    """
    forward = _graph.copy_structure(model)
    _limits.check_opset_supported(forward, "the model")
    graph = forward.graph
    user_outputs = _select_outputs(graph, outputs)
    partition = partition_parameters(graph, requires_grad, frozen_params)
    rewrites = normalize.normalize(forward)
    _check_loss(forward, user_outputs[0])

    _keep_only_outputs(graph, user_outputs)
    _check_read(graph, partition)
    _parameters_to_inputs(forward, partition.parameters)
    user_inputs = tuple(i.name for i in graph.input if i.name not in set(partition.parameters))
    _warn_gradient_like_names(user_inputs, user_outputs)

    evaluation = _graph.copy_structure(forward)
    eval_model.disable_training_mode(evaluation)
    _limits.stamp_versions(evaluation)

    signature = {vi.name: vi for vi in forward.graph.input}
    held = _held_constants_to_inputs(forward)
    training = _ort_gradient(forward, partition, user_outputs[0], custom_op_libraries)
    _restore_held_constants(training, held)
    _order_inputs_and_outputs(training, signature, user_inputs, partition, user_outputs)
    dims = {p.name: p for p in model.graph.initializer}
    accumulation.add_gradient_accumulation(
        training, [(p, dims[p].data_type, list(dims[p].dims)) for p in partition.trainable]
    )
    _limits.stamp_versions(training)
    return TrainingGraphs(training, evaluation, partition, user_outputs, user_inputs, rewrites)


# ------------------------------------------------------------------ preparation
def _select_outputs(graph: onnx.GraphProto, outputs: Sequence[str] | None) -> tuple[str, ...]:
    existing = [o.name for o in graph.output]
    if outputs is None:
        if not existing:
            raise ValueError("The model has no graph output to use as the loss. Return the loss from the block.")
        return tuple(existing)
    names = tuple(str(n) for n in outputs)
    if not names:
        raise ValueError("No output given: the first output must be the loss.")
    for name in names:
        if name not in existing:
            raise UnknownNameError(
                f"'{name}' is not a graph output of the model.{did_you_mean(name, existing)} "
                f"Graph outputs: {preview(existing)}."
            )
    return names


#: Name endings by which ONNX Runtime's training API ``Module`` recognises gradients.
_GRADIENT_SUFFIXES = ("_grad", "_grad.accumulation.buffer", "_grad.accumulation.out")


def _warn_gradient_like_names(user_inputs: Sequence[str], user_outputs: Sequence[str]) -> None:
    """Warn about user inputs/outputs that ONNX Runtime's training API would take for gradients."""
    inputs = [n for n in user_inputs if n.endswith(_GRADIENT_SUFFIXES)]
    outputs = [n for n in user_outputs if n.endswith(_GRADIENT_SUFFIXES)]
    if inputs:
        warnings.warn(
            f"Graph inputs {preview(inputs)} end like gradient buffers; ONNX Runtime's training API (Module) will "
            "treat them as gradient buffers and fail to feed them. Rename them in the base model.",
            UserWarning,
            stacklevel=3,
        )
    if outputs:
        warnings.warn(
            f"Outputs {preview(outputs)} end like gradients; ONNX Runtime's training API (Module) will not "
            "return them from train_step. Rename them (an InferenceSession still returns them).",
            UserWarning,
            stacklevel=3,
        )


def _check_loss(model: onnx.ModelProto, loss: str) -> None:
    """Raise when the loss is known not to be a floating-point scalar (shape [] or all-ones dims)."""
    types = _graph.infer_types(model)
    elem = _graph.elem_type(types, loss)
    if elem is not None and elem not in FLOAT_TYPES:
        raise TypeError(
            f"The loss output '{loss}' has element type {onnx.TensorProto.DataType.Name(elem).lower()}; the loss "
            "must be a floating-point scalar. Return a float loss as the first output (Cast it if needed)."
        )
    t = types.get(loss)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return
    dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else (d.dim_param or "?")
            for d in t.tensor_type.shape.dim]
    if any(d != 1 for d in dims):
        raise ValueError(
            f"The loss output '{loss}' has shape {dims}, but the loss must be a scalar (shape [] or [1]): "
            "gradients start from it. Reduce it (e.g. a loss with reduction='mean' or 'sum', or "
            "onnxblocks.blocks.ReduceMean(keepdims=False)), and pass other outputs as additional outputs."
        )


def _check_read(graph: onnx.GraphProto, partition: ParameterPartition) -> None:
    """Raise when a value that requires a gradient is read by no node at all."""
    readers = _graph.consumers(graph)
    unread = [n for n in partition.requires_grad if n not in readers]
    if unread:
        raise GradientError(
            f"{preview(unread)} require a gradient but no node of the model reads them, so the loss cannot "
            "depend on them. Freeze them (frozen_params / requires_grad(name, False)) or leave them out."
        )


def _keep_only_outputs(graph: onnx.GraphProto, names: Sequence[str]) -> None:
    """Make ``names`` the graph outputs, in order."""
    existing = {o.name: o for o in graph.output}
    outputs = [existing[n] for n in names]
    del graph.output[:]
    graph.output.extend(outputs)


def _parameters_to_inputs(model: onnx.ModelProto, parameters: Sequence[str]) -> None:
    """Move the parameter initializers to graph inputs placed after the user inputs, in ``parameters`` order.

    Initializers that are also listed as graph inputs (old exporters' ``keep_initializers_as_inputs``)
    and are not parameters become plain constants: the training API would otherwise ask the user to feed them.
    """
    graph = model.graph
    wanted = set(parameters)
    found = {init.name: init for init in graph.initializer if init.name in wanted}
    kept = [init for init in graph.initializer if init.name not in wanted]
    constants = {init.name for init in kept}
    user_inputs = [vi for vi in graph.input if vi.name not in wanted and vi.name not in constants]
    param_inputs = [helper.make_tensor_value_info(n, found[n].data_type, list(found[n].dims)) for n in parameters]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.input[:]
    graph.input.extend(user_inputs + param_inputs)


def _held_constants_to_inputs(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Turn held stubs (constants, not parameters) into graph inputs; return the stubs to restore later."""
    graph = model.graph
    held = [init for init in graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL]
    if not held:
        return []
    stubs = []
    for init in held:
        stub = onnx.TensorProto()
        stub.CopyFrom(init)
        stubs.append(stub)
    kept = [init for init in graph.initializer if init.data_location != onnx.TensorProto.EXTERNAL]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(helper.make_tensor_value_info(s.name, s.data_type, list(s.dims)) for s in stubs)
    return stubs


def _restore_held_constants(model: onnx.ModelProto, stubs: Sequence[onnx.TensorProto]) -> None:
    """Undo :func:`_held_constants_to_inputs` on ONNX Runtime's output (dropping constants no node reads)."""
    if not stubs:
        return
    graph = model.graph
    names = {s.name for s in stubs}
    inputs = [vi for vi in graph.input if vi.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    read = _graph.consumers(graph)
    graph.initializer.extend(s for s in stubs if s.name in read)


def _order_inputs_and_outputs(
    model: onnx.ModelProto,
    signature: dict[str, onnx.ValueInfoProto],
    user_inputs: Sequence[str],
    partition: ParameterPartition,
    user_outputs: Sequence[str],
) -> None:
    """Inputs: user inputs, then parameters. Outputs: user outputs, parameter gradients, input gradients."""
    graph = model.graph
    inputs = {vi.name: vi for vi in graph.input}
    wanted_inputs = [*user_inputs, *partition.parameters]
    missing = [n for n in wanted_inputs if n not in inputs]
    extra = [n for n in inputs if n not in set(wanted_inputs)]
    for name in missing:  # ONNX Runtime dropped an input nothing reads; keep the documented signature
        inputs[name] = signature[name]
    if extra:
        raise GradientError(
            f"ONNX Runtime's gradient builder added unexpected graph inputs {preview(extra)}. "
            "Please report this with the model."
        )
    ordered_inputs = [inputs[n] for n in wanted_inputs]
    del graph.input[:]
    graph.input.extend(ordered_inputs)

    outputs = {vo.name: vo for vo in graph.output}
    wanted_outputs = [*user_outputs, *(accumulation.gradient_name(n) for n in partition.requires_grad)]
    absent = [n for n in wanted_outputs if n not in outputs]
    if absent:
        raise GradientError(
            f"ONNX Runtime's gradient builder produced no output for {preview(absent)}. "
            "Please report this with the model."
        )
    ordered_outputs = [outputs[n] for n in wanted_outputs]
    del graph.output[:]
    graph.output.extend(ordered_outputs)


# ------------------------------------------------------------------ ONNX Runtime
def _session_options(custom_op_libraries: Sequence[str]):
    from onnxruntime.capi import _pybind_state as C  # noqa: N812 - the binding module's usual name

    options = C.SessionOptions()
    options.log_severity_level = 3
    for library in custom_op_libraries:
        try:
            options.register_custom_ops_library(library)
        except Exception as exc:
            raise OSError(
                f"ONNX Runtime could not load the custom op library '{library}': {_ort_message(exc)}. Pass the "
                "path of a shared library built against onnxruntime 1.19.2 that registers the model's custom ops."
            ) from None
    return options


def _ort_gradient(
    forward: onnx.ModelProto, partition: ParameterPartition, loss: str, custom_op_libraries: Sequence[str]
) -> onnx.ModelProto:
    """Run ONNX Runtime's pre-training optimizer and gradient builder on ``forward`` (no held stubs in it)."""
    from onnxruntime.capi import _pybind_state as C  # noqa: N812 - the binding module's usual name

    options = _session_options(custom_op_libraries)
    requires_grad = set(partition.requires_grad)
    stamped = _graph.copy_structure(forward)
    _limits.stamp_versions(stamped)
    data = stamped.SerializeToString()
    try:
        optimized = C.get_optimized_model(data, requires_grad, options)
    except Exception as exc:
        raise GradientError(
            f"ONNX Runtime could not load or optimize the model before building its gradient: "
            f"{_ort_message(exc)}"
        ) from None
    try:
        builder = C.GradientGraphBuilder(optimized, {loss}, requires_grad, loss, options)
        builder.build()
        result = builder.get_model()
    except Exception as exc:
        raise _explain(exc, forward, onnx.load_from_string(optimized), partition, loss) from None
    return onnx.load_from_string(result)


_ORT_PREFIX = re.compile(r"^.*?(?:\[ONNXRuntimeError\] : \d+ : \w+ : |was false\. )", re.S)


def _ort_message(exc: BaseException) -> str:
    """ONNX Runtime's message without the C++ source location and function signature."""
    text = str(exc).strip()
    return _ORT_PREFIX.sub("", text, count=1).strip() or text


_NOT_REGISTERED = re.compile(r"has not been registered: (\S+) for node (\S*)")
_UNREACHABLE = re.compile(r"Cannot compute the partial derivative for '([^']+)'")


def _explain(
    exc: BaseException,
    forward: onnx.ModelProto,
    optimized: onnx.ModelProto,
    partition: ParameterPartition,
    loss: str,
) -> GradientError:
    """A GradientError naming the node, op and parameters behind ONNX Runtime's failure."""
    message = _ort_message(exc)
    match = _NOT_REGISTERED.search(message)
    if match:
        op_type, node_name = match.groups()
        node = _find_node(forward, node_name) or _find_node(optimized, node_name)
        domain = (node.domain or "ai.onnx") if node is not None else "unknown"
        origin = "" if _find_node(forward, node_name) else " (created by ONNX Runtime's optimizer)"
        params = _upstream(optimized, node, partition.requires_grad) if node is not None else []
        hint = (
            f" Freeze the parameters behind it ({preview(params)}: pass them in frozen_params or call "
            "requires_grad(name, False)) so no gradient has to flow through it, or rewrite it with ops "
            "ONNX Runtime can differentiate."
            if params
            else " Freeze the parameters behind it, or rewrite it with ops ONNX Runtime can differentiate."
        )
        return GradientError(
            f"ONNX Runtime cannot differentiate node '{node_name}'{origin}: op {op_type} "
            f"(domain '{domain}') has no gradient builder.{hint}"
        )
    match = _UNREACHABLE.search(message)
    if match:
        name = match.group(1)
        return GradientError(
            f"The loss '{loss}' does not depend differentiably on '{name}': no path of differentiable ops "
            f"leads from it to the loss (ONNX Runtime: {message}). Freeze '{name}' (frozen_params or "
            "requires_grad(name, False)) or remove it from requires_grad; if it should reach the loss, check "
            "the ops between them (integer casts, ArgMax, Shape... stop gradients)."
        )
    return GradientError(f"ONNX Runtime could not build the gradient graph: {message}")


def _find_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    if not name:
        return None
    return next((n for n in model.graph.node if n.name == name), None)


def _upstream(model: onnx.ModelProto, node: onnx.NodeProto, candidates: Sequence[str]) -> list[str]:
    """The ``candidates`` the inputs of ``node`` depend on."""
    producers = {out: n for n in model.graph.node for out in n.output if out}
    wanted = set(candidates)
    found: set[str] = set()
    seen: set[str] = set()
    stack = list(node.input)
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in wanted:
            found.add(name)
        producer = producers.get(name)
        if producer is not None:
            stack.extend(producer.input)
    return [c for c in candidates if c in found]



def check_training_model(model: onnx.ModelProto) -> None:
    """Run onnx's checker once on a training or eval model's skeleton (no weight bytes read).

    ONNX Runtime's gradient ops that live in the default domain (``MaxPoolGrad``
    ...) are unknown to onnx; they are checked as contrib ops, i.e. structurally.

    Raises:
        onnx.checker.ValidationError: if the model is invalid.
    """
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)  # callers pass models whose large weights are stubs
    opset = _limits.onnx_opset(skeleton) or _limits.DEFAULT_ONNX_OPSET
    relabelled = False
    for node in skeleton.graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            node.domain = _limits.MS_DOMAIN
            relabelled = True
        elif node.domain in ("", "ai.onnx"):
            try:
                onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                node.domain = _limits.MS_DOMAIN
                relabelled = True
    if relabelled:
        _limits.ensure_opset(skeleton, _limits.MS_DOMAIN, _limits.MS_OPSET)
    check_skeleton(skeleton)

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

from onnxblocks._core import limits as _limits
from onnxblocks._core.validation import check_skeleton
from onnxblocks._core.errors import GradientError, UnknownNameError, did_you_mean, preview
from onnxblocks.gradient import _graph, accumulation, eval_model, normalize, pooling
from onnxblocks.gradient.parameters import FLOAT_TYPES, ParameterPartition, partition_parameters


@dataclass
class TrainingGraphs:
    """The result of :func:`build_training_graphs`.

    Both models may hold stubs for large constants (see
    :mod:`onnxblocks._core.weights`); materialize them with the build's
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
    forward = _upgrade_old_opset(forward)
    graph = forward.graph
    user_outputs = _select_outputs(graph, outputs)
    partition = partition_parameters(graph, requires_grad, frozen_params)
    elem_types = {init.name: init.data_type for init in graph.initializer}
    accumulation.check_accumulable([(p, elem_types[p]) for p in partition.trainable])
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
    held = _held_constants_to_inputs(forward, also=_prepare_norms(forward, partition.requires_grad))
    training = _ort_gradient(forward, partition, user_outputs[0], custom_op_libraries)
    pooling.check_pool_shapes(forward, training)
    _restore_held_constants(training, held)
    _order_inputs_and_outputs(training, signature, user_inputs, partition, user_outputs)
    dims = {p.name: p for p in model.graph.initializer}
    accumulation.add_gradient_accumulation(
        training, [(p, dims[p].data_type, list(dims[p].dims)) for p in partition.trainable]
    )
    _limits.stamp_versions(training)
    _check_kernels(training, forward, custom_op_libraries)
    return TrainingGraphs(training, evaluation, partition, user_outputs, user_inputs, rewrites)


# ------------------------------------------------------------------ preparation
#: Models below this ai.onnx opset are converted to :data:`UPGRADE_OPSET` first: ONNX Runtime's gradient
#: builders emit ops in forms that need it (a Gemm without C, opset 11).
MIN_GRADIENT_OPSET = 11
UPGRADE_OPSET = 13


def _upgrade_old_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert a model below opset 11 to opset 13 with onnx's version converter (the eval model is converted too)."""
    opset = _limits.onnx_opset(model)
    if opset is None or opset >= MIN_GRADIENT_OPSET:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, UPGRADE_OPSET)
    except Exception as exc:
        raise ValueError(
            f"The model imports ai.onnx opset {opset}; ONNX Runtime's gradient builders need opset "
            f"{MIN_GRADIENT_OPSET} or newer, and onnx's version converter could not convert it "
            f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}). Re-export the "
            f"model with opset_version={UPGRADE_OPSET} or newer."
        ) from None
    return converted
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


def _held_constants_to_inputs(model: onnx.ModelProto, also: Iterable[str] = ()) -> list[onnx.TensorProto]:
    """Turn held stubs and the initializers named in ``also`` into graph inputs; return them to restore later."""
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
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(helper.make_tensor_value_info(s.name, s.data_type, list(s.dims)) for s in stubs)
    return stubs


#: Normalisation ops whose gradient always writes the gradients of its scale and bias.
_NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")


def _prepare_norms(model: onnx.ModelProto, trainable: Iterable[str]) -> set[str]:
    """Work around ONNX Runtime defining a LayerNormalization's scale/bias gradient twice; return constants to lift.

    ONNX Runtime's LayerNormalization gradient always writes ``<scale>_grad`` and
    ``<bias>_grad``. Two such nodes whose scale or bias is the same value (a shared
    constant or frozen parameter), or whose constant scale and bias are fed by
    another LayerNormalization, fail with "Duplicate definition of name
    (<bias>_grad)". Here (in place):

    * Constant nodes feeding a scale or bias become initializers;
    * a scale or bias (not trainable) that an earlier normalisation node already reads
      is read through an ``Identity`` of its own;

    and the constant scales and biases are returned: they are graph inputs while
    ONNX Runtime builds the gradient (as frozen parameters are, which works).
    """
    graph = model.graph

    def is_norm(node: onnx.NodeProto) -> bool:
        return node.op_type in _NORM_OPS and node.domain in ("", "ai.onnx", _limits.MS_DOMAIN)

    wanted = {name for node in graph.node if is_norm(node) for name in node.input[1:3] if name}
    if not wanted:
        return set()
    trained = set(trainable)
    initializers = {init.name for init in graph.initializer}
    constants = _graph.ConstantTable(graph)
    names = _graph.name_authority(graph)
    seen: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted - initializers:
            value = constants.value(node.output[0])
            if value is not None:
                graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                initializers.add(node.output[0])
                continue
        if is_norm(node):
            for i in (1, 2):
                name = node.input[i] if len(node.input) > i else ""
                if not name or name in trained:
                    continue
                if name in seen:
                    alias = names.fresh(f"{name}.alias")
                    nodes.append(helper.make_node("Identity", [name], [alias], name=names.fresh("Identity")))
                    node.input[i] = alias
                seen.add(name)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return wanted & initializers


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
    from onnxblocks._core.ort import capi

    C = capi()

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
    from onnxblocks._core.ort import capi

    C = capi()

    options = _session_options(custom_op_libraries)
    requires_grad = set(partition.requires_grad)
    stamped = _graph.copy_structure(forward)
    _limits.stamp_versions(stamped)
    seed = _float_seed(stamped, loss)
    data = stamped.SerializeToString()
    try:
        optimized = C.get_optimized_model(data, requires_grad, options)
    except Exception as exc:
        raise GradientError(
            f"ONNX Runtime could not load or optimize the model before building its gradient: "
            f"{_ort_message(exc)}"
        ) from None
    try:
        builder = C.GradientGraphBuilder(optimized, {seed}, requires_grad, seed, options)
        builder.build()
        result = builder.get_model()
    except Exception as exc:
        raise _explain(exc, forward, onnx.load_from_string(optimized), partition, loss) from None
    training = onnx.load_from_string(result)
    if seed != loss:
        _drop_float_seed(training, seed)
    return training


def _float_seed(model: onnx.ModelProto, loss: str) -> str:
    """The value ONNX Runtime differentiates: the loss, or a float32 ``Cast`` of a non-float32 loss.

    ONNX Runtime seeds the backward pass with a float32 ``1`` for the loss's gradient,
    so a double (or float16) loss fails with "bound to different types". Its float32
    cast gets the seed instead and the ``Cast``'s gradient brings it back to the
    loss's type (exactly: the seed is 1). The cast is a temporary graph output.
    """
    types = _graph.infer_types(model)
    elem = _graph.elem_type(types, loss)
    if elem is None or elem == onnx.TensorProto.FLOAT:
        return loss
    names = _graph.name_authority(model.graph)
    seed = names.fresh(f"{loss}.float32")
    model.graph.node.append(
        helper.make_node("Cast", [loss], [seed], name=names.fresh("Cast"), to=onnx.TensorProto.FLOAT)
    )
    model.graph.output.append(helper.make_tensor_value_info(seed, onnx.TensorProto.FLOAT, _graph.shape_of(types, loss)))
    return seed


def _drop_float_seed(model: onnx.ModelProto, seed: str) -> None:
    """Remove the temporary float32 loss output (and its Cast when nothing else reads it)."""
    graph = model.graph
    outputs = [o for o in graph.output if o.name != seed]
    del graph.output[:]
    graph.output.extend(outputs)
    if seed not in _graph.consumers(graph):
        nodes = [n for n in graph.node if seed not in n.output]
        del graph.node[:]
        graph.node.extend(nodes)


_ORT_PREFIX = re.compile(r"^.*?(?:\[ONNXRuntimeError\] : \d+ : \w+ : |was false\. )", re.S)


def _ort_message(exc: BaseException) -> str:
    """ONNX Runtime's message without the C++ source location and function signature."""
    text = str(exc).strip()
    return _ORT_PREFIX.sub("", text, count=1).strip() or text


_NOT_REGISTERED = re.compile(r"has not been registered: (\S+) for node ?(\S*)")

#: What onnxblocks does about some ops without a gradient builder, and what is left to the user.
_OP_HINTS = {
    "RNN": " onnxblocks unrolls RNN nodes whose sequence length is static (and activations Tanh, Relu or "
    "Sigmoid, no clip, no sequence_lens): export with a static sequence length, or with dynamo=True, which "
    "unrolls it.",
    "Loop": " Control flow has no gradient in ONNX Runtime: export with the loop unrolled (a fixed trip count).",
    "Scan": " Control flow has no gradient in ONNX Runtime: export with the loop unrolled (a fixed trip count).",
    "If": " Control flow has no gradient in ONNX Runtime: export with the branch taken at export time.",
}
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
        origin = "" if node is None or _find_node(forward, node_name) else " (created by ONNX Runtime's optimizer)"
        if node is None:  # an unnamed node: the first of that op type that a trainable value reaches
            same_op = [n for n in forward.graph.node if n.op_type == op_type]
            node = next((n for n in same_op if _upstream(forward, n, partition.requires_grad)),
                        same_op[0] if same_op else None)
        domain = (node.domain or "ai.onnx") if node is not None else "unknown"
        label = f"'{node_name}'" if node_name else (
            f"(unnamed, writing '{node.output[0]}')" if node is not None and node.output else "(unnamed)")
        params = _upstream(optimized, node, partition.requires_grad) if node is not None else []
        hint = (
            f" Freeze the parameters behind it ({preview(params)}: pass them in frozen_params or call "
            "requires_grad(name, False)) so no gradient has to flow through it, or rewrite it with ops "
            "ONNX Runtime can differentiate."
            if params
            else " Freeze the parameters behind it, or rewrite it with ops ONNX Runtime can differentiate."
        )
        return GradientError(
            f"ONNX Runtime cannot differentiate node {label}{origin}: op {op_type} "
            f"(domain '{domain}') has no gradient builder.{_OP_HINTS.get(op_type, '')}{hint}"
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


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")

#: Why ONNX Runtime's CPU build may lack a training kernel, by op type, and what to do.
_KERNEL_HINTS = {
    "ConvTransposeGrad": "onnxblocks rewrites ConvTranspose into Conv when its padding is explicit (auto_pad NOTSET "
    "or VALID, no output_shape) and its weight shape static; re-export the model that way.",
}


def _check_kernels(training: onnx.ModelProto, forward: onnx.ModelProto, custom_op_libraries: Sequence[str]) -> None:
    """Load the training model in an (unoptimised) CPU session so a missing kernel is reported now, not at training.

    ONNX Runtime builds gradient nodes for which its CPU build has no kernel (for
    some ops or element types) and kernels that refuse some attributes; the
    training API would fail later with a message about a node the user never
    wrote. Held constants are graph inputs here: no weight bytes are read.

    Raises:
        GradientError: naming the node, its op, the forward node it comes from and what to do.
    """
    from onnxblocks._core.ort import onnxruntime

    ort = onnxruntime()

    probe = _graph.copy_structure(training)
    _held_constants_to_inputs(probe)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for library in custom_op_libraries:
        options.register_custom_ops_library(library)
    try:
        ort.InferenceSession(probe.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        message = _ort_message(exc)
        match = _NO_KERNEL.search(message)
        if not match:
            raise GradientError(
                f"The training model does not load in ONNX Runtime's CPU session: {message}"
            ) from None
        op_type, name = match.groups()
        origin = name.split("_Grad/")[0] if "_Grad/" in name else name
        source = _find_node(forward, origin)
        where = f" (from node '{origin}', {source.op_type})" if source is not None and origin != name else ""
        types = _graph.infer_types(probe)
        node = _find_node(probe, name)
        elem = _graph.elem_type(types, node.input[0]) if node is not None and node.input else None
        typed = f" for {onnx.TensorProto.DataType.Name(elem).lower()}" if elem else ""
        hint = _KERNEL_HINTS.get(op_type, "Its CPU kernels are mostly float32: convert the model to float32, or "
                                 "freeze the parameters before this node so no gradient flows through it.")
        raise GradientError(
            f"ONNX Runtime 1.19.2 has no CPU kernel{typed} for {op_type}, which node '{name}'{where} of the "
            f"training model needs, so the training API could not load it. {hint}"
        ) from None


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

"""The calls into ONNX Runtime: its gradient builder, and a CPU session that checks the result's
kernels.

* :func:`differentiate` runs ``get_optimized_model`` (ONNX Runtime's pre-training
  transformers) and ``GradientGraphBuilder`` on the forward model, and turns a
  failure into a :class:`~onnxblocks.errors.GradientError` that names the node, the
  op and the parameters behind it.
* :func:`check_kernels` loads the training model in an unoptimised CPU
  ``InferenceSession`` so a gradient node without a kernel is reported when the
  artifacts are built, not when training starts.

ONNX Runtime is imported (through :mod:`onnxblocks._core.ort`) only when these
run; its messages are read by :mod:`onnxblocks._core.ort_errors`. On a Python
whose onnxruntime is the stock build (3.13+), :func:`run_gradient_builder`,
:func:`check_kernels` and :func:`to_ort_format_in_worker` send the serialised
skeleton (no weight bytes) to a worker Python with onnxruntime-training
(:mod:`onnxblocks.gradient.worker`); its failures are explained exactly as
in-process ones.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core import ort_errors
from onnxblocks._core.errors import DataFileError, GradientError, preview
from onnxblocks.gradient import worker
from onnxblocks.gradient.parameters import ParameterPartition
from onnxblocks.gradient.signature import drop_float_seed, float_seed, held_constants_to_inputs
from onnxblocks.ir.proto import copy_model
from onnxblocks.ir.types import infer_proto_types, proto_elem_type

#: What onnxblocks does about some ops without a gradient builder, and what is left to the user.
_OP_HINTS = {
    "RNN": " onnxblocks unrolls RNN nodes whose sequence length is static (and activations Tanh, "
    "Relu or "
    "Sigmoid, no clip, no sequence_lens): export with a static sequence length, or with "
    "dynamo=True, which "
    "unrolls it.",
    "Loop": " Control flow has no gradient in ONNX Runtime: export with the loop unrolled (a "
    "fixed trip count).",
    "Scan": " Control flow has no gradient in ONNX Runtime: export with the loop unrolled (a "
    "fixed trip count).",
    "If": " Control flow has no gradient in ONNX Runtime: export with the branch taken at export "
    "time.",
}

#: Why ONNX Runtime's CPU build may lack a training kernel, by op type, and what to do.
_KERNEL_HINTS = {
    "ConvTransposeGrad": "onnxblocks rewrites ConvTranspose into Conv when its padding is "
    "explicit (auto_pad NOTSET "
    "or VALID, no output_shape) and its weight shape static; re-export the model that way.",
    "SplitTraining": "It is the gradient of Concat (its double kernel is registered but refuses "
    "double tensors "
    "when it runs): convert the model to float32, or freeze the parameters before this node.",
}

#: Training ops whose CPU kernel loads for these element types but fails when it runs.
_FAILS_AT_RUN_TIME = {"SplitTraining": frozenset({onnx.TensorProto.DOUBLE})}


def session_options(custom_op_libraries: Sequence[str]) -> Any:
    """ONNX Runtime ``SessionOptions`` (C bindings) that log errors only and know the custom op
    libraries.

    Raises:
        OSError: when ONNX Runtime cannot load a library.
    """
    from onnxblocks._core.ort import capi

    options = capi().SessionOptions()
    options.log_severity_level = 3
    for library in custom_op_libraries:
        try:
            options.register_custom_ops_library(library)
        except Exception as exc:
            raise _library_error(library, exc) from None
    return options


def _library_error(library: str, error: BaseException | str) -> DataFileError:
    return DataFileError(
        f"ONNX Runtime could not load the custom op library '{library}': "
        f"{ort_errors.clean_message(error)}. Pass the path of a shared library built against "
        "onnxruntime "
        "1.19.2 that registers the model's custom ops."
    )


class GradientBuilderError(GradientError):
    """ONNX Runtime's gradient builder refused the (optimized) model; callers turn it into a
    GradientError.
    """

    def __init__(self, message: str, optimized: onnx.ModelProto) -> None:
        super().__init__(message)
        self.message = message
        self.optimized = optimized


def run_gradient_builder(
    model: onnx.ModelProto,
    requires_grad: set[str],
    ys: set[str],
    seed: str,
    custom_op_libraries: Sequence[str],
) -> onnx.ModelProto:
    """ONNX Runtime's pre-training optimizer and gradient builder on ``model`` (already stamped),
    bytes in, bytes out.

    In this process when its onnxruntime is the training build, else in the worker
    Python (:mod:`onnxblocks.gradient.worker`), which gets the serialised skeleton
    graph and the names only.

    Args:
        model: The model, parameters as graph inputs, large weights held (no weight bytes).
        requires_grad: The values gradients are wanted for.
        ys: The y nodes (the loss, or the outputs a VJP starts from).
        seed: The loss whose gradient is seeded with 1, or ``""`` (the ys' gradients are inputs).
        custom_op_libraries: Shared libraries with custom ops.

    Raises:
        GradientError: when ONNX Runtime cannot load or optimize the model.
        GradientBuilderError: when its gradient builder fails (the message and the optimized model).
        DataFileError: when a custom op library does not load.
        TrainingBuildRequiredError: on stock onnxruntime without a Python 3.10-3.12 for the worker.
    """
    serialized = model.SerializeToString()
    if worker.uses_worker():
        fields = {"requires_grad": sorted(requires_grad), "ys": sorted(ys), "seed": seed}
        fields["custom_op_libraries"] = list(custom_op_libraries)
        answer, blobs = worker.call("gradient", fields, [serialized])
        if "error" not in answer:
            return onnx.load_from_string(blobs[0])
        _raise_failure(answer["stage"], answer["error"], blobs[0] if blobs else b"")
    from onnxblocks._core.ort import require_training_build

    C = require_training_build("Generating training artifacts (ONNX Runtime's gradient builder)")
    options = session_options(custom_op_libraries)
    optimized = optimize_for_gradient(C, serialized, requires_grad, options)
    try:
        builder = C.GradientGraphBuilder(optimized, ys, requires_grad, seed, options)
        builder.build()
        result: bytes = builder.get_model()
    except Exception as exc:
        raise GradientBuilderError(
            ort_errors.clean_message(exc), onnx.load_from_string(optimized)
        ) from None
    return onnx.load_from_string(result)


def _raise_failure(stage: str, message: str, optimized: bytes) -> NoReturn:
    """Raise what the in-process call raises for the worker's failure at ``stage``."""
    if stage == "library":
        library, _, detail = message.partition("\n")
        raise _library_error(library, detail)
    if stage == "optimize":
        raise _optimize_error(message)
    if stage == "build":
        raise GradientBuilderError(
            ort_errors.clean_message(message), onnx.load_from_string(optimized)
        )
    raise GradientError(
        f"The gradient-builder worker failed ({stage}): {ort_errors.clean_message(message)}"
    )


def differentiate(
    forward: onnx.ModelProto,
    partition: ParameterPartition,
    loss: str,
    custom_op_libraries: Sequence[str],
) -> onnx.ModelProto:
    """Run ONNX Runtime's pre-training optimizer and gradient builder on ``forward`` (no held stubs
    in it).

    Args:
        forward: The forward model, parameters and lifted constants as graph inputs (not mutated).
        partition: The values whose gradient is built.
        loss: The loss output (a non-float32 loss is seeded through a float32 Cast).
        custom_op_libraries: Shared libraries with custom ops.

    Returns:
        The model ONNX Runtime built: forward and gradient graph, in ONNX Runtime's order.

    Raises:
        GradientError: when ONNX Runtime cannot optimize or differentiate the model.
        TrainingBuildRequiredError: on stock onnxruntime without a Python 3.10-3.12 for the worker.
    """
    requires_grad = set(partition.requires_grad)
    stamped = copy_model(forward)
    _limits.stamp_versions(stamped)
    seed = float_seed(stamped, loss)
    try:
        training = run_gradient_builder(stamped, requires_grad, {seed}, seed, custom_op_libraries)
    except GradientBuilderError as failure:
        raise explain_gradient_failure(
            failure.message, forward, failure.optimized, partition, loss
        ) from None
    if seed != loss:
        drop_float_seed(training, seed)
    return training


def optimize_for_gradient(C: Any, model: bytes, requires_grad: set[str], options: Any) -> bytes:
    """ONNX Runtime's pre-training graph optimizations of ``model`` (serialized), run before its
    gradient builder.

    Args:
        C: ONNX Runtime's C bindings (the training build).
        model: The serialized model, already stamped with versions the runtime loads.
        requires_grad: The values gradients are wanted for.
        options: Session options (custom op libraries registered).

    Raises:
        GradientError: when ONNX Runtime cannot load or optimize the model.
    """
    try:
        optimized: bytes = C.get_optimized_model(model, requires_grad, options)
    except Exception as exc:
        raise _optimize_error(exc) from None
    return optimized


def _optimize_error(error: BaseException | str) -> GradientError:
    return GradientError(
        "ONNX Runtime could not load or optimize the model before building its gradient: "
        f"{ort_errors.clean_message(error)}"
    )


def explain_gradient_failure(
    exc: BaseException | str,
    forward: onnx.ModelProto,
    optimized: onnx.ModelProto,
    partition: ParameterPartition,
    loss: str,
) -> GradientError:
    """A GradientError naming the node, op and parameters behind the gradient builder's failure
    ``exc``.
    """
    message = ort_errors.clean_message(exc)
    missing = ort_errors.missing_gradient(message)
    if missing is not None:
        return _no_gradient_builder(missing, forward, optimized, partition)
    name = ort_errors.unreachable_value(message)
    if name is not None:
        return GradientError(
            f"The loss '{loss}' does not depend differentiably on '{name}': no path of "
            "differentiable ops "
            f"leads from it to the loss (ONNX Runtime: {message}). Freeze '{name}' "
            "(frozen_params or "
            "requires_grad(name, False)) or remove it from requires_grad; if it should reach the "
            "loss, check "
            "the ops between them (integer casts, ArgMax, Shape... stop gradients)."
        )
    return GradientError(f"ONNX Runtime could not build the gradient graph: {message}")


def _no_gradient_builder(
    missing: ort_errors.MissingGradient,
    forward: onnx.ModelProto,
    optimized: onnx.ModelProto,
    partition: ParameterPartition,
) -> GradientError:
    op_type, node_name = missing
    node = _find_node(forward, node_name) or _find_node(optimized, node_name)
    origin = (
        ""
        if node is None or _find_node(forward, node_name)
        else " (created by ONNX Runtime's optimizer)"
    )
    if node is None:  # an unnamed node: the first of that op type that a trainable value reaches
        same_op = [n for n in forward.graph.node if n.op_type == op_type]
        node = next(
            (n for n in same_op if _upstream(forward, n, partition.requires_grad)),
            same_op[0] if same_op else None,
        )
    domain = (node.domain or "ai.onnx") if node is not None else "unknown"
    if node_name:
        label = f"'{node_name}'"
    else:
        label = (
            f"(unnamed, writing '{node.output[0]}')"
            if node is not None and node.output
            else "(unnamed)"
        )
    params = _upstream(optimized, node, partition.requires_grad) if node is not None else []
    hint = (
        f" Freeze the parameters behind it ({preview(params)}: pass them in frozen_params or call "
        "requires_grad(name, False)) so no gradient has to flow through it, or rewrite it with ops "
        "ONNX Runtime can differentiate."
        if params
        else " Freeze the parameters behind it, or rewrite it with ops ONNX Runtime can "
        "differentiate."
    )
    return GradientError(
        f"ONNX Runtime cannot differentiate node {label}{origin}: op {op_type} "
        f"(domain '{domain}') has no gradient builder.{_OP_HINTS.get(op_type, '')}{hint}"
    )


def check_kernels(
    training: onnx.ModelProto, forward: onnx.ModelProto, custom_op_libraries: Sequence[str]
) -> None:
    """Load the training model in an (unoptimised) CPU session so a missing kernel is reported now,
    not at training.

    ONNX Runtime builds gradient nodes for which its CPU build has no kernel (for
    some ops or element types) and kernels that refuse some attributes; the
    training API would fail later with a message about a node the user never
    wrote. Held constants are graph inputs here: no weight bytes are read.

    Raises:
        GradientError: naming the node, its op, the forward node it comes from and what to do.
    """
    probe = copy_model(training)
    held_constants_to_inputs(probe)
    _check_run_time_kernels(probe, forward)
    if worker.uses_worker():
        answer, _ = worker.call(
            "load", {"custom_op_libraries": list(custom_op_libraries)}, [probe.SerializeToString()]
        )
        if "error" in answer:
            if answer["stage"] == "library":
                library, _, detail = answer["error"].partition("\n")
                raise _library_error(library, detail)
            raise _load_error(answer["error"], probe, forward)
        return
    from onnxblocks._core.ort import onnxruntime

    ort = onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for library in custom_op_libraries:
        options.register_custom_ops_library(library)
    try:
        ort.InferenceSession(
            probe.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:
        raise _load_error(exc, probe, forward) from None


def _check_run_time_kernels(probe: onnx.ModelProto, forward: onnx.ModelProto) -> None:
    """Refuse a node whose kernel would load but fail at run time for its element type."""
    suspects = [n for n in probe.graph.node if n.op_type in _FAILS_AT_RUN_TIME and n.input]
    if not suspects:
        return
    types = infer_proto_types(probe)
    for node in suspects:
        if proto_elem_type(types, node.input[0]) in _FAILS_AT_RUN_TIME[node.op_type]:
            raise _no_kernel(ort_errors.MissingKernel(node.op_type, node.name), probe, forward)


def _load_error(
    error: BaseException | str, probe: onnx.ModelProto, forward: onnx.ModelProto
) -> GradientError:
    message = ort_errors.clean_message(error)
    missing = ort_errors.missing_kernel(message)
    if missing is None:
        return GradientError(
            f"The training model does not load in ONNX Runtime's CPU session: {message}"
        )
    return _no_kernel(missing, probe, forward)


def to_ort_format_in_worker(
    model_path: Path, target: Path, custom_op_libraries: Sequence[str]
) -> Path:
    """Write the ORT-format copy of ``model_path`` to ``target`` with the worker's
    onnxruntime-training.

    The stock onnxruntime of a Python 3.13+ has no training kernels (and writes
    another ORT format version); the worker reads the model file and writes the
    copy itself, so no weights go through the pipe.

    Raises:
        GradientError: when ONNX Runtime cannot convert the model.
    """
    fields = {"model_path": os.fspath(model_path), "target": os.fspath(target)}
    answer, _ = worker.call(
        "ort_format", {**fields, "custom_op_libraries": list(custom_op_libraries)}
    )
    if "error" in answer:
        message = ort_errors.clean_message(answer["error"])
        raise GradientError(
            f"ONNX Runtime could not write the ORT format of {model_path.name}: {message}"
        )
    return target


def _no_kernel(
    missing: ort_errors.MissingKernel, probe: onnx.ModelProto, forward: onnx.ModelProto
) -> GradientError:
    op_type, name = missing
    origin = name.split("_Grad/")[0] if "_Grad/" in name else name
    source = _find_node(forward, origin)
    where = (
        f" (from node '{origin}', {source.op_type})"
        if source is not None and origin != name
        else ""
    )
    types = infer_proto_types(probe)
    node = _find_node(probe, name)
    elem = proto_elem_type(types, node.input[0]) if node is not None and node.input else None
    typed = f" for {onnx.TensorProto.DataType.Name(elem).lower()}" if elem else ""
    hint = _KERNEL_HINTS.get(
        op_type,
        "Its CPU kernels are mostly float32: convert the model to float32, or "
        "freeze the parameters before this node so no gradient flows through it.",
    )
    return GradientError(
        f"ONNX Runtime 1.19.2 has no CPU kernel{typed} for {op_type}, which node '{name}'{where} "
        "of the "
        f"training model needs, so the training API could not load it. {hint}"
    )


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

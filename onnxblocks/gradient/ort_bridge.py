"""The calls into ONNX Runtime: its gradient builder, and a CPU session that checks the result's
kernels.

* :func:`differentiate` runs ``get_optimized_model`` (ONNX Runtime's pre-training
  transformers) and ``GradientGraphBuilder`` on the forward model, and turns a
  failure into a :class:`~onnxblocks.errors.GradientError` that names the node, the
  op and the parameters behind it.
* :mod:`onnxblocks.gradient.kernels` loads the result in a CPU session, so a gradient
  node without a kernel is reported when the artifacts are built.

ONNX Runtime is imported (through :mod:`onnxblocks._core.ort`) only when these
run; its messages are read by :mod:`onnxblocks._core.ort_errors`. On a Python
whose onnxruntime is the stock build (3.13+), :func:`run_gradient_builder`,
:func:`~onnxblocks.gradient.kernels.check_kernels` and :func:`to_ort_format_in_worker`
send the serialised skeleton (no weight bytes) to a worker Python with onnxruntime-training
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
from onnxblocks.gradient.signature import float_seed
from onnxblocks.ir.proto import copy_model

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
            raise library_error(library, exc) from None
    return options


def library_error(library: str, error: BaseException | str) -> DataFileError:
    """The error for a custom op library ONNX Runtime could not load."""
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
        raise library_error(library, detail)
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
) -> tuple[onnx.ModelProto, str]:
    """Run ONNX Runtime's pre-training optimizer and gradient builder on ``forward`` (no held stubs
    in it).

    Args:
        forward: The forward model, parameters and lifted constants as graph inputs (not mutated).
        partition: The values whose gradient is built.
        loss: The loss output (a non-float32 loss is seeded through a float32 Cast).
        custom_op_libraries: Shared libraries with custom ops.

    Returns:
        The model ONNX Runtime built (forward and gradient graph, in ONNX Runtime's order), and
        the value it seeded: ``loss``, or the temporary float32 output the caller removes with
        :func:`~onnxblocks.gradient.signature.drop_float_seed`.

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
    return training, seed


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
    node = find_node(forward, node_name) or find_node(optimized, node_name)
    origin = (
        ""
        if node is None or find_node(forward, node_name)
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


def find_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    """The top-level node named ``name``, or None."""
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

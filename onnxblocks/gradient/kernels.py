"""Whether ONNX Runtime's CPU build runs a training model: a missing kernel reported when the
artifacts are built, not when training starts.

:func:`check_kernels` loads the training model in an unoptimised CPU ``InferenceSession``
(in the worker Python on a stock onnxruntime) and names the gradient node without a
kernel, the forward node it comes from, its element type and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from onnxblocks._core import ort_errors
from onnxblocks._core.errors import GradientError
from onnxblocks.gradient import worker
from onnxblocks.gradient.ort_bridge import find_node, library_error
from onnxblocks.gradient.signature import held_constants_to_inputs
from onnxblocks.ir.proto import copy_model
from onnxblocks.ir.types import infer_proto_types, proto_elem_type

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
                raise library_error(library, detail)
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


def _no_kernel(
    missing: ort_errors.MissingKernel, probe: onnx.ModelProto, forward: onnx.ModelProto
) -> GradientError:
    op_type, name = missing
    origin = name.split("_Grad/")[0] if "_Grad/" in name else name
    source = find_node(forward, origin)
    where = (
        f" (from node '{origin}', {source.op_type})"
        if source is not None and origin != name
        else ""
    )
    types = infer_proto_types(probe)
    node = find_node(probe, name)
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

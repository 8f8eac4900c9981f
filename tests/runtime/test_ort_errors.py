"""The one reader of ONNX Runtime's error messages, on errors ONNX Runtime really raises.

Each live test makes ONNX Runtime fail (an unknown op, a wrong input type, a
node without a kernel, an op without a gradient builder...) and checks what
:mod:`onnxblocks._core.ort_errors` makes of the message, then what the gradient
builder and the runtime, which both use it, tell the user.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_equal
from support.runtime_support import generate

from onnxblocks._core import ort_errors
from onnxblocks._core.ort import capi, onnxruntime
from onnxblocks.errors import GradientError
from onnxblocks.gradient import build_training_graphs
from onnxblocks.runtime import TrainingSession
from onnxblocks.runtime import _ort as runtime_ort

PLUMBING = (
    "[ONNXRuntimeError]",
    "onnxruntime::",
    "onnxruntime_src",
    ".cc:",
    ".h:",
    "was false",
    "\n",
)


def _model(nodes, inputs, outputs, inits=(), ir_version=8):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(
        graph, ir_version=ir_version, opset_imports=[helper.make_opsetid("", 17)]
    )


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _session(model):
    ort = onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _raised(call) -> BaseException:
    with pytest.raises(Exception) as info:  # whatever ONNX Runtime raises is the subject
        call()
    return info.value


def _clean(exc: BaseException) -> str:
    cleaned = ort_errors.clean_message(exc)
    assert not any(p in cleaned for p in PLUMBING), cleaned
    return cleaned


# ------------------------------------------------------------------ InferenceSession
def test_unknown_op():
    model = _model(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob")],
        [_vi("x", [2])],
        [_vi("y", [2])],
    )
    exc = _raised(lambda: _session(model))
    assert str(exc).startswith("[ONNXRuntimeError] : 10 : INVALID_GRAPH : ")
    assert _clean(exc).startswith('This is an invalid model. In Node, ("frob", Frobnicate, "", -1)')
    assert "No Op registered for Frobnicate" in _clean(exc)
    assert ort_errors.is_ort_error(exc) and ort_errors.is_input_error(exc)
    assert (
        ort_errors.missing_gradient(exc)
        is ort_errors.missing_kernel(exc)
        is ort_errors.unreachable_value(exc)
    )


def test_wrong_input_dtype_and_shape():
    session = _session(
        _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    )
    exc = _raised(lambda: session.run(None, {"x": np.zeros((2, 3), np.float64)}))
    assert (
        _clean(exc)
        == "Unexpected input data type. Actual: (tensor(double)) , expected: (tensor(float))"
    )
    assert ort_errors.is_input_error(exc)
    exc = _raised(lambda: session.run(None, {"x": np.zeros((2, 4), np.float32)}))
    assert _clean(exc) == (
        "Got invalid dimensions for input: x for the following indices index: 1 Got: 4 Expected: 3 "
        "Please fix either the inputs/outputs or the model."
    )


def test_nested_source_location_and_enforce_condition():
    """A failed ORT_ENFORCE inside a node's status: its location, signature and condition go, the reason stays."""
    shape = numpy_helper.from_array(np.array([4], np.int64), "shape")
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")],
        [_vi("x", None)],
        [_vi("y", None)],
        [shape],
    )
    exc = _raised(lambda: _session(model).run(None, {"x": np.zeros((2, 3), np.float32)}))
    assert "reshape_helper.h:" in str(exc) and "was false." in str(exc)
    assert _clean(exc) == (
        "Non-zero status code returned while running Reshape node. Name:'r' Status Message: The input tensor cannot "
        "be reshaped to the requested shape. Input shape:{2,3}, requested shape:{4}"
    )
    assert not ort_errors.is_input_error(exc)  # RuntimeException: ONNX Runtime failed while running


def test_nested_signature_after_a_sentence():
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], ir_version=99
    )
    exc = _raised(lambda: _session(model))
    assert "onnxruntime::Model::Model(onnx::ModelProto&&" in str(exc)
    assert (
        _clean(exc)
        == "Failed to load model with error: Unsupported model IR version: 99, max supported IR version: 10"
    )


def test_no_kernel_names_op_and_node():
    model = _model(
        [helper.make_node("Erf", ["x"], ["y"], name="up_Grad/Erf_0")],
        [_vi("x", [2], TensorProto.DOUBLE)],
        [_vi("y", [2], TensorProto.DOUBLE)],
    )
    exc = _raised(lambda: _session(model))
    assert (
        _clean(exc) == "Could not find an implementation for Erf(13) node with name 'up_Grad/Erf_0'"
    )
    assert ort_errors.missing_kernel(exc) == ("Erf", "up_Grad/Erf_0")
    assert ort_errors.missing_kernel(str(exc)) == ort_errors.missing_kernel(_clean(exc))


def test_messages_without_plumbing_are_kept():
    exc = _raised(lambda: _session(_model([], [_vi("x", [2])], [_vi("x", [2])])).run(None, {}))
    assert not ort_errors.is_ort_error(
        exc
    )  # onnxruntime's Python layer raises a builtin ValueError
    assert ort_errors.clean_message(exc) == " ".join(str(exc).split())
    assert ort_errors.clean_message("  two\n lines ") == "two lines"
    assert ort_errors.clean_message(ValueError("")) == ""


# ------------------------------------------------------------------ GradientGraphBuilder
def _gradient(model, requires_grad, loss="loss"):
    C = capi()
    options = C.SessionOptions()
    options.log_severity_level = 4
    optimized = C.get_optimized_model(model.SerializeToString(), set(requires_grad), options)
    builder = C.GradientGraphBuilder(optimized, {loss}, set(requires_grad), loss, options)
    builder.build()


def _round_model(name="rounding"):
    return _model(
        [
            helper.make_node("Mul", ["x", "w"], ["h"]),
            helper.make_node("Round", ["h"], ["r"], name=name),
            helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        ],
        [_vi("x", [3])],
        [_vi("loss", [])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )


@pytest.mark.parametrize(
    ("name", "expected"), [("rounding", ("Round", "rounding")), ("", ("Round", ""))]
)
def test_op_without_gradient_builder(name, expected):
    exc = _raised(lambda: _gradient(_round_model(name), ["w"]))
    assert "gradient_builder_registry.cc:" in str(exc) and "GetGradientForOp(" in str(exc)
    assert not ort_errors.is_ort_error(exc)  # the training bindings raise a plain RuntimeError
    assert (
        _clean(exc)
        == f"The gradient builder has not been registered: Round for node {name}".rstrip()
    )
    assert ort_errors.missing_gradient(exc) == expected


def _unreachable_model():
    return _model(
        [
            helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0),
            helper.make_node("Mul", ["x", "w"], ["other"]),
        ],
        [_vi("x", [3])],
        [_vi("loss", []), _vi("other", [3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )


def test_unreachable_parameter():
    exc = _raised(lambda: _gradient(_unreachable_model(), ["w"]))
    assert "::<lambda(" in str(exc) and "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : " in str(exc)
    assert (
        _clean(exc)
        == "Cannot compute the partial derivative for 'w' as it's unreachable from the output node(s)."
    )
    assert ort_errors.unreachable_value(exc) == "w"
    assert ort_errors.missing_gradient(exc) is None


def test_lambda_signature_and_status_prefix():
    options = capi().SessionOptions()
    exc = _raised(lambda: capi().get_optimized_model(b"not a model", {"w"}, options))
    assert _clean(exc) == "Failed to load model because protobuf parsing failed."


def test_unknown_loss():
    exc = _raised(lambda: _gradient(_round_model(), ["w"], loss="nope"))
    assert (
        _clean(exc) == "Node arg 'nope' is not found in the graph. Available output names = 'loss'"
    )


# ------------------------------------------------------------------ what the users of the translator say
def test_gradient_builder_failure_messages():
    with pytest.raises(GradientError) as info:
        build_training_graphs(_round_model(), ["w"])
    assert str(info.value).startswith(
        "ONNX Runtime cannot differentiate node 'rounding': op Round (domain 'ai.onnx') has no gradient builder. "
        "Freeze the parameters behind it (['w']: pass them in frozen_params"
    )
    with pytest.raises(GradientError) as info:
        build_training_graphs(_round_model(""), ["w"])
    assert "node (unnamed, writing 'r'): op Round" in str(info.value)
    with pytest.raises(GradientError) as info:
        build_training_graphs(_unreachable_model(), ["w"])
    assert str(info.value).startswith(
        "The loss 'loss' does not depend differentiably on 'w': no path of differentiable ops leads from it to the "
        "loss (ONNX Runtime: Cannot compute the partial derivative for 'w' as it's unreachable from the output "
        "node(s).). Freeze 'w'"
    )


def test_custom_op_library_failure_message(tmp_path):
    library = tmp_path / "ops.so"
    library.write_bytes(b"")
    model = _model([helper.make_node("Relu", ["x"], ["loss"])], [_vi("x", [])], [_vi("loss", [])])
    with pytest.raises(OSError) as info:
        build_training_graphs(model, ["x"], custom_op_libraries=[str(library)])
    assert str(info.value) == (
        f"ONNX Runtime could not load the custom op library '{library}': Failed to load library {library} with "
        f"error: {library}: file too short. Pass the path of a shared library built against onnxruntime 1.19.2 "
        "that registers the model's custom ops."
    )


def test_runtime_delegates_to_the_translator(tmp_path):
    assert runtime_ort.clean_message is ort_errors.clean_message
    assert runtime_ort.is_ort_error is ort_errors.is_ort_error
    assert runtime_ort.is_input_error is ort_errors.is_input_error
    session = TrainingSession(generate(tmp_path / "art"))
    with pytest.raises(
        ValueError
    ) as info:  # exports are cut by onnxblocks since issue 16, not by ORT's module
        session.export_inference_model(tmp_path / "bad.onnx", ["no_such_output"])
    assert str(info.value).startswith(
        "Cannot export outputs ['no_such_output']: the eval model computes no such value. Eval model outputs: "
    )
    assert not (tmp_path / "bad.onnx").exists()


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (  # gcc's __PRETTY_FUNCTION__ of a template, with qualifiers
            "/onnxruntime_src/onnxruntime/core/framework/x.h:7 void onnxruntime::F(const T&) const [with T = float] "
            "Shape mismatch.",
            "Shape mismatch.",
        ),
        (  # a status with a location but no status name
            "[ONNXRuntimeError] : 1 : module.cc:80 Run Something failed.",
            "Something failed.",
        ),
        (  # no readable signature after the location: only the location goes
            "/src/a.cc:3 no parameter list here",
            "no parameter list here",
        ),
    ],
)
def test_cleaning_edge_cases(message, expected):
    assert ort_errors.clean_message(message) == expected


def test_parsed_facts_are_named_tuples():
    fact = ort_errors.missing_gradient(
        "The gradient builder has not been registered: Round for node rounding"
    )
    assert fact is not None and (fact.op_type, fact.node) == ("Round", "rounding")
    kernel = ort_errors.missing_kernel(
        "Could not find an implementation for Erf(13) node with name 'e'"
    )
    assert kernel is not None and (kernel.op_type, kernel.node) == ("Erf", "e")


def _reshape_model():
    """``y = Reshape(x, [-1, 3]) @ W``: a batch whose element count is not a multiple of 3 fails inside ONNX Runtime."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("MatMul", ["r", "W"], ["y"]),
        ],
        "reshape",
        [_vi("x", ["N", 2])],
        [_vi("y", ["M", 1])],
        [
            numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"),
            numpy_helper.from_array(np.ones((3, 1), np.float32), "W"),
        ],
    )
    return _model([*graph.node], [*graph.input], [*graph.output], [*graph.initializer])


@pytest.mark.parametrize("backend", ["training", "portable"])
def test_run_failures_are_translated_once_on_both_backends(tmp_path, backend):
    from onnxblocks import artifacts, optim
    from onnxblocks.errors import OrtRunError

    art = tmp_path / backend
    artifacts.generate_artifacts(
        _reshape_model(),
        requires_grad=["W"],
        loss=artifacts.LossType.MSELoss,
        optimizer=optim.SGD(),
        artifact_directory=art,
        portable=backend == "portable",
    )
    session = TrainingSession(art, backend=backend)
    (loss,) = session.train_step(np.ones((3, 2), np.float32), np.ones((2, 1), np.float32))
    assert_equal(
        loss, np.float32(4.0), name="loss"
    )  # ((1+1+1) - 1) ** 2, averaged, exact: the model runs
    with pytest.raises(OrtRunError) as info:
        session.train_step(np.ones((4, 2), np.float32), np.ones((2, 1), np.float32))
    message = str(info.value)
    assert message.startswith("ONNX Runtime failed running the training model: ")
    assert (
        "The input tensor cannot be reshaped to the requested shape. Input shape:{4,2}" in message
    )
    assert ".cc:" not in message and ".h:" not in message and "Error in execution" not in message
    assert isinstance(info.value, RuntimeError) and info.value.input_error is False
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_run_error_keeps_whether_ort_blamed_the_input():
    exc = _raised(
        lambda: _session(
            _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
        ).run(None, {"x": np.zeros(3, np.float32)})
    )
    translated = ort_errors.run_error(exc, "the model")
    assert translated.input_error is ort_errors.is_input_error(exc) is True
    assert str(translated) == "ONNX Runtime failed running the model: " + ort_errors.clean_message(
        exc
    )

"""Artifact sets whose files do not belong together are refused when the session opens, on both backends.

Each case copies one generated artifact directory and replaces one file by the
same file of another generation (another width, another parameter name, another
loss). Opening a ``TrainingSession`` must raise an ``OnnxBlocksError`` that names
the odd file and the parameter or input, where before ONNX Runtime failed at the
first step (or the session trained against the wrong shapes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

import onnxblocks
from onnxblocks import losses
from onnxblocks.artifacts import OptimType
from onnxblocks.errors import CheckpointMismatchError, InvalidValueError, OnnxBlocksError
from onnxblocks.runtime import TrainingSession


def _model(classes: int = 5, name: str = "W", dtype: int = TensorProto.FLOAT):
    weight = np.random.default_rng(0).standard_normal((3, classes))
    w = numpy_helper.from_array(weight.astype(helper.tensor_dtype_to_np_dtype(dtype)), name)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", name], ["logits"])],
        "g",
        [helper.make_tensor_value_info("x", dtype, ["N", 3])],
        [helper.make_tensor_value_info("logits", dtype, ["N", classes])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def generations(tmp_path_factory):
    """Artifact directories of several models, for both backends: {(variant, portable): directory}."""
    root = tmp_path_factory.mktemp("consistency")
    variants = {
        "base": (_model(), losses.MSELoss()),
        "wider": (_model(classes=4), losses.MSELoss()),
        "renamed": (_model(name="V"), losses.MSELoss()),
        "other_loss": (_model(), losses.CrossEntropyLoss()),
    }
    out = {}
    for (variant, (model, loss)), portable in [
        (v, p) for v in variants.items() for p in (False, True)
    ]:
        directory = root / f"{variant}-{portable}"
        onnxblocks.generate_artifacts(
            model,
            requires_grad=[model.graph.initializer[0].name],
            loss=loss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory,
            portable=portable,
        )
        out[variant, portable] = directory
    return out


def _mixed(tmp_path: Path, base: Path, other: Path, file: str) -> Path:
    mixed = tmp_path / "mixed"
    shutil.copytree(base, mixed)
    shutil.copy(other / file, mixed / file)
    return mixed


CASES = [
    # (portable, file, other generation, error type, what the message names)
    (
        False,
        "eval_model.onnx",
        "wider",
        InvalidValueError,
        ["eval_model.onnx", "'target'", "[N, 4]", "[N, 5]"],
    ),
    (
        False,
        "eval_model.onnx",
        "renamed",
        InvalidValueError,
        ["eval_model.onnx", "'V'", "neither a parameter"],
    ),
    (False, "eval_model.onnx", "other_loss", InvalidValueError, ["eval_model.onnx", "'labels'"]),
    (
        False,
        "training_model.onnx",
        "wider",
        CheckpointMismatchError,
        ["training_model.onnx", "'W'"],
    ),
    (True, "eval_model.onnx", "wider", InvalidValueError, ["eval_model.onnx", "'target'"]),
    (
        True,
        "optimizer_model.onnx",
        "wider",
        CheckpointMismatchError,
        ["optimizer_model.onnx", "'W'", "[3, 4]"],
    ),
    (
        True,
        "optimizer_model.onnx",
        "renamed",
        CheckpointMismatchError,
        ["optimizer_model.onnx", "'W'"],
    ),
    (
        True,
        "step_model.onnx",
        "wider",
        CheckpointMismatchError,
        ["step_model.onnx", "'W'", "[3, 4]", "[3, 5]"],
    ),
    (True, "step_model.onnx", "renamed", CheckpointMismatchError, ["step_model.onnx", "'W'"]),
    (
        True,
        "step_model.onnx",
        "other_loss",
        InvalidValueError,
        ["step_model.onnx", "training_model.onnx", "labels"],
    ),
    (True, "training_model.onnx", "wider", CheckpointMismatchError, ["training_model.onnx", "'W'"]),
]


@pytest.mark.parametrize(
    ("portable", "file", "other", "error", "named"),
    CASES,
    ids=[f"{'portable' if c[0] else 'training'}-{c[1]}-from-{c[2]}" for c in CASES],
)
def test_a_file_of_another_generation_is_refused_when_the_session_opens(
    generations, tmp_path, portable, file, other, error, named
):
    mixed = _mixed(tmp_path, generations["base", portable], generations[other, portable], file)
    with pytest.raises(error) as caught:
        TrainingSession(mixed)
    assert isinstance(caught.value, OnnxBlocksError)
    message = str(caught.value)
    for fragment in named:
        assert fragment in message, message


def test_a_consistent_set_opens_and_trains_on_both_backends(generations):
    x = np.ones((2, 3), np.float32)
    target = np.zeros((2, 5), np.float32)
    losses_by_backend = {}
    for portable in (False, True):
        session = TrainingSession(generations["base", portable])
        losses_by_backend[portable] = float(session.train_and_update(x, target)[0])
        assert float(session.eval_step(x, target)[0]) < losses_by_backend[portable]
    # the two backends: two float32 computations of ours, neither the truth
    assert_close(
        np.float32(losses_by_backend[True]),
        np.float32(losses_by_backend[False]),
        rtol=1e-6,
        name="loss",
    )


def test_a_parameter_of_another_dtype_is_named(generations, tmp_path):
    """A step model that takes ``W`` as float64 in a float32 set: the message gives both element types."""
    mixed = tmp_path / "mixed"
    shutil.copytree(generations["base", True], mixed)
    model = onnx.load(mixed / "step_model.onnx")
    next(
        i for i in model.graph.input if i.name == "W"
    ).type.tensor_type.elem_type = TensorProto.DOUBLE
    onnx.save(model, mixed / "step_model.onnx")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"step_model\.onnx.*'W' is float32 \[3, 5\].*float64 \[3, 5\]",
    ):
        TrainingSession(mixed)


def test_a_step_model_of_another_optimizer_is_refused(generations, tmp_path):
    """An SGD step model in an AdamW set would train with SGD without a word."""
    other = tmp_path / "sgd"
    onnxblocks.generate_artifacts(
        _model(),
        requires_grad=["W"],
        loss=losses.MSELoss(),
        optimizer=OptimType.SGD,
        artifact_directory=other,
        portable=True,
    )
    mixed = _mixed(tmp_path, generations["base", True], other, "step_model.onnx")
    with pytest.raises(
        InvalidValueError, match=r"step_model\.onnx.*optimizer_model\.onnx.*different optimizers"
    ):
        TrainingSession(mixed)


@pytest.mark.parametrize(
    "message",
    [
        "Could not find an implementation for OneHot(11) node with name 'OneHot_0'",
        "Failed to find kernel for OneHot(11) (node:'OneHot_0' ep:'CPUExecutionProvider'). Op with name ...",
    ],
)
def test_a_portable_model_without_a_kernel_names_the_op_and_does_not_say_regenerate_portable(
    message,
):
    from onnxblocks.runtime.load_errors import load_error

    error = load_error("1.32.0", "training model", "/a/training_model.onnx", message)
    assert isinstance(error, OnnxBlocksError) and isinstance(error, ValueError)
    text = str(error)
    assert "no kernel for OneHot (node 'OneHot_0')" in text and "'/a/training_model.onnx'" in text
    assert "regenerate" not in text

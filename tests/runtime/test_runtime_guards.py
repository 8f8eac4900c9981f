"""Runtime guards: batches, labels and arguments checked before ONNX Runtime sees them.

Each test is one bad input or environment, asserting the exact behaviour: the exception type, the offender
it names, the numbers (against torch), and the directory before and after.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.numerics import assert_close
from support.runtime_support import classification_data, generate, listing, mlp_model

from onnxblocks import losses
from onnxblocks.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from onnxblocks.io import load_model, save_model
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """MLP classifier artifacts (2 -> 16 -> 3, fused cross entropy, AdamW)."""
    return generate(tmp_path_factory.mktemp("art"))


# =========================================================================== runtime guards
@pytest.fixture(scope="module")
def ignore_art(tmp_path_factory):
    """Artifacts whose loss is CrossEntropyLoss(ignore_index=-100) (fused) and NLLLoss (composed), both models."""
    out = {}
    for name, loss in (
        ("ce_ignore", losses.CrossEntropyLoss(ignore_index=-100)),
        ("nll", losses.NLLLoss()),
        ("nll_ignore", losses.NLLLoss(ignore_index=-1)),
    ):
        out[name] = generate(tmp_path_factory.mktemp(name), loss=loss)
    return out


@pytest.mark.parametrize("check_inputs", [True, False])
def test_empty_batch_is_refused_before_onnx_runtime(art, check_inputs):
    session = TrainingSession(art, check_inputs=check_inputs)
    x, y = classification_data()
    for step in (session.train_step, session.eval_step):
        with pytest.raises(
            ValueError,
            match=r"got an empty batch: input 'x' has shape \(0, 2\), dimension 0 \('batch'",
        ):
            step(x[:0], y[:0])
    assert session.accumulated_steps == 0


@pytest.mark.parametrize("bad", [10**9, 3, -1])
def test_labels_out_of_range_are_refused_with_the_offending_value(art, bad):
    session = TrainingSession(art)
    x, y = classification_data()
    y = y.copy()
    y[5] = bad
    for step in (session.train_step, session.eval_step):
        with pytest.raises(ValueError) as info:
            step(x, y)
        message = str(info.value)
        for fragment in (
            f"input 'labels' holds {bad} at position (5,)",
            "3 classes of 'logits'",
            "[0, 3)",
        ):
            assert fragment in message, message
    assert session.accumulated_steps == 0


@pytest.mark.parametrize("bad", [10**9, 3, -1, -(2**63)])
def test_labels_out_of_range_are_refused_after_the_batch_signature_passed(art, bad):
    """A signature checked once gets the per-batch check only (one unsigned max): the values are still read."""
    session = TrainingSession(art)
    x, y = classification_data()
    before = session.eval_step(
        x, y
    )  # the signature (types, dtypes, shapes) passes and is remembered
    bad_y = y.copy()
    bad_y[5] = bad
    for step in (session.train_step, session.eval_step):
        with pytest.raises(
            ValueError, match=rf"input 'labels' holds {bad} at position \(5,\).*\[0, 3\)"
        ):
            step(x, bad_y)
    assert session.accumulated_steps == 0
    np.testing.assert_array_equal(session.eval_step(x, y)[0], before[0])


@pytest.mark.parametrize(("name", "ignore"), [("ce_ignore", -100), ("nll_ignore", -1)])
def test_ignore_index_is_still_accepted_after_the_batch_signature_passed(ignore_art, name, ignore):
    session = TrainingSession(ignore_art[name])
    x, y = classification_data()
    session.eval_step(x, y)
    y = y.copy()
    y[::4] = ignore
    session.eval_step(
        x, y
    )  # accepted: the fast one-reduction check does not apply where values are allowed
    y[1] = -7
    with pytest.raises(ValueError, match=r"holds -7 at position \(1,\)"):
        session.eval_step(x, y)


def _torch_loss(kind: str, logits: np.ndarray, labels: np.ndarray, ignore_index: int) -> np.ndarray:
    """torch's loss of the session's logits, in their dtype (float64 for the float64 reference)."""
    import torch

    t = torch.from_numpy(logits)
    target = torch.from_numpy(labels)
    if kind == "ce":
        return torch.nn.functional.cross_entropy(t, target, ignore_index=ignore_index).numpy()
    return torch.nn.functional.nll_loss(t, target, ignore_index=ignore_index).numpy()


@pytest.mark.parametrize(
    ("name", "kind", "ignore"), [("ce_ignore", "ce", -100), ("nll_ignore", "nll", -1)]
)
def test_ignore_index_labels_are_accepted_and_the_loss_equals_torch(ignore_art, name, kind, ignore):
    session = TrainingSession(ignore_art[name])
    x, y = classification_data()
    y = y.copy()
    y[::4] = ignore
    loss, logits = session.eval_step(x, y)
    want, want64 = (
        _torch_loss(kind, logits.astype(dtype), y, ignore) for dtype in (np.float32, np.float64)
    )
    assert_close(np.asarray(loss).reshape(()), want, want64, rtol=1e-5, name="loss")
    y[1] = 3
    with pytest.raises(
        ValueError, match=rf"holds 3 at position \(1,\).*\[0, 3\) or \[{ignore}\] \(ignore_index\)"
    ):
        session.train_step(x, y)


def test_composed_nll_without_ignore_index_refuses_minus_one(ignore_art):
    session = TrainingSession(ignore_art["nll"])
    x, y = classification_data()
    y = y.copy()
    y[2] = -1  # GatherElements would take it as the last class: a wrong loss, silently
    with pytest.raises(ValueError, match=r"holds -1 at position \(2,\).*GatherElements.*\[0, 3\)"):
        session.train_step(x, y)


# =========================================================================== arguments
@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda art: TrainingSession(3), "artifact_dir must be a path"),
        (lambda art: TrainingSession(art, checkpoint=7), "checkpoint must be a path"),
        (lambda art: TrainingSession(art, prefix=1), "prefix must be a str"),
        (
            lambda art: TrainingSession(art, check_inputs="yes"),
            "check_inputs must be True or False",
        ),
        (lambda art: TrainingSession(art).save_checkpoint(3.5), "path must be a path"),
        (lambda art: TrainingSession(art).load_checkpoint(None), "path must be a path"),
        (lambda art: load_checkpoint(12), "path_to_checkpoint must be a path"),
        (lambda art: save_checkpoint(([], []), 12), "path_to_checkpoint must be a path"),
        (lambda art: save_model(mlp_model(), 5), "path must be a path"),
        (lambda art: load_model(b"model.onnx"), "path must be a path"),
    ],
)
def test_numbers_where_paths_are_expected_are_type_errors_naming_the_parameter(art, call, fragment):
    with pytest.raises(TypeError, match=fragment):
        call(art)


def test_output_paths_below_a_file_or_with_nul_bytes(art, tmp_path):
    session = TrainingSession(art)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="'.*file' is a file, not a directory"):
        session.save_checkpoint(tmp_path / "file" / "ck")
    with pytest.raises(ValueError, match="NUL character"):
        session.save_checkpoint(str(tmp_path / "c\0k"))
    with pytest.raises(IsADirectoryError):
        session.save_checkpoint(tmp_path)
    assert listing(tmp_path) == ["file"]


def test_no_warnings_from_the_guards(art):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = TrainingSession(art)
        session.train_step(*classification_data())


@pytest.mark.parametrize("bad", [3, -7])
def test_two_dimensional_labels_after_the_batch_signature_passed(tmp_path, bad):
    """Class-last labels ``[B, T]`` (language models): the per-batch check reduces over every element."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from onnxblocks.artifacts import OptimType, generate_artifacts

    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "W"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])],
        "class_last",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    for portable in (False, True):
        directory = tmp_path / f"portable-{portable}"
        generate_artifacts(
            model, requires_grad=["W"], loss=losses.CrossEntropyLoss(class_axis=-1),
            optimizer=OptimType.AdamW, artifact_directory=directory, portable=portable,
        )  # fmt: skip
        session = TrainingSession(directory)
        x = np.ones((2, 5, 4), np.float32)
        y = np.arange(10, dtype=np.int64).reshape(2, 5) % 3
        first = session.train_step(x, y)[0]  # the signature is checked in full and remembered
        again = session.train_step(x, y)[
            0
        ]  # the per-batch check only: the labels' max over all [2, 5] values
        np.testing.assert_array_equal(first, again)
        bad_y = y.copy()
        bad_y[1, 3] = bad
        with pytest.raises(ValueError, match=rf"input 'labels' holds {bad} at position \(1, 3\)"):
            session.train_step(x, bad_y)

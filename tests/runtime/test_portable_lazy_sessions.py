"""The portable backend opens the training model's session with the training session and each
other model's session on its first run: a loop of ``train_and_update`` opens the step model only,
``train_step`` + ``optimizer_step`` the optimizer model only, ``eval_step`` the eval model. What the
session reports and computes does not depend on when a session opened."""

from __future__ import annotations

import onnxruntime
from support.numerics import assert_equal
from support.runtime_support import classification_data, mlp_model

from onnxblocks import generate_artifacts, optim
from onnxblocks.artifacts import LossType
from onnxblocks.runtime import TrainingSession

KINDS = ("eval", "optimizer", "step")


def _artifacts(directory):
    generate_artifacts(
        mlp_model(),
        requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        loss=LossType.CrossEntropyLoss,
        optimizer=optim.AdamW(),
        artifact_directory=directory,
        portable=True,
    )
    return directory


def _opened(session) -> set[str]:
    backend = session._backend
    attributes = {"eval": backend._eval, "optimizer": backend._optimizer, "step": backend._fused}
    return {kind for kind, model in attributes.items() if model is not None}


def _names(path) -> tuple[list[str], list[str]]:
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]


def test_each_session_opens_on_first_use_and_nothing_else_changes(tmp_path):
    directory = _artifacts(tmp_path / "mlp")
    x, y = classification_data(24)

    fused = TrainingSession(directory, backend="portable")
    assert fused.backend == "portable"
    assert _opened(fused) == set(), "a model's session opened with the training session"
    inputs, outputs = _names(str(directory / "eval_model.onnx"))
    params = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert fused.eval_input_names == [n for n in inputs if n not in params]
    assert fused.eval_output_names == outputs
    fused_losses = [float(fused.train_and_update(x, y)[0]) for _ in range(3)]
    assert _opened(fused) == {"step"}

    split = TrainingSession(directory, backend="portable")
    split_losses = []
    for _ in range(3):
        split_losses.append(float(split.train_step(x, y)[0]))
        split.optimizer_step()
        split.lazy_reset_grad()
    assert _opened(split) == {"optimizer"}

    eager = TrainingSession(directory, backend="portable")
    for kind in KINDS:  # every session open before the first step, as before
        eager._backend._model(kind)
    assert _opened(eager) == set(KINDS)
    eager_losses = [float(eager.train_and_update(x, y)[0]) for _ in range(3)]
    assert fused_losses == eager_losses
    for name in sorted(params):
        assert_equal(fused.get_parameter(name), eager.get_parameter(name), name=name)
    assert fused_losses[-1] < fused_losses[0]
    assert len(split_losses) == 3 and split_losses[-1] < split_losses[0]

    assert_equal(fused.eval_step(x, y)[0], eager.eval_step(x, y)[0], name="eval loss")
    assert _opened(fused) == {"step", "eval"}

"""The training build's eval session opens on the first eval step, and evaluates exactly as ONNX
Runtime's own ``Module`` with its eval model does (docs/lora.md, "Memory of a step")."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support import frozen_base
from support.runtime_support import classification_data, generate

from onnxblocks.runtime import TrainingSession, _ort


def _artifacts(kind: str, tmp_path):
    """Artifacts with frozen values two ways: held in the checkpoint as non-trainable parameters
    (an MLP's first layer), or a frozen base in ``base_weights.bin`` (the frozen-base model)."""
    if kind == "frozen-in-checkpoint":
        directory = generate(
            tmp_path / "mlp",
            requires_grad=["fc2.weight", "fc2.bias"],
            frozen=["fc1.weight", "fc1.bias"],
        )
        return directory, classification_data(24)
    directory = tmp_path / "base"
    frozen_base.generate(frozen_base.exported(tmp_path), directory, portable=False)
    return directory, frozen_base.batch()


def _module_eval(directory, checkpoint, arrays):
    """ONNX Runtime's ``Module`` with the eval model, opened as the backend opened it before."""
    C = _ort.capi()
    state = C.load_checkpoint(os.fspath(checkpoint))
    module = C.Module(
        os.fspath(directory / "training_model.onnx"),
        state,
        os.fspath(directory / "eval_model.onnx"),
        _ort.make_device("cpu"),
        _ort.session_options(runs=True, frozen_base=(directory / "base_weights.bin").exists()),
    )
    fetches = C.OrtValueVector()
    module.eval_step(list(arrays), fetches)
    names = list(module.input_names(False)), list(module.output_names(False))
    return [f.numpy() for f in fetches], names


@pytest.mark.parametrize("kind", ["frozen-in-checkpoint", "frozen-base"])
def test_eval_opens_lazily_and_equals_module_eval(kind, tmp_path):
    directory, batch = _artifacts(kind, tmp_path)
    session = TrainingSession(directory, backend="training")
    backend = session._backend
    assert backend._eval is None, "the eval session opened with the training session"
    first = session.eval_step(*batch)
    assert backend._eval is not None
    theirs, (inputs, outputs) = _module_eval(directory, directory / "checkpoint", batch)
    assert (session.eval_input_names, session.eval_output_names) == (inputs, outputs)
    assert len(first) == len(theirs)
    for ours, ref in zip(first, theirs, strict=True):
        np.testing.assert_array_equal(ours, ref)

    for _ in range(3):  # the eval reads the parameters the optimizer updated, in place
        session.train_and_update(*batch)
    session.save_checkpoint(tmp_path / "trained")
    trained = session.eval_step(*batch)
    theirs, _ = _module_eval(directory, tmp_path / "trained", batch)
    for ours, ref in zip(trained, theirs, strict=True):
        np.testing.assert_array_equal(ours, ref)
    assert not np.array_equal(trained[0], first[0]), "training did not move the eval loss"

    session.load_checkpoint(directory / "checkpoint")  # a new state: the eval follows it
    for ours, ref in zip(session.eval_step(*batch), first, strict=True):
        np.testing.assert_array_equal(ours, ref)

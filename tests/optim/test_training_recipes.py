"""The torch.optim family trained end to end: portable artifacts on a TrainingSession against torch.optim.

An MLP with a cross-entropy loss trains 20 steps under a changing learning rate
with two parameter groups (biases apart, with their own lr and weight decay);
the loss and every parameter match a torch model trained with the same
``torch.optim`` optimizer and groups (``support.numerics``: rtol 1e-5 of torch in
float32, or within the rounding torch's float32 run has against the same run in
float64, plus a floor of the magnitude of the updates each parameter summed: the
gradients come from two engines, ONNX Runtime's backward and torch's autograd differ
by an ulp, which Adam's normalised steps carry to parameters crossing zero), through the
optimizer model (``train_step`` + ``optimizer_step``) and through the fused step
model (``train_and_update``). Resuming from a checkpoint saved after 10 steps
gives bit-for-bit the parameters of the uninterrupted run. The training build
drives the same optimizer models itself, and its checkpoints move to the
portable backend and back unchanged. Stock onnxruntime under Python 3.13 (the
cached environment of tests/support/portable_env.py) trains the same artifacts as
torch does and resumes in the middle bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from support.numerics import assert_close
from support.optim_family import step_magnitudes
from support.runtime_support import PARAMS, classification_data, mlp_model

from onnxblocks import artifacts, optim
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.runtime import TrainingSession

STEPS = 20
BASE_LR = 0.05
BIASES = ["fc1.bias", "fc2.bias"]


def lr_at(step: int) -> float:
    return BASE_LR * (1.0 + 0.5 * math.cos(step))


#: (our optimizer, torch's, its options); the bias group gets 2 x the lr and weight decay 0.
CASES = {
    "sgd-nesterov": (
        optim.SGD,
        torch.optim.SGD,
        {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    ),
    "sgd-dampening": (
        optim.SGD,
        torch.optim.SGD,
        {"momentum": 0.8, "dampening": 0.2, "maximize": False},
    ),
    "adam-amsgrad": (optim.Adam, torch.optim.Adam, {"amsgrad": True, "weight_decay": 1e-3}),
    "adamw-amsgrad": (optim.AdamW, torch.optim.AdamW, {"amsgrad": True, "weight_decay": 0.05}),
    "adagrad": (
        optim.Adagrad,
        torch.optim.Adagrad,
        {"lr_decay": 0.01, "initial_accumulator_value": 0.1},
    ),
    "rmsprop": (
        optim.RMSprop,
        torch.optim.RMSprop,
        {"centered": True, "momentum": 0.5, "weight_decay": 1e-3},
    ),
}


def _groups(lr: float) -> list[dict]:
    return [{"params": BIASES, "lr": 2 * lr, "weight_decay": 0.0}]


def _artifacts(directory: Path, ours, options: dict, portable: bool = True) -> Path:
    artifacts.generate_artifacts(
        mlp_model(d_in=3, hidden=8),
        requires_grad=PARAMS,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=ours(lr=BASE_LR, param_groups=_groups(BASE_LR), **options),
        artifact_directory=directory,
        portable=portable,
    )
    return directory


def _data() -> tuple[np.ndarray, np.ndarray]:
    return classification_data(rows=16, d_in=3, seed=3)


def _initial() -> dict[str, np.ndarray]:
    return {
        i.name: onnx.numpy_helper.to_array(i).copy()
        for i in mlp_model(d_in=3, hidden=8).graph.initializer
    }


def _torch(
    theirs, options: dict, dtype: torch.dtype = torch.float32
) -> list[tuple[float, dict[str, np.ndarray]]]:
    """torch's loss and parameters after each step, run in ``dtype`` from the same float32 start and data."""
    P = {n: torch.nn.Parameter(torch.from_numpy(v).to(dtype)) for n, v in _initial().items()}
    opt = theirs(
        [
            {"params": [P[n] for n in PARAMS if n not in BIASES]},
            {"params": [P[n] for n in BIASES], "lr": 2 * BASE_LR, "weight_decay": 0.0},
        ],
        lr=BASE_LR,
        **options,
    )
    x, y = torch.from_numpy(_data()[0]).to(dtype), torch.from_numpy(_data()[1])
    history = []
    for step in range(STEPS):
        lr = float(np.float32(lr_at(step)))
        opt.param_groups[0]["lr"], opt.param_groups[1]["lr"] = lr, 2 * lr
        opt.zero_grad()
        h = torch.relu(x @ P["fc1.weight"] + P["fc1.bias"])
        loss = torch.nn.functional.cross_entropy(h @ P["fc2.weight"] + P["fc2.bias"], y)
        loss.backward()
        opt.step()
        history.append((float(loss.detach()), {n: p.detach().numpy().copy() for n, p in P.items()}))
    return history


def _assert_follows(ran, expected, expected64, first: int = 0) -> None:
    """Losses and parameters of the steps from ``first`` on against torch's float32 and float64 runs."""
    start = _initial()
    scales = {n: step_magnitudes(start[n], [params[n] for _, params in expected64]) for n in PARAMS}
    for step, ((loss, params), (want_loss, want), (loss64, want64)) in enumerate(
        zip(ran, expected[first:], expected64[first:], strict=True), start=first
    ):
        assert_close(
            np.float32(loss),
            np.float32(want_loss),
            loss64,
            rtol=1e-5,
            name=f"loss, step {step + 1}",
        )
        for n in PARAMS:
            name = f"{n}, step {step + 1}"
            assert_close(params[n], want[n], want64[n], rtol=1e-5, scale=scales[n][step], name=name)


def _train(
    session: TrainingSession, steps: range, fused: bool
) -> list[tuple[float, dict[str, np.ndarray]]]:
    x, y = _data()
    history = []
    for step in steps:
        session.learning_rate = lr_at(step)
        if fused:
            loss = session.train_and_update(x, y)[0]
        else:
            loss = session.train_step(x, y)[0]
            session.optimizer_step()
        history.append((float(loss), session.parameters(trainable_only=True)))
    return history


@pytest.mark.parametrize("case", sorted(CASES))
def test_portable_training_matches_torch_and_resumes_bit_exact(case: str, tmp_path: Path) -> None:
    ours, theirs, options = CASES[case]
    directory = _artifacts(tmp_path / "artifacts", ours, options)
    expected, expected64 = _torch(theirs, options), _torch(theirs, options, torch.float64)
    for fused in (False, True):
        session = TrainingSession(directory, backend="portable")
        _assert_follows(_train(session, range(STEPS), fused), expected, expected64)
    # resume after 10 steps: the state round-trips through the checkpoint exactly
    first = TrainingSession(directory, backend="portable")
    _train(first, range(10), fused=True)
    first.save_checkpoint(tmp_path / "ckpt")
    saved = load_checkpoint(tmp_path / "ckpt").optimizer_state["group0"]
    assert saved["step"] == 10
    assert len(saved["moments"]["fc1.weight"]) == len(optim_states(ours, options))
    resumed = TrainingSession(directory, checkpoint=tmp_path / "ckpt", backend="portable")
    rest = _train(resumed, range(10, STEPS), fused=True)
    whole = _train(TrainingSession(directory, backend="portable"), range(STEPS), fused=True)
    for (loss, params), (whole_loss, whole_params) in zip(rest, whole[10:], strict=True):
        assert loss == whole_loss
        for n in PARAMS:
            np.testing.assert_array_equal(params[n], whole_params[n])


def optim_states(ours, options: dict) -> tuple[str, ...]:
    block = ours(lr=BASE_LR, param_groups=_groups(BASE_LR), **options)
    standard = block.standard or block  # AdamW and SGD with groups build their standard form
    trainable = [onnx.numpy_helper.from_array(np.zeros(2, np.float32), n) for n in PARAMS]
    return standard.spec(trainable, onnx.TensorProto.FLOAT).states


@pytest.mark.parametrize("case", ["sgd-nesterov", "adamw-amsgrad", "rmsprop"])
def test_training_build_drives_the_standard_optimizer_and_moves_between_backends(
    case: str, tmp_path: Path
) -> None:
    ours, theirs, options = CASES[case]
    training = _artifacts(tmp_path / "training", ours, options, portable=False)
    portable = _artifacts(tmp_path / "portable", ours, options)
    expected, expected64 = _torch(theirs, options), _torch(theirs, options, torch.float64)
    session = TrainingSession(training, backend="training")
    ran = _train(session, range(STEPS), fused=False)
    _assert_follows(ran, expected, expected64)
    # resume on the training build is bit-exact; its checkpoint moves to the portable backend and back unchanged
    first = TrainingSession(training, backend="training")
    _train(first, range(10), fused=False)
    first.save_checkpoint(tmp_path / "train.ckpt")
    resumed = _train(
        TrainingSession(training, checkpoint=tmp_path / "train.ckpt", backend="training"),
        range(10, 12),
        False,
    )
    for (loss, params), (whole_loss, whole) in zip(resumed, ran[10:12], strict=True):
        assert loss == whole_loss
        for n in PARAMS:
            np.testing.assert_array_equal(params[n], whole[n])
    moved = TrainingSession(portable, checkpoint=tmp_path / "train.ckpt", backend="portable")
    moved.save_checkpoint(tmp_path / "portable.ckpt")
    back = TrainingSession(training, checkpoint=tmp_path / "portable.ckpt", backend="training")
    back.save_checkpoint(tmp_path / "back.ckpt")
    a, b = load_checkpoint(tmp_path / "train.ckpt"), load_checkpoint(tmp_path / "back.ckpt")
    assert a.optimizer_state["group0"]["step"] == b.optimizer_state["group0"]["step"] == 10
    for n in PARAMS:
        np.testing.assert_array_equal(a.trainable[n], b.trainable[n])
        for m, m2 in zip(
            a.optimizer_state["group0"]["moments"][n],
            b.optimizer_state["group0"]["moments"][n],
            strict=True,
        ):
            np.testing.assert_array_equal(m, m2)
    # and the portable backend continues the run within the torch tolerance
    _assert_follows(_train(moved, range(10, STEPS), fused=True), expected, expected64, first=10)


@pytest.mark.parametrize("case", ["sgd-nesterov", "adamw-amsgrad", "adagrad", "rmsprop"])
def test_stock_onnxruntime_on_python_313_trains_as_torch_and_resumes_bit_exact(
    case: str, portable_python, tmp_path: Path
) -> None:
    from support.portable_env import run_worker

    ours, theirs, options = CASES[case]
    directory = _artifacts(tmp_path / "artifacts", ours, options)
    x, y = _data()
    data = tmp_path / "batches.npz"
    np.savez(data, x0_0=x, x0_1=y)
    task = {
        "task": "train",
        "directory": str(directory),
        "data": str(data),
        "steps": STEPS,
        "lr": BASE_LR,
    }
    whole, resumed = run_worker(
        portable_python,
        {"tasks": [{**task, "params_out": str(tmp_path / "p.npz")}, {**task, "resume_at": 10}]},
    )["results"]
    assert "error" not in whole, whole.get("trace")
    assert whole["backend"] == "portable"
    assert resumed["losses"] == whole["losses"]  # resume in the middle is bit-exact
    expected, expected64 = (
        _torch_constant(theirs, options),
        _torch_constant(theirs, options, torch.float64),
    )
    params = np.load(tmp_path / "p.npz")
    _assert_follows(
        [(whole["losses"][-1], {n: params[n] for n in PARAMS})],
        expected,
        expected64,
        first=STEPS - 1,
    )
    losses = np.float32(whole["losses"])
    want = np.float32([loss for loss, _ in expected])
    assert_close(losses, want, [loss for loss, _ in expected64], rtol=1e-5, name="losses")
    # this venv's onnxruntime (another version: its kernels round differently in the last bits) agrees;
    # two float32 runs of ours, neither the truth: rtol and the floor
    ours_here = TrainingSession(directory, backend="portable")
    ours_here.learning_rate = BASE_LR
    here = [float(ours_here.train_and_update(x, y)[0]) for _ in range(STEPS)]
    assert_close(np.float32(here), losses, rtol=1e-5, name="losses here against Python 3.13's")


def _torch_constant(
    theirs, options: dict, dtype: torch.dtype = torch.float32
) -> list[tuple[float, dict]]:
    """The torch run of :func:`_torch` with the learning rate held at ``BASE_LR``."""
    global lr_at
    changing = lr_at
    lr_at = lambda step: BASE_LR  # noqa: E731
    try:
        return _torch(theirs, options, dtype)
    finally:
        lr_at = changing

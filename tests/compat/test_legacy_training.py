"""The pre-1.15 API drop-in (onnxblocks.compat.legacy): a legacy program trains as torch.optim / ORT's kernels did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from support.legacy_program import CASES, STEPS, batch, legacy_program, lr_at, weights
from support.numerics import assert_close
from support.optim_family import step_magnitudes
from support.reference import Twice, twice

from onnxblocks.compat.legacy import TrainingParameters, TrainingSession
from onnxblocks.errors import InvalidValueError, UnknownNameError

NAMES = ("W1", "b1", "W2", "b2")
MAX_NORM = 1.0  # the legacy default max_norm_clip, with enable_grad_norm_clip on by default


def _forward(params: dict[str, torch.Tensor], step: int) -> torch.Tensor:
    x, y = (torch.tensor(a, dtype=params["W1"].dtype) for a in batch(step))
    pred = torch.relu(x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
    return ((pred - y) ** 2).mean()


def _lamb_numpy(params: dict[str, torch.Tensor], state: dict, lr: float, wd: float) -> None:
    """ORT's legacy LambOptimizer (lamb_impl.cu): defaults alpha .9, beta .999, eps 1e-6, no bias correction.

    NumPy in the parameters' dtype (the gradient norm in float64).
    """
    grads = {n: p.grad.numpy() for n, p in params.items()}
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    scale = max(1.0, norm / MAX_NORM)  # _ComputeGradScale: g / max(1, ||g|| / max_norm)
    for n, p in params.items():
        w = p.detach().numpy()
        real = w.dtype.type
        g = grads[n] / real(scale)
        m, v = state.setdefault(n, (np.zeros_like(w), np.zeros_like(w)))
        m = real(0.9) * m + real(0.1) * g
        v = real(0.999) * v + real(0.001) * g * g
        d = m / (np.sqrt(v) + real(1e-6)) + real(wd) * w
        w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(d)
        ratio = w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
        state[n] = (m, v)
        with torch.no_grad():
            p.copy_(torch.tensor(w - real(lr * ratio) * d))


def _reference(case: str, dtype: torch.dtype) -> tuple[list[float], list[dict[str, np.ndarray]]]:
    """torch.optim (or the NumPy Lamb) on the legacy program's model in ``dtype``: losses, parameters after each step."""
    optimizer_name, floats, _, accumulate = CASES[case]
    params = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in weights().items()}
    if optimizer_name == "AdamOptimizer" and floats.get(
        "lambda"
    ):  # mode 0: decoupled, as torch.optim.AdamW
        optimizer: torch.optim.Optimizer | None = torch.optim.AdamW(
            params.values(), lr=lr_at(0), eps=floats["epsilon"], weight_decay=floats["lambda"]
        )
    elif optimizer_name == "AdamOptimizer":
        optimizer = torch.optim.Adam(params.values(), lr=lr_at(0))
    elif optimizer_name == "SGDOptimizer":
        optimizer = torch.optim.SGD(params.values(), lr=lr_at(0))
    else:
        optimizer, lamb_state = None, {}
    losses, history = [], []
    for step in range(STEPS):
        loss = _forward(params, step)
        loss.backward()
        losses.append(float(loss.detach()))
        history.append({n: p.detach().numpy().copy() for n, p in params.items()})
        if (step + 1) % accumulate:
            continue
        if optimizer is None:
            _lamb_numpy(params, lamb_state, lr_at(step), floats["lambda"])
        else:
            if optimizer_name == "AdamOptimizer":
                torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            optimizer.step()
        history[-1] = {n: p.detach().numpy().copy() for n, p in params.items()}
        for p in params.values():
            p.grad = None
    return losses, history


def _check(case: str, losses, state) -> None:
    """The program's losses and final weights against the reference in float32 and float64 (support.numerics)."""
    (want_losses, want), (want_losses64, want64) = (
        _reference(case, torch.float32),
        _reference(case, torch.float64),
    )
    losses = np.float32(losses)
    assert_close(losses, np.float32(want_losses), want_losses64, rtol=1e-5, name=f"{case}: losses")
    for name in NAMES:
        scale = step_magnitudes(weights()[name], [params[name] for params in want64])[-1]
        assert_close(
            state[name],
            want[-1][name],
            want64[-1][name],
            rtol=1e-5,
            scale=scale,
            name=f"{case}: {name}",
        )


@pytest.fixture
def legacy_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXBLOCKS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("case", sorted(CASES))
def test_legacy_program_trains_as_torch_on_the_training_build(case, legacy_cache):
    losses, state, directory = legacy_program(case)
    assert Path(directory).parent == legacy_cache / "legacy-training"
    _check(case, losses, state)
    if case.startswith("adam"):
        steps = STEPS // CASES[case][3]
        assert all(
            int(state[f"Update_Count_{n}"][0]) == steps + 1 for n in NAMES
        )  # legacy: starts at 1
        assert state["Moment_1_W1"].shape == state["W1"].shape


def test_the_artifacts_are_cached_by_model_and_parameters(legacy_cache):
    first = legacy_program("sgd")
    stamp = (Path(first[2]) / "step_model.onnx").stat().st_mtime_ns
    again = legacy_program("sgd")  # same model and parameters: the cached artifacts, not rebuilt
    assert again[2] == first[2] and (Path(again[2]) / "step_model.onnx").stat().st_mtime_ns == stamp
    assert again[0] == first[0]
    other = legacy_program("adam")
    assert other[2] != first[2]
    assert sorted(p.name for p in (legacy_cache / "legacy-training").iterdir()) == sorted(
        [Path(first[2]).name, Path(other[2]).name]
    )  # no staging directory left behind


def test_legacy_program_trains_as_torch_on_stock_onnxruntime_313(portable_python, tmp_path):
    """All cases in one Python 3.13 run: artifacts built there (gradient worker), trained on stock onnxruntime."""
    from support.portable_env import ROOT, TESTS, cache_dir

    tag = f"py313-{os.getpid()}-{tmp_path.name}"  # new model bytes: the 3.13 session builds its own artifacts
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONNXBLOCKS_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]),
        ONNXBLOCKS_CACHE=str(cache_dir() / "gradient-worker"),
    )
    request = {"cases": sorted(CASES), "out": str(tmp_path), "tag": tag}
    done = subprocess.run(
        [str(portable_python), str(TESTS / "support" / "legacy_program.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    for directory in answer["directories"]:
        shutil.rmtree(directory, ignore_errors=True)  # keep the shared worker cache small
    assert answer["python"][:2] == [3, 13] and answer["training_build"] is False
    for case in sorted(CASES):
        with np.load(tmp_path / f"{case}.npz") as saved:
            _check(case, list(saved["losses"]), {n: saved[n] for n in NAMES})


def test_set_gradients_as_graph_outputs_fetches_the_gradients(legacy_cache):
    from support.legacy_program import mlp_with_loss

    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.training_optimizer_name = "SGDOptimizer"
    parameters.set_gradients_as_graph_outputs = True
    session = TrainingSession(mlp_with_loss().SerializeToString(), parameters)
    assert [o.name for o in session.get_outputs()] == [
        "loss",
        "pred",
        "W1_grad",
        "b1_grad",
        "W2_grad",
        "b2_grad",
    ]
    x, y = batch(0)
    loss, grad = session.run(
        ["loss", "W1_grad"], {"x": x, "y": y, "Learning_Rate": np.array([0.1], np.float32)}
    )

    def first_step(*tensors):
        params = dict(zip(weights(), tensors, strict=True))
        loss = _forward(params, 0)
        loss.backward()
        return loss, params["W1"].grad

    want = twice(first_step, *(torch.tensor(v, requires_grad=True) for v in weights().values()))
    want[0].check(loss, rtol=1e-6, name="loss")
    want[1].check(grad, rtol=1e-5, name="W1's gradient")
    # the step was applied: W1 moved by -lr * grad (the session's gradient, in float32 and float64)
    w1 = weights()["W1"]
    moved = Twice(w1 - np.float32(0.1) * grad, w1 - 0.1 * grad.astype(np.float64))
    moved.check(
        session.get_state()["W1"],
        rtol=1e-6,
        scale=np.abs(w1) + 0.1 * np.abs(grad),
        name="W1 after the step",
    )


def _adam_session() -> TrainingSession:
    from support.legacy_program import mlp_with_loss

    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.training_optimizer_name = "AdamOptimizer"
    return TrainingSession(mlp_with_loss().SerializeToString(), parameters)


def _feeds(step: int) -> dict[str, np.ndarray]:
    x, y = batch(step)
    return {"x": x, "y": y, "Learning_Rate": np.array([lr_at(step)], np.float32)}


def test_get_state_then_load_state_resumes_bit_exact(legacy_cache):
    whole = _adam_session()
    for step in range(6):
        whole.run(None, _feeds(step))
    state = whole.get_state()
    assert set(whole.get_optimizer_state()) == set(NAMES)
    resumed = _adam_session()  # a fresh session: initial weights, no moments
    resumed.load_state(state, strict=True)
    for name, value in state.items():
        np.testing.assert_array_equal(resumed.get_state()[name], value, err_msg=name)
    for step in range(6, 10):
        want = whole.run(["loss"], _feeds(step))[0]
        assert resumed.run(["loss"], _feeds(step))[0] == want
    for name, value in whole.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value, err_msg=name)


def test_load_state_and_run_check_names(legacy_cache):
    session = _adam_session()
    state = {n: v + 1.0 for n, v in weights().items()}
    session.load_state(state)  # weights only: the moments stay
    for name in NAMES:
        np.testing.assert_array_equal(session.get_state()[name], state[name])
    with pytest.raises(UnknownNameError, match="missing entry 'Moment_1_W1'"):
        session.load_state(state, strict=True)
    with pytest.raises(UnknownNameError, match="'nope'"):
        session.load_state({**state, "nope": np.zeros(1)})
    with pytest.raises(InvalidValueError, match="'W1' has shape"):
        session.load_state({"W1": np.zeros(3)})
    with pytest.raises(UnknownNameError, match="Learning_Rate"):
        session.run(None, {"x": batch(0)[0], "y": batch(0)[1]})
    with pytest.raises(UnknownNameError, match="'z'"):
        session.run(["z"], _feeds(0))
    with pytest.raises(UnknownNameError, match="lacks the input 'y'"):
        session.run(None, {"x": batch(0)[0], "Learning_Rate": np.array([0.1], np.float32)})


def test_weights_to_train_and_immutable_weights_choose_what_trains(legacy_cache):
    from support.legacy_program import mlp_with_loss

    data = mlp_with_loss().SerializeToString()
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.weights_not_to_train = {"b1"}
    parameters.immutable_weights = {
        "Add": [(1, 0.0)]
    }  # b2: one element, 0.0, the second input of an Add
    session = TrainingSession(data, parameters)
    assert sorted(session.get_model_state()["full_precision"]) == ["W1", "W2"]
    session.run(None, _feeds(0))
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.weights_to_train = {"W2", "b2"}
    session = TrainingSession(data, parameters)
    assert sorted(session.get_model_state()["full_precision"]) == ["W2", "b2"]
    parameters.weights_to_train = {"W3"}
    with pytest.raises(UnknownNameError, match="'W3'.*float initializers: W1, b1, W2, b2"):
        TrainingSession(data, parameters)


def test_parameters_refuse_distributed_fields_and_unknown_names():
    parameters = TrainingParameters()
    parameters.world_size = 1  # the default is accepted
    with pytest.raises(InvalidValueError, match="world_size.*distributed"):
        parameters.world_size = 2
    with pytest.raises(InvalidValueError, match="use_mixed_precision"):
        parameters.use_mixed_precision = True
    with pytest.raises(InvalidValueError, match="deepspeed_zero_stage"):
        parameters.deepspeed_zero_stage = 1
    with pytest.raises(UnknownNameError, match="loss_output_nam'.*loss_output_name"):
        parameters.loss_output_nam = "loss"


def test_optimizer_attributes_are_checked(legacy_cache):
    from support.legacy_program import mlp_with_loss

    data = mlp_with_loss().SerializeToString()
    cases = [
        ("AdamOptimizer", {"W1": {"alpah": 0.9}}, {}, UnknownNameError, "'alpah'.*alpha"),
        (
            "AdamOptimizer",
            {},
            {n: {"do_bias_correction": 0} for n in NAMES},
            InvalidValueError,
            "do_bias_correction=0",
        ),
        (
            "LambOptimizer",
            {n: {"ratio_max": 10.0} for n in NAMES},
            {},
            InvalidValueError,
            "ratio_min/ratio_max",
        ),
        ("AdamOptimizer", {"W1": {"alpha": 0.8}}, {}, InvalidValueError, "differ"),
        (
            "MomentumOptimizer",
            {},
            {},
            InvalidValueError,
            "AdamOptimizer, LambOptimizer, SGDOptimizer",
        ),
        ("SGDOptimizer", {"W9": {}}, {}, UnknownNameError, "'W9'"),
    ]
    for name, floats, ints, error, match in cases:
        parameters = TrainingParameters()
        parameters.loss_output_name = "loss"
        parameters.training_optimizer_name = name
        parameters.optimizer_attributes_map = floats
        parameters.optimizer_int_attributes_map = ints
        with pytest.raises(error, match=match):
            TrainingSession(data, parameters)
    parameters = TrainingParameters()
    parameters.loss_output_name = "los"
    with pytest.raises(UnknownNameError, match="'los'.*loss"):
        TrainingSession(data, parameters)
    assert not (legacy_cache / "legacy-training").exists() or not any(
        (legacy_cache / "legacy-training").iterdir()
    )


@pytest.mark.parametrize("bias", [1, 0])
def test_adam_weight_decay_mode_1_follows_the_legacy_kernel(bias, legacy_cache):
    """weight_decay_mode=1 against adam_impl.cu's mode-1 formula in NumPy (Hugging Face AdamW)."""
    from support.legacy_program import mlp_with_loss

    wd, eps = (
        0.05,
        1e-3,
    )  # a larger eps: without bias correction tiny gradients make m / (sqrt(v) + eps) sign-like
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.training_optimizer_name = "AdamOptimizer"
    parameters.enable_grad_norm_clip = False
    parameters.optimizer_attributes_map = {n: {"lambda": wd, "epsilon": eps} for n in NAMES}
    parameters.optimizer_int_attributes_map = {
        n: {"weight_decay_mode": 1, "do_bias_correction": bias} for n in NAMES
    }
    session = TrainingSession(mlp_with_loss().SerializeToString(), parameters)
    got = [session.run(["loss"], _feeds(step))[0] for step in range(8)]
    (losses, history, _), (losses64, history64, scales) = (
        _adam_mode_1(bias, wd, eps, dtype) for dtype in (np.float32, np.float64)
    )
    loss_scale = scales.pop("loss")
    assert_close(
        np.float32(got), np.float32(losses), losses64, rtol=1e-5, scale=loss_scale, name="losses"
    )
    state = session.get_state()
    for name in NAMES:
        assert_close(
            state[name],
            history[-1][name],
            history64[-1][name],
            rtol=1e-5,
            scale=scales[name],
            name=name,
        )


def _adam_mode_1(
    bias: int, wd: float, eps: float, dtype: type
) -> tuple[list[float], list[dict], dict]:
    """adam_impl.cu's mode-1 formula (Hugging Face AdamW) in NumPy in ``dtype`` on torch's gradients in ``dtype``:
    the loss at each of 8 steps, the weights after each, and each weight's floor ``scale`` (and the losses').

    A weight's scale is its start plus the updates it summed, plus what a rounding of its gradient moves it by:
    without bias correction a step moves a weight by up to 3.16 * lr (|m| / sqrt(v) with m, v fresh), so a
    gradient near zero, rounded by ``eps32 * sum |terms|`` in another order (ONNX Runtime's backward against
    torch's autograd), moves the step by ``lr * sqrt(c2) / c1 / (sqrt(v) + eps)`` times that rounding. A loss's
    scale is its value plus ``sum |dloss/dw| * scale(w)`` over the weights it was computed from.
    """
    real = np.dtype(dtype).type
    params = {n: torch.tensor(v.astype(dtype), requires_grad=True) for n, v in weights().items()}
    moments = {n: (np.zeros_like(v, dtype), np.zeros_like(v, dtype)) for n, v in weights().items()}
    scales = {n: np.abs(v.astype(np.float64)) for n, v in weights().items()}
    terms = {n: np.zeros(v.shape) for n, v in weights().items()}
    losses, history, loss_scales = [], [], []
    for step in range(8):
        terms = {n: np.maximum(terms[n], t) for n, t in _gradient_terms(params, step).items()}
        loss = _forward(params, step)
        loss.backward()
        losses.append(float(loss.detach()))
        spread = sum(float(np.sum(np.abs(p.grad.numpy()) * scales[n])) for n, p in params.items())
        loss_scales.append(abs(losses[-1]) + spread)
        lr, t = lr_at(step), step + 1
        c1, c2 = (1 - 0.9**t, 1 - 0.999**t) if bias else (1.0, 1.0)
        for n, p in params.items():
            w, g = p.detach().numpy(), p.grad.numpy()
            m, v = moments[n]
            m, v = real(0.9) * m + real(0.1) * g, real(0.999) * v + real(0.001) * g * g
            moments[n] = (m, v)
            rate = lr * np.sqrt(c2) / c1
            updated = w - real(rate) * m / (np.sqrt(v) + real(eps))
            updated = updated - real(lr * wd) * updated
            scales[n] = scales[n] + np.abs(updated - w) + rate / (np.sqrt(v) + eps) * terms[n]
            with torch.no_grad():
                p.copy_(torch.from_numpy(updated))
            p.grad = None
        history.append({n: p.detach().numpy().copy() for n, p in params.items()})
    return losses, history, {**scales, "loss": np.array(loss_scales)}


def _gradient_terms(params: dict[str, torch.Tensor], step: int) -> dict[str, np.ndarray]:
    """Per weight, the sum of ``|terms|`` its gradient adds up (float64): ``|x|^T |dh|`` for a MatMul's weight,
    ``sum |dh|`` for a bias, ``dh`` the gradient at the layer's output."""
    p = {n: t.detach().double() for n, t in params.items()}
    x, y = (torch.tensor(a, dtype=torch.float64) for a in batch(step))
    h = (x @ p["W1"] + p["b1"]).requires_grad_()
    r = torch.relu(h)
    pred = r @ p["W2"] + p["b2"]
    dh, dpred = torch.autograd.grad(((pred - y) ** 2).mean(), [h, pred])
    terms = {
        "W1": x.abs().T @ dh.abs(),
        "b1": dh.abs().sum(0),
        "W2": r.abs().T @ dpred.abs(),
        "b2": dpred.abs().sum(0),
    }
    return {n: t.detach().numpy() for n, t in terms.items()}

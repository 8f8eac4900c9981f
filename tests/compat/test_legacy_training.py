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

from onnxblocks.compat.legacy import TrainingParameters, TrainingSession
from onnxblocks.errors import InvalidValueError, UnknownNameError

NAMES = ("W1", "b1", "W2", "b2")
MAX_NORM = 1.0  # the legacy default max_norm_clip, with enable_grad_norm_clip on by default


def _forward(params: dict[str, torch.Tensor], step: int) -> torch.Tensor:
    x, y = (torch.tensor(a) for a in batch(step))
    pred = torch.relu(x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
    return ((pred - y) ** 2).mean()


def _lamb_numpy(params: dict[str, torch.Tensor], state: dict, lr: float, wd: float) -> None:
    """ORT's legacy LambOptimizer (lamb_impl.cu): defaults alpha .9, beta .999, eps 1e-6, no bias correction."""
    grads = {n: p.grad.numpy().astype(np.float32) for n, p in params.items()}
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    scale = max(1.0, norm / MAX_NORM)  # _ComputeGradScale: g / max(1, ||g|| / max_norm)
    for n, p in params.items():
        w = p.detach().numpy()
        g = grads[n] / np.float32(scale)
        m, v = state.setdefault(n, (np.zeros_like(w), np.zeros_like(w)))
        m = np.float32(0.9) * m + np.float32(0.1) * g
        v = np.float32(0.999) * v + np.float32(0.001) * g * g
        d = m / (np.sqrt(v) + np.float32(1e-6)) + np.float32(wd) * w
        w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(d)
        ratio = w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
        state[n] = (m, v)
        with torch.no_grad():
            p.copy_(torch.tensor(w - np.float32(lr * ratio) * d))


def _reference(case: str) -> tuple[list[float], dict[str, np.ndarray]]:
    optimizer_name, floats, _, accumulate = CASES[case]
    params = {n: torch.tensor(v, requires_grad=True) for n, v in weights().items()}
    if optimizer_name == "AdamOptimizer" and floats.get("lambda"):  # mode 0: decoupled, as torch.optim.AdamW
        optimizer: torch.optim.Optimizer | None = torch.optim.AdamW(
            params.values(), lr=lr_at(0), eps=floats["epsilon"], weight_decay=floats["lambda"]
        )
    elif optimizer_name == "AdamOptimizer":
        optimizer = torch.optim.Adam(params.values(), lr=lr_at(0))
    elif optimizer_name == "SGDOptimizer":
        optimizer = torch.optim.SGD(params.values(), lr=lr_at(0))
    else:
        optimizer, lamb_state = None, {}
    losses = []
    for step in range(STEPS):
        loss = _forward(params, step)
        loss.backward()
        losses.append(float(loss.detach()))
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
        for p in params.values():
            p.grad = None
    return losses, {n: p.detach().numpy() for n, p in params.items()}


def _check(case: str, losses, state) -> None:
    want_losses, want = _reference(case)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-7, err_msg=f"{case}: losses")
    for name in NAMES:
        np.testing.assert_allclose(state[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{case}: {name}")


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
        assert all(int(state[f"Update_Count_{n}"][0]) == steps + 1 for n in NAMES)  # legacy: starts at 1
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
        PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), ONNXBLOCKS_CACHE=str(cache_dir() / "gradient-worker")
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
    assert [o.name for o in session.get_outputs()] == ["loss", "pred", "W1_grad", "b1_grad", "W2_grad", "b2_grad"]
    x, y = batch(0)
    loss, grad = session.run(["loss", "W1_grad"], {"x": x, "y": y, "Learning_Rate": np.array([0.1], np.float32)})
    params = {n: torch.tensor(v, requires_grad=True) for n, v in weights().items()}
    want = _forward(params, 0)
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-6)
    np.testing.assert_allclose(grad, params["W1"].grad.numpy(), rtol=1e-5, atol=1e-7)
    # the step was applied: W1 moved by -lr * grad
    np.testing.assert_allclose(session.get_state()["W1"], weights()["W1"] - 0.1 * grad, rtol=1e-6, atol=1e-7)


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
    parameters.immutable_weights = {"Add": [(1, 0.0)]}  # b2: one element, 0.0, the second input of an Add
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
        ("AdamOptimizer", {}, {n: {"do_bias_correction": 0} for n in NAMES}, InvalidValueError, "do_bias_correction=0"),
        ("LambOptimizer", {n: {"ratio_max": 10.0} for n in NAMES}, {}, InvalidValueError, "ratio_min/ratio_max"),
        ("AdamOptimizer", {"W1": {"alpha": 0.8}}, {}, InvalidValueError, "differ"),
        ("MomentumOptimizer", {}, {}, InvalidValueError, "AdamOptimizer, LambOptimizer, SGDOptimizer"),
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
    assert not (legacy_cache / "legacy-training").exists() or not any((legacy_cache / "legacy-training").iterdir())


@pytest.mark.parametrize("bias", [1, 0])
def test_adam_weight_decay_mode_1_follows_the_legacy_kernel(bias, legacy_cache):
    """weight_decay_mode=1 against adam_impl.cu's mode-1 formula in NumPy (Hugging Face AdamW)."""
    from support.legacy_program import mlp_with_loss

    wd, eps = 0.05, 1e-3  # a larger eps: without bias correction tiny gradients make m / (sqrt(v) + eps) sign-like
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.training_optimizer_name = "AdamOptimizer"
    parameters.enable_grad_norm_clip = False
    parameters.optimizer_attributes_map = {n: {"lambda": wd, "epsilon": eps} for n in NAMES}
    parameters.optimizer_int_attributes_map = {n: {"weight_decay_mode": 1, "do_bias_correction": bias} for n in NAMES}
    session = TrainingSession(mlp_with_loss().SerializeToString(), parameters)
    params = {n: torch.tensor(v, requires_grad=True) for n, v in weights().items()}
    moments = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in weights().items()}
    for step in range(8):
        got = session.run(["loss"], _feeds(step))[0]
        loss = _forward(params, step)
        loss.backward()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-5, err_msg=f"step {step}")
        lr, t = lr_at(step), step + 1
        c1, c2 = (1 - 0.9**t, 1 - 0.999**t) if bias else (1.0, 1.0)
        for n, p in params.items():
            w, g = p.detach().numpy().astype(np.float64), p.grad.numpy().astype(np.float64)
            m, v = moments[n]
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
            moments[n] = (m, v)
            step_size = lr * np.sqrt(c2) / c1
            updated = w - step_size * m / (np.sqrt(v) + eps)
            with torch.no_grad():
                p.copy_(torch.tensor((updated - lr * wd * updated).astype(np.float32)))
            p.grad = None
    state = session.get_state()
    # without bias correction each step moves a weight by up to 3.16 * lr (|m| / sqrt(v) with m, v fresh), so the
    # float32 rounding of near-zero gradients shows at ~1e-5 of that step: atol scales with it
    atol = 1e-6 if bias else 1e-5
    for name in NAMES:
        np.testing.assert_allclose(state[name], params[name].detach().numpy(), rtol=1e-5, atol=atol, err_msg=name)

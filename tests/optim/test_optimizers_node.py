"""The torch.optim family in Node (onnxruntime-node, the JavaScript client) against torch and Python.

Every cell of ``tests/optim/test_torch_family.py`` (SGD with momentum, dampening,
Nesterov, weight decay and maximize; Adam and AdamW with amsgrad; Adagrad; RMSprop
with momentum and centered) and Lamb's three option sets train an MLP for 20 steps
in Node from portable artifacts (the fused step), with two parameter groups (the
second at 2.5 x the learning rate with its own weight decay) and a learning rate
that changes every step (the plan's ``learning_rates``, one rate per step, as the
``onnxblocks-train`` CLI reads them). Each family has its own base learning rate
(``BASE_LR``), low enough that 20 float32 steps of the ReLU MLP do not amplify
rounding (RMSprop and Adam at torch's usual 0.01 do: the portable run in Python
then leaves rtol 1e-5 of torch too). For each cell:

* the losses and the final parameters match torch.optim's (Lamb: a NumPy reference
  of the paper's equations on torch's gradients) by ``support.numerics.assert_close``:
  rtol 1e-5 of the float32 run, or within the rounding of the float32 run against the
  same run in float64, plus a floor of the magnitude of the updates each parameter summed;
* they stay within rtol 2e-7 of the portable backend's run in Python on the same
  artifacts, plus the floor (onnxruntime-node 1.30 and onnxruntime 1.19.2 round an ulp
  differently now and then; the largest gap measured is 2.5e-7, RMSprop momentum 0.9).

All cells run in one Node process (tests/support/node_train_runs.mjs). Three of them
also check the state Node saves: it declares the optimizer's state tensors, loads
back into Python, round-trips exactly and resumes the uninterrupted run's step 21.

Needs Node and the client's npm packages (tests/support/web_support.py); fails, never skips, without them.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from onnx import numpy_helper
from support import web_support
from support.numerics import assert_close
from support.optim_family import CASES, case_id, ours, set_lr, step_magnitudes, theirs
from support.runtime_support import PARAMS, classification_data, mlp_model

from onnxblocks import artifacts, optim
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import read_state, state_to_checkpoint, write_safetensors, write_state

STEPS = 20
#: each family's base learning rate: small enough that 20 float32 steps of the MLP stay far from chaos
BASE_LR = {
    "SGD": 0.02,
    "Adagrad": 0.01,
    "Adam": 0.005,
    "AdamW": 0.005,
    "Lamb": 0.01,
    "RMSprop": 0.002,
}
SECOND = ["fc1.bias", "fc2.weight"]
FIRST = [n for n in PARAMS if n not in SECOND]
LAMB = [{}, {"bias_correction": False}, {"weight_decay": 0.01, "betas": (0.8, 0.99), "eps": 1e-4}]
CELLS: dict[str, tuple[type, Any, dict[str, Any]]] = {case_id(c): c for c in CASES}
CELLS |= {case_id((optim.Lamb, None, o)): (optim.Lamb, None, o) for o in LAMB}
#: cells whose saved state is also resumed in Python (one, three and three state tensors per parameter)
RESUMED = {
    "SGD-momentum=0.9-nesterov=True": 1,
    "AdamW-amsgrad=True": 3,
    "RMSprop-centered=True-momentum=0.5-weight_decay=0.1": 3,
}


def lr_at(cls: type, step: int) -> float:
    return BASE_LR[cls.__name__] * (1.0 + 0.5 * math.sin(step))


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    return [classification_data(rows=16, d_in=3, seed=10 + i) for i in range(STEPS + 1)]


def _model():
    return mlp_model(d_in=3, hidden=8)


@pytest.fixture(scope="module")
def node_runs(tmp_path_factory) -> dict[str, tuple[Path, dict, Path]]:
    """Every cell's artifacts, trained in Node in one process: name -> (artifacts, report, saved state)."""
    root = tmp_path_factory.mktemp("optim-node")
    try:
        js = web_support.workspace(root / "client")
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))
    shutil.copyfile(
        Path(__file__).parents[1] / "support" / "node_train_runs.mjs", js / "node_train_runs.mjs"
    )
    batches = _batches()
    train = {
        f"train/{i}/{n}": v
        for i, b in enumerate(batches[:STEPS])
        for n, v in zip(("x", "labels"), b, strict=True)
    }
    for family in {cls for cls, _, _ in CELLS.values()}:  # one plan per family: its learning rates
        rates = {"learning_rates": json.dumps([lr_at(family, s) for s in range(STEPS)])}
        write_safetensors(root / f"{family.__name__}.plan", train, rates)
    manifest = []
    for name, (cls, _, options) in CELLS.items():
        directory = root / name
        artifacts.generate_artifacts(
            _model(),
            requires_grad=PARAMS,
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=ours(cls, options, BASE_LR[cls.__name__], SECOND),
            artifact_directory=directory,
            portable=True,
        )
        write_state(directory)
        manifest.append(
            {
                "name": name,
                "directory": str(directory),
                "plan": str(root / f"{cls.__name__}.plan"),
                "save": str(root / f"{name}.st"),
            }
        )
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = web_support.run_node(js, "node_train_runs.mjs", str(root / "manifest.json"))
    return {e["name"]: (Path(e["directory"]), report[e["name"]], Path(e["save"])) for e in manifest}


def _torch_step(
    params: dict[str, torch.nn.Parameter], x: np.ndarray, y: np.ndarray
) -> torch.Tensor:
    x = torch.from_numpy(x).to(params["fc1.weight"].dtype)  # float64 for the float64 reference
    h = torch.relu(x @ params["fc1.weight"] + params["fc1.bias"])
    logits = h @ params["fc2.weight"] + params["fc2.bias"]
    return torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))


def _initial() -> dict[str, np.ndarray]:
    init = {i.name: numpy_helper.to_array(i).copy() for i in _model().graph.initializer}
    return {n: init[n] for n in PARAMS}


#: a reference run: the loss at each step and the parameters after each step
Run = tuple[list[float], list[dict[str, np.ndarray]]]


def _torch(
    cls: type, reference: Any, options: dict[str, Any], dtype: torch.dtype = torch.float32
) -> Run:
    params = {n: torch.nn.Parameter(torch.from_numpy(v).to(dtype)) for n, v in _initial().items()}
    lr = BASE_LR[cls.__name__]
    opt = theirs(reference, options, lr, [params[n] for n in FIRST], [params[n] for n in SECOND])
    losses, history = [], []
    for step, (x, y) in enumerate(_batches()[:STEPS]):
        set_lr(opt, lr_at(cls, step))
        opt.zero_grad()
        loss = _torch_step(params, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        history.append({n: p.detach().numpy().copy() for n, p in params.items()})
    return losses, history


def _lamb(options: dict[str, Any], dtype: type = np.float32) -> Run:
    """Lamb (You et al., 2019, Algorithm 2) in float64 NumPy on torch's gradients of the model in ``dtype``."""
    beta1, beta2 = options.get("betas", (0.9, 0.999))
    eps, correct = options.get("eps", 1e-6), options.get("bias_correction", True)
    params = {n: v.astype(np.float64) for n, v in _initial().items()}
    m = {n: np.zeros_like(v) for n, v in params.items()}
    v = {n: np.zeros_like(p) for n, p in params.items()}
    losses, history = [], []
    for step, (x, y) in enumerate(_batches()[:STEPS]):
        t = step + 1
        tensors = {n: torch.tensor(p.astype(dtype), requires_grad=True) for n, p in params.items()}
        loss = _torch_step(tensors, x, y)  # type: ignore[arg-type]
        loss.backward()
        losses.append(float(loss.detach()))
        for n in PARAMS:
            g = tensors[n].grad.numpy().astype(np.float64)  # type: ignore[union-attr]
            second = n in SECOND
            lr = float(np.float32(lr_at(optim.Lamb, step))) * (2.5 if second else 1.0)
            decay = 0.03 if second else options.get("weight_decay", 0.0)
            m[n] = beta1 * m[n] + (1 - beta1) * g
            v[n] = beta2 * v[n] + (1 - beta2) * g * g
            m_hat, v_hat = (
                (m[n] / (1 - beta1**t), v[n] / (1 - beta2**t)) if correct else (m[n], v[n])
            )
            u = m_hat / (np.sqrt(v_hat) + eps) + decay * params[n]
            w_norm, u_norm = np.linalg.norm(params[n]), np.linalg.norm(u)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[n] = params[n] - lr * ratio * u
        history.append(dict(params))
    return losses, history


def _python(directory: Path, cls: type, steps: int) -> tuple[list[float], dict[str, np.ndarray]]:
    session = TrainingSession(directory)
    losses = []
    for step, batch in enumerate(_batches()[:steps]):
        session.learning_rate = lr_at(cls, step)
        losses.append(float(session.train_and_update(*batch)[0]))
    return losses, session.parameters(trainable_only=True)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_node_matches_torch_with_two_groups_and_a_changing_lr(node_runs, cell) -> None:
    directory, report, saved = node_runs[cell]
    cls, reference, options = CELLS[cell]
    if cls is optim.Lamb:
        (want_losses, want), (want_losses64, want64) = _lamb(options), _lamb(options, np.float64)
    else:
        want_losses, want = _torch(cls, reference, options)
        want_losses64, want64 = _torch(cls, reference, options, torch.float64)
    node_params = read_state(saved).trainable
    assert report["step"] == STEPS
    losses = np.array(report["losses"], np.float32)
    assert_close(losses, np.float32(want_losses), want_losses64, rtol=1e-5, name=f"{cell} losses")
    for n in PARAMS:
        scale = step_magnitudes(_initial()[n], [params[n] for params in want64])[-1]
        assert_close(
            node_params[n], want[-1][n], want64[-1][n], rtol=1e-5, scale=scale, name=f"{cell} {n}"
        )
    python_losses, python_params = _python(directory, cls, STEPS)
    # Node against Python: two float32 runs of ours, neither the truth; rtol 2e-7 plus the floor
    assert_close(losses, np.float32(python_losses), rtol=2e-7, name=f"{cell} losses vs Python")
    for n in PARAMS:
        scale = step_magnitudes(_initial()[n], [params[n] for params in want64])[-1]
        assert_close(
            node_params[n], python_params[n], rtol=2e-7, scale=scale, name=f"{cell} {n} vs Python"
        )


@pytest.mark.parametrize("cell", sorted(RESUMED))
def test_node_state_carries_the_optimizer_state_and_resumes(node_runs, cell, tmp_path) -> None:
    directory, _, saved = node_runs[cell]
    state = read_state(saved)
    assert state.states == RESUMED[cell] and all(
        len(m) == RESUMED[cell] for m in state.moments.values()
    )
    resumed = TrainingSession(directory, checkpoint=state_to_checkpoint(saved, tmp_path / "ck"))
    assert int(resumed.step) == STEPS
    resumed.save_checkpoint(tmp_path / "again")
    again = load_checkpoint(tmp_path / "again").optimizer_state["group0"]["moments"]
    for name, moments in state.moments.items():  # the state round-trips exactly
        for kept, back in zip(moments, again[name], strict=True):
            np.testing.assert_array_equal(kept, back)
    cls = CELLS[cell][0]
    resumed.learning_rate = lr_at(cls, STEPS)
    python = TrainingSession(directory)
    for step, batch in enumerate(_batches()):
        python.learning_rate = lr_at(cls, step)
        last = float(python.train_and_update(*batch)[0])
    resumed_loss = np.float32(resumed.train_and_update(*_batches()[STEPS])[0])
    assert_close(resumed_loss, np.float32(last), rtol=1e-5, name="resumed step 21's loss")

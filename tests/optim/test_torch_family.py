"""The torch.optim family in standard ops (onnxblocks.optim.standard) against torch.optim itself.

For each algorithm and each option, the optimizer model (its standard-op sequence
form) runs 20 steps on four parameters in two parameter groups (the second with
its own absolute ``lr`` and ``weight_decay``) under a changing learning rate, fed
the same random gradients as ``torch.optim``; parameters and every state tensor
match torch's after each step by ``support.numerics.assert_close``: within rtol 1e-5
of torch in float32, or within the rounding torch's float32 run has against the same
run in float64, plus a floor of the magnitude of the updates each value has summed.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from support.numerics import assert_close
from support.optim_family import CASES, step_magnitudes

import onnxblocks
from onnxblocks import optim
from onnxblocks._core.ort import onnxruntime
from onnxblocks.errors import InvalidValueError, UnknownNameError
from onnxblocks.portable.optimizer import read_optimizer

SHAPES = {"fc1.weight": (3, 4), "fc1.bias": (4,), "fc2.weight": (4, 2), "norm.weight": (2,)}
STEPS = 20
BASE_LR = 0.01


def lr_at(step: int) -> float:
    return BASE_LR * (1.0 + 0.5 * math.sin(step))


def initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def gradients(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


SECOND = ["fc1.bias", "norm.weight"]


def _ours(cls, options: dict) -> optim.Optimizer:
    groups = [{"params": SECOND, "lr": 2.5 * BASE_LR, "weight_decay": 0.03}]
    if cls is optim.SGD and options.get("nesterov"):
        groups[0]["weight_decay"] = 0.03
    return cls(lr=BASE_LR, param_groups=groups, **options)


def _model(block) -> onnx.ModelProto:
    trainable = [onnx.numpy_helper.from_array(v, n) for n, v in initial().items()]
    with onnxblocks.empty_base():
        block((trainable, []))
    return block.to_model_proto()


def _ours_run(model: onnx.ModelProto) -> tuple:
    """The optimizer model's spec, and its parameters and states after each of the steps, fed as
    the session feeds it (``lr_at``, the step count, ``gradients``) from :func:`initial`."""
    spec = read_optimizer(model)
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = list(SHAPES)
    params = [initial()[n] for n in names]
    states = [[np.zeros_like(p) for p in params] for _ in spec.states]
    history = []
    for step in range(STEPS):
        feeds = {
            "learning_rate": np.array([lr_at(step)], np.float32),
            "step": np.array([step + 1], np.int64),
        }
        feeds |= {"params": params, "gradients": [gradients(step)[n] for n in names]}
        feeds |= dict(zip(spec.state_inputs, states, strict=True))
        params, *states = session.run(None, feeds)
        history.append((params, states))
    return spec, history


def _torch_run(cls, options: dict, dtype: torch.dtype = torch.float32):
    """torch's parameters and states after each step, run in ``dtype`` from the same float32 inputs."""
    params = {
        n: torch.nn.Parameter(torch.from_numpy(v.copy()).to(dtype)) for n, v in initial().items()
    }
    first = [params[n] for n in SHAPES if n not in SECOND]
    second = [params[n] for n in SECOND]
    opt = cls(
        [{"params": first}, {"params": second, "lr": 2.5 * BASE_LR, "weight_decay": 0.03}],
        lr=BASE_LR,
        **options,
    )
    history = []
    for step in range(STEPS):
        for group, scale in zip(opt.param_groups, (1.0, 2.5), strict=True):
            group["lr"] = (
                float(np.float32(lr_at(step))) * scale
            )  # the session's learning rate is a float32
        for n, g in gradients(step).items():
            params[n].grad = torch.from_numpy(g).to(dtype)
        opt.step()
        states = {
            n: {k: v.numpy().copy() for k, v in opt.state[params[n]].items() if k != "step"}
            for n in SHAPES
        }
        history.append(({n: p.detach().numpy().copy() for n, p in params.items()}, states))
    return history


@pytest.mark.parametrize(
    ("ours", "theirs", "options"), CASES, ids=lambda c: getattr(c, "__name__", None) or str(c)
)
def test_matches_torch_over_twenty_steps_with_two_groups(ours, theirs, options) -> None:
    spec, history = _ours_run(_model(_ours(ours, options)))
    names = list(SHAPES)
    expected = _torch_run(theirs, options)
    expected64 = _torch_run(theirs, options, torch.float64)
    scales = _scales(expected64)
    for step, (params, states) in enumerate(history):
        (want_params, want_states), (want64, want_states64) = expected[step], expected64[step]
        for i, n in enumerate(names):
            assert_close(
                params[i],
                want_params[n],
                want64[n],
                rtol=1e-5,
                scale=scales[n][step],
                name=f"{n} step {step + 1}",
            )
            for slot, values in zip(spec.states, states, strict=True):
                if slot in want_states[n]:  # torch keeps no buffer a group does not use
                    assert_close(
                        values[i],
                        want_states[n][slot],
                        want_states64[n][slot],
                        rtol=1e-5,
                        scale=scales[n, slot][step],
                        name=f"{n} {slot} step {step + 1}",
                    )


def _scales(history64) -> dict:
    """Each parameter's and state's summed update magnitude after each step (the floor's ``scale``)."""
    start = initial()
    scales: dict = {
        n: step_magnitudes(start[n], [params[n] for params, _ in history64]) for n in SHAPES
    }
    for n in SHAPES:
        for slot in history64[-1][1][n]:
            values = [states[n][slot] for _, states in history64]
            scales[n, slot] = step_magnitudes(np.zeros_like(values[0]), values)
    return scales


def test_no_decay_helper_takes_biases_and_one_dimensional_weights() -> None:
    spec = optim.AdamW(param_groups=optim.no_decay_norm_bias()).standard.spec(
        [onnx.numpy_helper.from_array(v, n) for n, v in initial().items()], onnx.TensorProto.FLOAT
    )
    groups = dict(spec.params)
    assert groups == {"fc1.weight": 0, "fc1.bias": 1, "fc2.weight": 0, "norm.weight": 1}
    assert (
        spec.groups[1]["hyper"]["weight_decay"] == 0.0
        and spec.groups[0]["hyper"]["weight_decay"] == 0.01
    )


def test_bad_groups_and_hyperparameters_are_refused_by_name() -> None:
    with pytest.raises(UnknownNameError, match="fc3.bias"):
        _model(optim.SGD(momentum=0.9, param_groups=[{"params": ["fc3.bias"]}]))
    with pytest.raises(InvalidValueError, match="one group"):
        _model(optim.Adam(param_groups=[{"params": ["fc1.bias"]}, {"params": ["fc1.bias"]}]))
    with pytest.raises(UnknownNameError, match="momentum"):
        optim.Adam(param_groups=[{"params": ["fc1.bias"], "momentum": 0.9}])
    with pytest.raises(InvalidValueError, match="nesterov"):
        optim.SGD(nesterov=True)
    with pytest.raises(InvalidValueError, match="momentum"):
        optim.SGD(momentum=-0.1)
    with pytest.raises(InvalidValueError, match="mode='torch'"):
        optim.AdamW(mode="hf", amsgrad=True)


def test_global_then_per_group_gradient_clipping_matches_torch() -> None:
    groups = [{"params": SECOND, "lr": 2.5 * BASE_LR, "weight_decay": 0.03, "max_grad_norm": 0.5}]
    model = _model(optim.SGD(lr=BASE_LR, momentum=0.9, clip_grad=2.0, param_groups=groups))
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = list(SHAPES)
    params, buffers = (
        [initial()[n] for n in names],
        [np.zeros(s, np.float32) for s in SHAPES.values()],
    )
    expected, expected64 = _torch_clipped_run(torch.float32), _torch_clipped_run(torch.float64)
    scales = {n: step_magnitudes(initial()[n], [e[n] for e in expected64]) for n in names}
    for step in range(STEPS):
        grads = gradients(step)
        feeds = {
            "learning_rate": np.array([lr_at(step)], np.float32),
            "step": np.array([step + 1], np.int64),
        }
        feeds |= {
            "params": params,
            "gradients": [grads[n] for n in names],
            "first_order_moments": buffers,
        }
        params, buffers = session.run(None, feeds)
        for i, n in enumerate(names):
            assert_close(
                params[i],
                expected[step][n],
                expected64[step][n],
                rtol=1e-5,
                scale=scales[n][step],
                name=f"{n} step {step + 1}",
            )


def _torch_clipped_run(dtype: torch.dtype) -> list[dict[str, np.ndarray]]:
    """torch SGD with momentum after a global then a second-group clip, in ``dtype``: parameters after each step."""
    names = list(SHAPES)
    torch_params = {
        n: torch.nn.Parameter(torch.from_numpy(v.copy()).to(dtype)) for n, v in initial().items()
    }
    first = [torch_params[n] for n in names if n not in SECOND]
    second = [torch_params[n] for n in SECOND]
    opt = torch.optim.SGD(
        [{"params": first}, {"params": second, "lr": 2.5 * BASE_LR, "weight_decay": 0.03}],
        lr=BASE_LR,
        momentum=0.9,
    )
    history = []
    for step in range(STEPS):
        grads = gradients(step)
        for group, scale in zip(opt.param_groups, (1.0, 2.5), strict=True):
            group["lr"] = float(np.float32(lr_at(step))) * scale
        for n in names:
            torch_params[n].grad = torch.from_numpy(grads[n].copy()).to(dtype)
        torch.nn.utils.clip_grad_norm_(list(torch_params.values()), 2.0)
        torch.nn.utils.clip_grad_norm_(second, 0.5)
        opt.step()
        history.append({n: p.detach().numpy().copy() for n, p in torch_params.items()})
    return history


@pytest.mark.parametrize(
    ("ours", "theirs", "options"), CASES[::3], ids=lambda c: getattr(c, "__name__", None) or str(c)
)
def test_float32_ops_stay_within_an_ulp_per_step_of_torch(ours, theirs, options) -> None:
    """``exact=False`` writes the fused multiply-adds and square roots in float32: rtol 1e-5 of torch, or torch's
    own float32 rounding against its float64 run (float32 ops round about as much as torch's float32 kernels)."""
    block = _ours(ours, options)
    (block.standard or block).exact = False
    model = _model(block)
    assert '"exact": false' in next(p.value for p in model.metadata_props)
    assert not [
        n
        for n in model.graph.node
        if n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.DOUBLE
    ][3:]
    _, history = _ours_run(model)
    names = list(SHAPES)
    expected = _torch_run(theirs, options)
    expected64 = _torch_run(theirs, options, torch.float64)
    scales = _scales(expected64)
    for step, (params, _) in enumerate(history):
        for i, n in enumerate(names):
            assert_close(
                params[i],
                expected[step][0][n],
                expected64[step][0][n],
                rtol=1e-5,
                scale=scales[n][step],
                name=f"{n} step {step + 1}",
            )

"""Lamb in standard ops against a NumPy reference of the paper's equations (You et al., 2019, Algorithm 2).

ONNX Runtime 1.19.2's CPU training build registers no ``LambOptimizer`` kernel
(its CPU training kernels are SGDOptimizer, AdamOptimizer, AdamWOptimizer,
SGDOptimizerV2 and the accumulators), so the reference here is NumPy, in float32
and in float64: 20 steps on four parameters in two groups under a changing learning
rate, with and without bias correction, weight decay and a zero tensor (trust ratio
1), at rtol 1e-5 or the float32 reference's own rounding (``support.numerics``). Lamb reads whole-tensor norms, so the multi-tensor layout keeps each
parameter's update on its own (checked through the per-tensor optimizer model).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from support.numerics import assert_close
from support.optim_family import step_magnitudes

import onnxblocks
from onnxblocks import optim
from onnxblocks._core.ort import onnxruntime
from onnxblocks.portable.optimizer import optimizer_model, read_optimizer

SHAPES = {"w1": (3, 4), "b1": (4,), "w2": (4, 2), "zero": (2,)}
SECOND = ["b1", "zero"]
STEPS, BASE_LR = 20, 0.01


def lr_at(step: int) -> float:
    return BASE_LR * (1.0 + 0.5 * np.cos(step))


def _initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    values["zero"][:] = 0.0  # ||w|| = 0: the trust ratio is 1
    return values


def _grads(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(500 + step)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _reference(options: dict, dtype: type) -> list[dict[str, np.ndarray]]:
    """The paper's equations in NumPy in ``dtype`` (NumPy 2 keeps Python floats at the arrays' dtype)."""
    beta1, beta2 = options.get("betas", (0.9, 0.999))
    eps, correct = options.get("eps", 1e-6), options.get("bias_correction", True)
    decay = {n: (0.05 if n in SECOND else options.get("weight_decay", 0.0)) for n in SHAPES}
    params = {n: v.astype(dtype) for n, v in _initial().items()}
    m = {n: np.zeros_like(v) for n, v in params.items()}
    v = {n: np.zeros_like(p) for n, p in params.items()}
    history = []
    for step in range(STEPS):
        t = step + 1
        for n, g in _grads(step).items():
            g = g.astype(dtype)
            lr = float(np.float32(lr_at(step))) * (3.0 if n in SECOND else 1.0)
            m[n] = beta1 * m[n] + (1 - beta1) * g
            v[n] = beta2 * v[n] + (1 - beta2) * g * g
            m_hat = m[n] / (1 - beta1**t) if correct else m[n]
            v_hat = v[n] / (1 - beta2**t) if correct else v[n]
            u = m_hat / (np.sqrt(v_hat) + eps) + decay[n] * params[n]
            w_norm, u_norm = np.linalg.norm(params[n]), np.linalg.norm(u)
            ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[n] = params[n] - lr * ratio * u
        history.append({n: p.copy() for n, p in params.items()})
    return history


@pytest.mark.parametrize(
    "options",
    [{}, {"bias_correction": False}, {"weight_decay": 0.01, "betas": (0.8, 0.99), "eps": 1e-4}],
)
def test_lamb_matches_the_papers_equations(options: dict) -> None:
    block = optim.Lamb(
        lr=BASE_LR,
        param_groups=[{"params": SECOND, "lr": 3 * BASE_LR, "weight_decay": 0.05}],
        **options,
    )
    trainable = [onnx.numpy_helper.from_array(v, n) for n, v in _initial().items()]
    with onnxblocks.empty_base():
        block((trainable, []))
    sequence_model = block.to_model_proto()
    values = [
        ir.Value(name=n, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(s))
        for n, s in SHAPES.items()
    ]
    model = optimizer_model(sequence_model, values)  # the per-tensor model portable artifacts hold
    assert read_optimizer(sequence_model).states == ("exp_avg", "exp_avg_sq")
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    params = _initial()
    moments = {n: [np.zeros_like(p), np.zeros_like(p)] for n, p in params.items()}
    expected, expected64 = _reference(options, np.float32), _reference(options, np.float64)
    scales = {n: step_magnitudes(_initial()[n], [e[n] for e in expected64]) for n in SHAPES}
    for step in range(STEPS):
        feeds = {
            "learning_rate": np.array([lr_at(step)], np.float32),
            "step": np.array([step + 1], np.int64),
        }
        for n, g in _grads(step).items():
            feeds |= {
                n: params[n],
                f"{n}_grad": g,
                f"{n}.exp_avg": moments[n][0],
                f"{n}.exp_avg_sq": moments[n][1],
            }
        out = dict(
            zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True)
        )
        for n in SHAPES:
            params[n] = out[f"{n}.out"]
            moments[n] = [out[f"{n}.exp_avg.out"], out[f"{n}.exp_avg_sq.out"]]
            want, want64 = expected[step][n], expected64[step][n]
            assert_close(
                params[n],
                want,
                want64,
                rtol=1e-5,
                scale=scales[n][step],
                name=f"{n} step {step + 1}",
            )

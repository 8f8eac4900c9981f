"""The optimizer oracle: a tiny training model built by hand, and torch / numpy references for its steps.

The training model has its parameters as graph inputs and is built with ORT's
GradientGraphBuilder and InPlaceAccumulatorV2, so the optimizer and checkpoint
tests that use it depend only on the optimizer and checkpoint modules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnxblocks
from onnxblocks.checkpoint import save_checkpoint
from support.numerics import assert_close
from support.optim_family import step_magnitudes

LR = 0.05
STEPS = 4

# --------------------------------------------------------------------------- the tiny training setup


def tiny_forward(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``loss = mean((tanh(x @ W1 + b1) @ W2 + b2) * s - t)^2)``; ``s`` is a frozen parameter."""
    rng = np.random.default_rng(seed)
    params = {
        "W1": rng.standard_normal((4, 6)).astype(np.float32),
        "b1": rng.standard_normal(6).astype(np.float32),
        "W2": rng.standard_normal((6, 3)).astype(np.float32),
        "b2": rng.standard_normal(3).astype(np.float32),
        "s": np.array([1.0, 0.5, 2.0], np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y1"]),
        helper.make_node("Mul", ["y1", "s"], ["y"]),
        helper.make_node("Sub", ["y", "t"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [5, 3]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, params


TRAINABLE = ["W1", "b1", "W2", "b2"]
FROZEN = ["s"]


def session_options():
    """The library's options (errors only; ONNXBLOCKS_ORT_THREADS sets the thread count, support/ort_threads.py)."""
    from onnxblocks._core.ort import session_options as library_options

    return library_options()


def training_model(
    forward: onnx.ModelProto, trainable: list[str], frozen: list[str]
) -> onnx.ModelProto:
    """A training model in the layout ORT's training API expects (built by hand, a local fixture)."""
    from onnxruntime.capi import _pybind_state as C

    model = onnx.ModelProto()
    model.CopyFrom(forward)
    for init in model.graph.initializer:
        model.graph.input.append(
            helper.make_tensor_value_info(init.name, init.data_type, init.dims)
        )
    del model.graph.initializer[:]
    options = session_options()
    optimized = C.get_optimized_model(model.SerializeToString(), set(trainable), options)
    builder = C.GradientGraphBuilder(optimized, {"loss"}, set(trainable), "loss", options)
    builder.build()
    grad = onnx.load_from_string(builder.get_model())
    outputs = {o.name: o for o in grad.graph.output}
    new_outputs = [outputs["loss"]]
    for name in trainable:
        g = f"{name}_grad"
        buffer = onnx.ValueInfoProto()
        buffer.CopyFrom(outputs[g])
        buffer.name = f"{g}.accumulation.buffer"
        grad.graph.input.append(buffer)
        grad.graph.node.append(
            helper.make_node(
                "InPlaceAccumulatorV2",
                [buffer.name, g, "lazy_reset_grad"],
                [f"{g}.accumulation.out"],
                domain="com.microsoft",
                name=f"accumulate_{name}",
            )
        )
        new_outputs.append(
            helper.make_tensor_value_info(f"{g}.accumulation.out", TensorProto.BOOL, [1])
        )
    grad.graph.input.append(helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]))
    del grad.graph.output[:]
    grad.graph.output.extend(new_outputs)
    return grad


@pytest.fixture(scope="session")
def training_dir(tmp_path_factory) -> Path:
    """A directory holding ``training.onnx`` for :func:`tiny_forward` (built once per session; a plugin of conftest)."""
    d = tmp_path_factory.mktemp("training")
    forward, _ = tiny_forward()
    onnx.save(training_model(forward, TRAINABLE, FROZEN), d / "training.onnx")
    return d


def batches(n: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((5, 4)).astype(np.float32),
            rng.standard_normal((5, 3)).astype(np.float32),
        )
        for _ in range(n)
    ]


@dataclass
class OrtTrainer:
    """C.Module + C.Optimizer on a checkpoint, driven as onnxruntime.training.api does."""

    state: object
    module: object
    optimizer: object

    @classmethod
    def open(
        cls, training: Path, checkpoint: Path, optimizer_model: Path, lr: float = LR
    ) -> OrtTrainer:
        from onnxruntime.capi import _pybind_state as C

        state = C.load_checkpoint(os.fspath(checkpoint))
        device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
        module = C.Module(os.fspath(training), state, None, device, session_options())
        optimizer = C.Optimizer(os.fspath(optimizer_model), state, device, session_options())
        optimizer.set_learning_rate(lr)
        return cls(state, module, optimizer)

    def step(self, x: np.ndarray, t: np.ndarray) -> float:
        from onnxruntime.capi import _pybind_state as C

        fetches = C.OrtValueVector()
        self.module.train_step([x, t], fetches)
        self.optimizer.optimizer_step()
        self.module.lazy_reset_grad()
        return float(fetches[0].numpy())

    def param(self, name: str) -> np.ndarray:
        return self.state.get_parameter(name).data.numpy().copy()


def parameters_of(params: dict[str, np.ndarray]) -> tuple[list[TensorProto], list[TensorProto]]:
    return (
        [numpy_helper.from_array(params[n], n) for n in TRAINABLE],
        [numpy_helper.from_array(params[n], n) for n in FROZEN],
    )


def optimizer_model(
    block: onnxblocks.ForwardBlock, params: dict[str, np.ndarray]
) -> onnx.ModelProto:
    with onnxblocks.empty_base():
        block(parameters_of(params))
    return block.to_model_proto()


def run_ort(tmp: Path, training: Path, block, steps: int) -> list[dict[str, np.ndarray]]:
    """Train ``steps`` steps with the optimizer ``block``; parameters after each step."""
    _, params = tiny_forward()
    save_checkpoint(parameters_of(params), tmp / "checkpoint")
    onnx.save(optimizer_model(block, params), tmp / "optimizer.onnx")
    trainer = OrtTrainer.open(
        training / "training.onnx", tmp / "checkpoint", tmp / "optimizer.onnx"
    )
    history = []
    for x, t in batches(steps):
        trainer.step(x, t)
        history.append({n: trainer.param(n) for n in TRAINABLE + FROZEN})
    return history


def torch_loss(P: dict[str, torch.Tensor], x: np.ndarray, t: np.ndarray) -> torch.Tensor:
    """:func:`tiny_forward`'s loss in torch, in the parameters' dtype (float64 for the float64 reference)."""
    dtype = P["W1"].dtype
    y = (torch.tanh(torch.from_numpy(x).to(dtype) @ P["W1"] + P["b1"]) @ P["W2"] + P["b2"]) * P["s"]
    return ((y - torch.from_numpy(t).to(dtype)) ** 2).mean()


def run_torch(
    make_optimizer, steps: int, clip: float | None = None, dtype: torch.dtype = torch.float32
) -> list[dict[str, np.ndarray]]:
    """torch.optim on :func:`tiny_forward`'s parameters, run in ``dtype``; parameters after each step."""
    _, params = tiny_forward()
    P = {n: torch.tensor(v, dtype=dtype, requires_grad=n in TRAINABLE) for n, v in params.items()}
    optimizer = make_optimizer([P[n] for n in TRAINABLE])
    history = []
    for x, t in batches(steps):
        optimizer.zero_grad()
        torch_loss(P, x, t).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([P[n] for n in TRAINABLE], clip)
        optimizer.step()
        history.append({n: p.detach().numpy().copy() for n, p in P.items()})
    return history


def run_numpy(update, steps: int, dtype: type = np.float32) -> list[dict[str, np.ndarray]]:
    """Apply ``update(params, grads, state, step)`` (numpy, in ``dtype``) with torch-computed gradients."""
    _, params = tiny_forward()
    params = {n: v.astype(dtype) for n, v in params.items()}
    state: dict = {}
    history = []
    for k, (x, t) in enumerate(batches(steps), start=1):
        P = {n: torch.tensor(v, requires_grad=n in TRAINABLE) for n, v in params.items()}
        torch_loss(P, x, t).backward()
        grads = {n: P[n].grad.numpy() for n in TRAINABLE}
        update(params, grads, state, k)
        history.append({n: v.copy() for n, v in params.items()})
    return history


def hf_adamw(lr: float, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True):
    """Hugging Face (transformers.AdamW) update, written out in numpy in the parameters' dtype."""

    def update(params, grads, state, step):
        for n, g in grads.items():
            real = params[n].dtype.type
            b1, b2 = real(betas[0]), real(betas[1])
            m1, m2 = state.get(n, (np.zeros_like(g), np.zeros_like(g)))
            m1 = b1 * m1 + (1 - b1) * g
            m2 = b2 * m2 + (1 - b2) * g * g
            step_size = lr
            if correct_bias:
                step_size = lr * np.sqrt(1 - b2**step) / (1 - b1**step)
            p = params[n] - real(step_size) * m1 / (np.sqrt(m2) + real(eps))
            if weight_decay > 0:
                p = p - real(lr * weight_decay) * p
            params[n] = p.astype(real)
            state[n] = (m1, m2)

    return update


def assert_history_close(ours, reference, reference64=None, rtol=1e-5):
    """Parameters after each step against a reference run in float32 and the same run in float64.

    ``support.numerics.assert_close``: within ``rtol`` of the float32 reference, or within the float32 run's
    own rounding against the float64 run, plus a floor of the magnitude of the updates each parameter summed.
    Without ``reference64`` (a reference that is another float32 run of ours) only ``rtol`` and the floor of
    the values' own magnitude apply.
    """
    assert len(ours) == len(reference)
    assert reference64 is None or len(reference64) >= len(reference)
    _, start = tiny_forward()
    for name in TRAINABLE + FROZEN:
        scales = [None] * len(ours)
        if reference64 is not None:
            scales = step_magnitudes(start[name], [r[name] for r in reference64])
        for k, (a, b) in enumerate(zip(ours, reference, strict=True)):
            b64 = None if reference64 is None else reference64[k][name]
            assert_close(
                a[name], b[name], b64, rtol=rtol, scale=scales[k], name=f"{name} after step {k + 1}"
            )

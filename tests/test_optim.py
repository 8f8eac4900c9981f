"""Optimizer models: one ORT optimizer step equals torch.optim (or the stated formula), after 1 and several steps.

The training model is built here by hand (params as graph inputs, ORT's
GradientGraphBuilder, InPlaceAccumulatorV2), so these tests depend only on the
optimizer and checkpoint modules. The helpers are reused by test_checkpoint.py.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnxblocks
from onnxblocks.checkpoint import save_checkpoint
from onnxblocks.compat import AdamWOptimizer, ReferenceAdamW, SGDOptimizer
from onnxblocks.optim import SGD, AdamW, ClipGradNorm, contrib

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
    from onnxruntime.capi import _pybind_state as C

    options = C.SessionOptions()
    options.log_severity_level = 3
    return options


def training_model(forward: onnx.ModelProto, trainable: list[str], frozen: list[str]) -> onnx.ModelProto:
    """A training model in the layout ORT's training API expects (built by hand, a local fixture)."""
    from onnxruntime.capi import _pybind_state as C

    model = onnx.ModelProto()
    model.CopyFrom(forward)
    for init in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
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
        new_outputs.append(helper.make_tensor_value_info(f"{g}.accumulation.out", TensorProto.BOOL, [1]))
    grad.graph.input.append(helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]))
    del grad.graph.output[:]
    grad.graph.output.extend(new_outputs)
    return grad


@pytest.fixture(scope="session")
def training_dir(tmp_path_factory) -> Path:
    """A directory holding ``training.onnx`` for :func:`tiny_forward` (built once per session)."""
    d = tmp_path_factory.mktemp("training")
    forward, _ = tiny_forward()
    onnx.save(training_model(forward, TRAINABLE, FROZEN), d / "training.onnx")
    return d


def batches(n: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
        for _ in range(n)
    ]


@dataclass
class OrtTrainer:
    """C.Module + C.Optimizer on a checkpoint, driven as onnxruntime.training.api does."""

    state: object
    module: object
    optimizer: object

    @classmethod
    def open(cls, training: Path, checkpoint: Path, optimizer_model: Path, lr: float = LR) -> OrtTrainer:
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


def optimizer_model(block: onnxblocks.ForwardBlock, params: dict[str, np.ndarray]) -> onnx.ModelProto:
    with onnxblocks.empty_base():
        block(parameters_of(params))
    return block.to_model_proto()


def run_ort(tmp: Path, training: Path, block, steps: int) -> list[dict[str, np.ndarray]]:
    """Train ``steps`` steps with the optimizer ``block``; parameters after each step."""
    _, params = tiny_forward()
    save_checkpoint(parameters_of(params), tmp / "checkpoint")
    onnx.save(optimizer_model(block, params), tmp / "optimizer.onnx")
    trainer = OrtTrainer.open(training / "training.onnx", tmp / "checkpoint", tmp / "optimizer.onnx")
    history = []
    for x, t in batches(steps):
        trainer.step(x, t)
        history.append({n: trainer.param(n) for n in TRAINABLE + FROZEN})
    return history


def torch_loss(P: dict[str, torch.Tensor], x: np.ndarray, t: np.ndarray) -> torch.Tensor:
    y = (torch.tanh(torch.from_numpy(x) @ P["W1"] + P["b1"]) @ P["W2"] + P["b2"]) * P["s"]
    return ((y - torch.from_numpy(t)) ** 2).mean()


def run_torch(make_optimizer, steps: int, clip: float | None = None) -> list[dict[str, np.ndarray]]:
    _, params = tiny_forward()
    P = {n: torch.tensor(v, requires_grad=n in TRAINABLE) for n, v in params.items()}
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


def run_numpy(update, steps: int) -> list[dict[str, np.ndarray]]:
    """Apply ``update(params, grads, state, step)`` (numpy, float32) with torch-computed gradients."""
    _, params = tiny_forward()
    params = {n: v.copy() for n, v in params.items()}
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
    """Hugging Face (transformers.AdamW) update, written out in numpy."""
    b1, b2 = np.float32(betas[0]), np.float32(betas[1])

    def update(params, grads, state, step):
        for n, g in grads.items():
            m1, m2 = state.get(n, (np.zeros_like(g), np.zeros_like(g)))
            m1 = b1 * m1 + (1 - b1) * g
            m2 = b2 * m2 + (1 - b2) * g * g
            step_size = lr
            if correct_bias:
                step_size = lr * np.sqrt(1 - b2**step) / (1 - b1**step)
            p = params[n] - np.float32(step_size) * m1 / (np.sqrt(m2) + np.float32(eps))
            if weight_decay > 0:
                p = p - np.float32(lr * weight_decay) * p
            params[n] = p.astype(np.float32)
            state[n] = (m1, m2)

    return update


def assert_history_close(ours, reference, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(reference)
    for k, (a, b) in enumerate(zip(ours, reference, strict=True)):
        for name in TRAINABLE + FROZEN:
            np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=f"{name} after step {k + 1}")


# --------------------------------------------------------------------------- numeric equivalence

TORCH_CASES = {
    "adamw-default": (lambda: AdamW(), lambda p: torch.optim.AdamW(p, lr=LR), None),
    "adamw-decay-betas": (
        lambda: AdamW(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=LR, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        None,
    ),
    "adamw-no-decay": (lambda: AdamW(weight_decay=0.0), lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=0.0), None),
    "adamw-clip": (lambda: AdamW(clip_grad=ClipGradNorm(0.5)), lambda p: torch.optim.AdamW(p, lr=LR), 0.5),
    "sgd": (lambda: SGD(), lambda p: torch.optim.SGD(p, lr=LR), None),
    "sgd-clip": (lambda: SGD(clip_grad=0.3), lambda p: torch.optim.SGD(p, lr=LR), 0.3),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_step_matches_torch(case, training_dir, tmp_path):
    make_block, make_torch, clip = TORCH_CASES[case]
    ours = run_ort(tmp_path, training_dir, make_block(), STEPS)
    reference = run_torch(make_torch, STEPS, clip)
    assert_history_close(ours[:1], reference[:1])
    assert_history_close(ours, reference)
    assert not np.allclose(ours[-1]["W1"], tiny_forward()[1]["W1"])  # it did train
    np.testing.assert_array_equal(ours[-1]["s"], tiny_forward()[1]["s"])  # frozen stays


def test_clip_actually_clips(training_dir, tmp_path):
    # With a tiny max_norm the clipped run must differ from the unclipped one (and still match torch).
    clipped = run_ort(tmp_path, training_dir, SGD(clip_grad=1e-3), 1)
    unclipped = run_torch(lambda p: torch.optim.SGD(p, lr=LR), 1)
    assert not np.allclose(clipped[0]["W1"], unclipped[0]["W1"], rtol=1e-3)


HF_CASES = {
    "hf-bias-correction": (
        lambda: AdamW(mode="hf", eps=1e-6, weight_decay=0.05),
        hf_adamw(LR, eps=1e-6, weight_decay=0.05),
    ),
    "hf-no-bias-correction": (
        lambda: AdamW(mode="hf", bias_correction=False, weight_decay=0.05),
        hf_adamw(LR, eps=1e-8, weight_decay=0.05, correct_bias=False),
    ),
    "reference-defaults": (lambda: ReferenceAdamW(), hf_adamw(LR)),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_mode_matches_formula(case, training_dir, tmp_path):
    make_block, update = HF_CASES[case]
    ours = run_ort(tmp_path, training_dir, make_block(), STEPS)
    assert_history_close(ours, run_numpy(update, STEPS))


def test_torch_mode_differs_from_hf_mode(training_dir, tmp_path):
    # The two modes are really different computations (decay before vs after, eps placement).
    torch_mode = run_ort(tmp_path, training_dir, AdamW(weight_decay=0.1), 2)
    hf_mode = run_ort(tmp_path, training_dir, AdamW(weight_decay=0.1, mode="hf"), 2)
    assert not np.allclose(torch_mode[-1]["W1"], hf_mode[-1]["W1"], rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- model structure


def _inputs(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    return {i.name: i.type for i in model.graph.input}


def test_adamw_model_contract():
    _, params = tiny_forward()
    model = optimizer_model(AdamW(betas=(0.8, 0.9), eps=1e-7, weight_decay=0.2), params)
    inputs = _inputs(model)
    assert list(inputs) == [
        "learning_rate",
        "step",
        "params",
        "gradients",
        "first_order_moments",
        "second_order_moments",
    ]
    assert inputs["learning_rate"].tensor_type.elem_type == TensorProto.FLOAT
    assert inputs["step"].tensor_type.elem_type == TensorProto.INT64
    for name in ["params", "gradients", "first_order_moments", "second_order_moments"]:
        assert inputs[name].sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("AdamWOptimizer", "com.microsoft")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["adam_mode"] == 0 and attrs["correct_bias"] == 1
    np.testing.assert_allclose(
        [attrs["alpha"], attrs["beta"], attrs["epsilon"], attrs["weight_decay"]], [0.8, 0.9, 1e-7, 0.2], rtol=1e-6
    )
    (out,) = model.graph.output
    assert out.type.tensor_type.elem_type == TensorProto.BOOL
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1]
    assert model.ir_version <= 10
    assert {o.domain: o.version for o in model.opset_import}["com.microsoft"] == 1


def test_sgd_declares_the_inputs_ort_requires():
    _, params = tiny_forward()
    model = optimizer_model(SGD(clip_grad=ClipGradNorm(2.0)), params)
    assert list(_inputs(model)) == ["learning_rate", "step", "params", "gradients", "first_order_moments"]
    assert [n.op_type for n in model.graph.node] == ["InplaceClipGradNorm", "SGDOptimizerV2"]
    clip, sgd = model.graph.node
    assert sgd.input[2] == clip.output[0] and clip.input[0] == "gradients"
    assert helper.get_attribute_value(clip.attribute[0]) == pytest.approx(2.0)


def test_double_parameters_give_double_sequences():
    params = {n: np.zeros(3, np.float64) for n in ["a", "b"]}
    with onnxblocks.empty_base():
        block = AdamW()
        block(([numpy_helper.from_array(v, n) for n, v in params.items()], []))
    model = block.to_model_proto()
    assert _inputs(model)["params"].sequence_type.elem_type.tensor_type.elem_type == TensorProto.DOUBLE


def test_parameters_may_be_tensor_sources():
    from onnxblocks._core.weights import TensorSource

    source = TensorSource("w", TensorProto.FLOAT, (2, 2), tensor=numpy_helper.from_array(np.ones((2, 2), np.float32)))
    with onnxblocks.empty_base():
        block = SGD()
        block(([source], []))
    assert block.to_model_proto().graph.node[0].op_type == "SGDOptimizerV2"


def test_reference_compat_blocks():
    reference = ReferenceAdamW()
    assert reference.step_block.attributes() == {
        "alpha": 0.9,
        "beta": 0.999,
        "epsilon": 1e-6,
        "weight_decay": 0.0,
        "correct_bias": 1,
        "adam_mode": 1,
    }
    with onnxblocks.empty_base() as acc:
        for name in ["lr", "step"]:
            acc.add_input(name, TensorProto.FLOAT if name == "lr" else TensorProto.INT64, [1])
        for name in ["p", "g", "m1", "m2"]:
            acc.working_model.graph.input.append(helper.make_tensor_sequence_value_info(name, TensorProto.FLOAT, None))
        flag = AdamWOptimizer()("lr", "step", "p", "g", "m1", "m2")
        sgd_flag = SGDOptimizer()("lr", "p", "g")
        assert acc.elem_type(flag) == TensorProto.BOOL
        with pytest.warns(UserWarning, match="reference's argument order"):
            SGDOptimizer()("lr", gradients_name="p", params_name="g")
        nodes = list(acc.working_model.graph.node)
    assert list(nodes[0].input) == ["lr", "step", "p", "g", "m1", "m2"]
    assert {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}["adam_mode"] == 1
    assert list(nodes[1].input) == ["lr", "p", "g"] and nodes[1].output[0] == sgd_flag
    assert list(nodes[2].input) == ["lr", "p", "g"]  # same slots as the reference, whatever the keywords say


def test_contrib_ops_are_declared_once_as_data():
    assert set(contrib.CONTRIB_OPS) == {
        "AdamWOptimizer",
        "SGDOptimizerV2",
        "InPlaceAccumulatorV2",
        "InplaceClipGradNorm",
    }
    adamw = contrib.ADAMW_OPTIMIZER
    assert adamw.domain == "com.microsoft"
    assert {a.name: a.kind for a in adamw.attributes} == {
        "alpha": onnx.AttributeProto.FLOAT,
        "beta": onnx.AttributeProto.FLOAT,
        "epsilon": onnx.AttributeProto.FLOAT,
        "weight_decay": onnx.AttributeProto.FLOAT,
        "correct_bias": onnx.AttributeProto.INT,
        "adam_mode": onnx.AttributeProto.INT,
    }
    with onnxblocks.empty_base() as acc:
        acc.working_model.graph.input.append(helper.make_tensor_sequence_value_info("g", TensorProto.FLOAT, None))
        with pytest.raises(TypeError, match="no attribute 'max_nrom'.*max_norm"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_nrom=1.0)
        with pytest.raises(TypeError, match="'max_norm' must be a float"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_norm="big")
        with pytest.raises(TypeError, match="takes 1 to 1 inputs"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g", "g"])
        clipped = contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_norm=1)
        assert acc.type_of(clipped).sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
        acc.add_input("buffer", TensorProto.FLOAT, [3])
        acc.add_input("grad", TensorProto.FLOAT, [3])
        flag, out = contrib.IN_PLACE_ACCUMULATOR_V2.emit(["buffer", "grad"], outputs=2)
        assert acc.elem_type(flag) == TensorProto.BOOL and acc.shape_of(out) == [3]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: AdamW(bias_correction=False), ValueError, "mode='hf'"),
        (lambda: AdamW(mode="keras"), ValueError, "mode must be one of"),
        (lambda: AdamW(betas=(0.9, 1.0)), ValueError, r"betas\[1\]"),
        (lambda: AdamW(betas=0.9), ValueError, "pair"),
        (lambda: AdamW(eps=-1.0), ValueError, "eps"),
        (lambda: AdamW(weight_decay=float("nan")), ValueError, "weight_decay"),
        (lambda: ClipGradNorm(0.0), ValueError, "positive"),
        (lambda: ClipGradNorm("1"), TypeError, "number"),
        (lambda: SGD(clip_grad="yes"), TypeError, "clip_grad"),
    ],
)
def test_bad_hyperparameters(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    ("parameters", "error", "match"),
    [
        ([numpy_helper.from_array(np.zeros(2, np.float32), "w")], TypeError, r"\(trainable, frozen\)"),
        (([], []), ValueError, "at least one trainable"),
        (([numpy_helper.from_array(np.zeros(2, np.int64), "steps")], []), ValueError, "'steps' has element type INT64"),
        (
            ([numpy_helper.from_array(np.zeros(2, np.float32), "a"), numpy_helper.from_array(np.zeros(2), "b")], []),
            ValueError,
            "'a' is float32 and 'b' is float64",
        ),
        ((["w"], []), TypeError, "str .name"),
    ],
)
def test_bad_parameters(parameters, error, match):
    with onnxblocks.empty_base(), pytest.raises(error, match=match):
        AdamW()(parameters)


def test_to_model_proto_before_build():
    with pytest.raises(onnxblocks.NotBuiltError):
        SGD().to_model_proto()


def test_no_onnxruntime_import():
    import subprocess
    import sys

    code = (
        "import sys, onnxblocks.optim, onnxblocks.checkpoint, onnxblocks.io; "
        "print([m for m in ('onnxruntime', 'torch', 'onnxscript') if m in sys.modules])"
    )
    with warnings.catch_warnings():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_generate_artifacts_with_our_optimizer_matches_torch(tmp_path):
    artifacts = pytest.importorskip("onnxblocks.artifacts")
    forward, _ = tiny_forward()
    result = artifacts.generate_artifacts(
        forward,
        requires_grad=TRAINABLE,
        frozen_params=FROZEN,
        loss=None,
        optimizer=AdamW(clip_grad=0.5),
        artifact_directory=tmp_path,
    )
    trainer = OrtTrainer.open(result.training_model, result.checkpoint, result.optimizer_model)
    history = []
    for x, t in batches(STEPS):
        trainer.step(x, t)
        history.append({n: trainer.param(n) for n in TRAINABLE + FROZEN})
    assert_history_close(history, run_torch(lambda p: torch.optim.AdamW(p, lr=LR), STEPS, clip=0.5))

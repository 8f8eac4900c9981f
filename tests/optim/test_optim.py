"""Optimizer models: one ORT optimizer step equals torch.optim (or the stated formula), after 1 and several steps.

The training model is built here by hand (params as graph inputs, ORT's
GradientGraphBuilder, InPlaceAccumulatorV2), so these tests depend only on the
optimizer and checkpoint modules (support/optim_oracle.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_equal, is_close
from support.optim_oracle import (
    FROZEN,
    LR,
    STEPS,
    TRAINABLE,
    OrtTrainer,
    assert_history_close,
    batches,
    hf_adamw,
    optimizer_model,
    run_numpy,
    run_ort,
    run_torch,
    tiny_forward,
)

import onnxblocks
from onnxblocks.compat import AdamWOptimizer, ReferenceAdamW, SGDOptimizer
from onnxblocks.optim import SGD, AdamW, ClipGradNorm
from onnxblocks.optim import contrib_ops as contrib

# --------------------------------------------------------------------------- numeric equivalence

TORCH_CASES = {
    "adamw-default": (lambda: AdamW(), lambda p: torch.optim.AdamW(p, lr=LR), None),
    "adamw-decay-betas": (
        lambda: AdamW(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=LR, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
        None,
    ),
    "adamw-no-decay": (
        lambda: AdamW(weight_decay=0.0),
        lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=0.0),
        None,
    ),
    "adamw-clip": (
        lambda: AdamW(clip_grad=ClipGradNorm(0.5)),
        lambda p: torch.optim.AdamW(p, lr=LR),
        0.5,
    ),
    "sgd": (lambda: SGD(), lambda p: torch.optim.SGD(p, lr=LR), None),
    "sgd-clip": (lambda: SGD(clip_grad=0.3), lambda p: torch.optim.SGD(p, lr=LR), 0.3),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_step_matches_torch(case, training_dir, tmp_path):
    make_block, make_torch, clip = TORCH_CASES[case]
    ours = run_ort(tmp_path, training_dir, make_block(), STEPS)
    reference, reference64 = (
        run_torch(make_torch, STEPS, clip),
        run_torch(make_torch, STEPS, clip, torch.float64),
    )
    assert_history_close(ours[:1], reference[:1], reference64)
    assert_history_close(ours, reference, reference64)
    assert not is_close(ours[-1]["W1"], tiny_forward()[1]["W1"], rtol=1e-5)  # it did train
    np.testing.assert_array_equal(ours[-1]["s"], tiny_forward()[1]["s"])  # frozen stays


def test_clip_actually_clips(training_dir, tmp_path):
    # With a tiny max_norm the clipped run must differ from the unclipped one (and still match torch).
    clipped = run_ort(tmp_path, training_dir, SGD(clip_grad=1e-3), 1)
    unclipped = run_torch(lambda p: torch.optim.SGD(p, lr=LR), 1)
    assert not is_close(clipped[0]["W1"], unclipped[0]["W1"], rtol=1e-3)


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
    assert_history_close(ours, run_numpy(update, STEPS), run_numpy(update, STEPS, np.float64))


def test_torch_mode_differs_from_hf_mode(training_dir, tmp_path):
    # The two modes are really different computations (decay before vs after, eps placement).
    torch_mode = run_ort(tmp_path, training_dir, AdamW(weight_decay=0.1), 2)
    hf_mode = run_ort(tmp_path, training_dir, AdamW(weight_decay=0.1, mode="hf"), 2)
    assert not is_close(torch_mode[-1]["W1"], hf_mode[-1]["W1"], rtol=1e-6)


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
    hyper = [attrs["alpha"], attrs["beta"], attrs["epsilon"], attrs["weight_decay"]]
    assert_equal(np.float32(hyper), np.float32([0.8, 0.9, 1e-7, 0.2]), name="float32 attributes")
    (out,) = model.graph.output
    assert out.type.tensor_type.elem_type == TensorProto.BOOL
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1]
    assert model.ir_version <= 10
    assert {o.domain: o.version for o in model.opset_import}["com.microsoft"] == 1


def test_sgd_declares_the_inputs_ort_requires():
    _, params = tiny_forward()
    model = optimizer_model(SGD(clip_grad=ClipGradNorm(2.0)), params)
    assert list(_inputs(model)) == [
        "learning_rate",
        "step",
        "params",
        "gradients",
        "first_order_moments",
    ]
    assert [n.op_type for n in model.graph.node] == [
        "InplaceClipGradNorm",
        "SGDOptimizerV2",
        "Constant",
        "Reshape",
    ]
    clip, sgd = model.graph.node[:2]
    assert sgd.input[2] == clip.output[0] and clip.input[0] == "gradients"
    assert helper.get_attribute_value(clip.attribute[0]) == 2.0


def test_double_parameters_give_double_sequences():
    params = {n: np.zeros(3, np.float64) for n in ["a", "b"]}
    with onnxblocks.empty_base():
        block = AdamW()
        block(([numpy_helper.from_array(v, n) for n, v in params.items()], []))
    model = block.to_model_proto()
    assert (
        _inputs(model)["params"].sequence_type.elem_type.tensor_type.elem_type == TensorProto.DOUBLE
    )


def test_parameters_may_be_tensor_sources():
    from onnxblocks._core.weights import TensorSource

    source = TensorSource(
        "w", TensorProto.FLOAT, (2, 2), tensor=numpy_helper.from_array(np.ones((2, 2), np.float32))
    )
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
            acc.working_model.graph.input.append(
                helper.make_tensor_sequence_value_info(name, TensorProto.FLOAT, None)
            )
        flag = AdamWOptimizer()("lr", "step", "p", "g", "m1", "m2")
        sgd_flag = SGDOptimizer()("lr", "p", "g")
        assert acc.elem_type(flag) == TensorProto.BOOL
        with pytest.warns(UserWarning, match="reference's argument order"):
            SGDOptimizer()("lr", gradients_name="p", params_name="g")
        nodes = list(acc.working_model.graph.node)
    assert list(nodes[0].input) == ["lr", "step", "p", "g", "m1", "m2"]
    assert {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}["adam_mode"] == 1
    assert list(nodes[1].input) == ["lr", "p", "g"]
    # SGD's flag is reshaped to [1] (ONNX Runtime infers [] but returns [1]): no shape warning at load or run
    assert (
        nodes[3].op_type == "Reshape"
        and nodes[3].input[0] == nodes[1].output[0]
        and nodes[3].output[0] == sgd_flag
    )
    assert list(nodes[4].input) == [
        "lr",
        "p",
        "g",
    ]  # same slots as the reference, whatever the keywords say


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
        acc.working_model.graph.input.append(
            helper.make_tensor_sequence_value_info("g", TensorProto.FLOAT, None)
        )
        with pytest.raises(TypeError, match="no attribute 'max_nrom'.*max_norm"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_nrom=1.0)
        with pytest.raises(TypeError, match="'max_norm' must be a float"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_norm="big")
        with pytest.raises(TypeError, match="takes 1 to 1 inputs"):
            contrib.INPLACE_CLIP_GRAD_NORM.emit(["g", "g"])
        clipped = contrib.INPLACE_CLIP_GRAD_NORM.emit(["g"], max_norm=1)
        assert (
            acc.type_of(clipped).sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
        )
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
        (
            [numpy_helper.from_array(np.zeros(2, np.float32), "w")],
            TypeError,
            r"\(trainable, frozen\)",
        ),
        (([], []), ValueError, "at least one trainable"),
        (
            ([numpy_helper.from_array(np.zeros(2, np.int64), "steps")], []),
            ValueError,
            "'steps' has element type INT64",
        ),
        (
            (
                [
                    numpy_helper.from_array(np.zeros(2, np.float32), "a"),
                    numpy_helper.from_array(np.zeros(2), "b"),
                ],
                [],
            ),
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
    with pytest.raises(onnxblocks.errors.NotBuiltError):
        SGD().to_model_proto()


def test_no_onnxruntime_import():
    import subprocess
    import sys

    code = (
        "import sys, onnxblocks.optim, onnxblocks.checkpoint, onnxblocks.io; "
        "print([m for m in ('onnxruntime', 'torch', 'onnxscript') if m in sys.modules])"
    )
    with warnings.catch_warnings():
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
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
    make = lambda p: torch.optim.AdamW(p, lr=LR)  # noqa: E731
    assert_history_close(
        history, run_torch(make, STEPS, clip=0.5), run_torch(make, STEPS, 0.5, torch.float64)
    )

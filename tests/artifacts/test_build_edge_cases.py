"""Edge cases of building artifacts: values, losses and gradients equal torch; bad models and arguments refused.

Each test is one edge case, asserting the exact behaviour: the exception type and the named
offender, or numbers equal to torch (gradients through ONNX Runtime's training API), compared by
``support.numerics`` with torch and NumPy run in float32 and in float64.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support import models
from support.numerics import assert_close, assert_equal
from support.onnx_models import make_linear_model, run_model

import onnxblocks as ob
from onnxblocks import LossType, OptimType, losses
from onnxblocks.artifacts import generate_artifacts
from onnxblocks.blocks import ReduceSum, value
from onnxblocks.errors import GradientError
from onnxblocks.gradient import build_training_graphs

RTOL = 1e-5


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    model.ir_version = 8
    return model


def _two_params(a: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    """``ya = x * a``, ``yb = x + b``: two outputs depending on two parameters."""
    n = len(a)
    return _model(
        [helper.make_node("Mul", ["x", "a"], ["ya"]), helper.make_node("Add", ["x", "b"], ["yb"])],
        [_vi("x", [n])],
        [_vi("ya", [n]), _vi("yb", [n])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")],
    )


def _ort_loss_and_grads(tmp_path, model, loss_block, params, feeds, **kwargs):
    art = generate_artifacts(
        model, requires_grad=params, loss=loss_block, artifact_directory=tmp_path, **kwargs
    )
    trainer = models.OrtTrainer(art, optimizer=False)
    (loss, *_) = trainer.train_step(*[feeds[n] for n in art.input_names])
    return loss, {p: trainer.grad(p) for p in params}


# ------------------------------------------------------------------ a ** b
class _Power(ob.Block):
    def build(self, ya, yb):
        return ReduceSum(keepdims=False)(value(ya) ** value(yb))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([0.5, 1.5, 2.0, 3.0], [0.3, -1.2, 0.7, -0.4]),  # positive bases: both gradients finite
        (
            [-2.0, -1.5, 0.0, 0.0, 0.0, 0.7],
            [1.0, 2.0, 0.0, -1.0, -0.5, 0.25],
        ),  # negative and zero bases
    ],
)
def test_power_with_both_sides_trainable_matches_torch(tmp_path, a, b):
    """The exponent's share of the gradient is not lost; NaN where torch gives NaN (a < 0)."""
    a, b = np.array(a, np.float32), np.array(b, np.float32)
    x = np.ones_like(a)
    loss, grads = _ort_loss_and_grads(tmp_path, _two_params(a, b), _Power(), ["a", "b"], {"x": x})
    references = []
    for dtype in (torch.float32, torch.float64):
        ta, tb = (torch.tensor(v, dtype=dtype, requires_grad=True) for v in (a, b))
        tx = torch.tensor(x, dtype=dtype)
        expected = ((tx * ta) ** (tx + tb)).sum()
        expected.backward()
        references.append((expected.detach().numpy(), ta.grad.numpy(), tb.grad.numpy()))
    (loss32, a32, b32), (loss64, a64, b64) = references
    terms = np.abs(np.float64(a)) ** (
        1.0 + b
    )  # the |terms| of the sum (NaN where a base is negative)
    assert_close(loss, loss32, loss64, rtol=1e-6, scale=np.nansum(terms), name="loss")
    assert_close(grads["a"], a32, a64, rtol=1e-5, name="d/da")
    assert_close(grads["b"], b32, b64, rtol=1e-5, name="d/db")  # NaN at the same places


def test_power_with_only_the_exponent_trainable_matches_torch(tmp_path):
    a, b = np.array([0.5, 2.0, 3.0], np.float32), np.array([1.5, -0.5, 0.25], np.float32)
    model = _two_params(a, b)
    loss, grads = _ort_loss_and_grads(
        tmp_path, model, _Power(), ["b"], {"x": np.ones(3, np.float32)}
    )
    references = []
    for dtype in (torch.float32, torch.float64):
        tb = torch.tensor(b, dtype=dtype, requires_grad=True)
        expected = (torch.tensor(a, dtype=dtype) ** (1 + tb)).sum()
        expected.backward()
        references.append((expected.detach().numpy(), tb.grad.numpy()))
    (loss32, b32), (loss64, b64) = references
    assert_close(loss, loss32, loss64, rtol=1e-6, name="loss")  # a sum of positive terms
    assert_close(grads["b"], b32, b64, rtol=1e-5, name="d/db")


def test_power_rewrite_keeps_the_eval_model_and_pow_with_constant_exponent():
    a, b = np.array([0.5, 2.0], np.float32), np.array([1.0, 2.0], np.float32)
    with ob.base(_two_params(a, b)) as acc:
        squared = ReduceSum(keepdims=False)(value("ya") ** 2)
        acc.set_outputs([squared])
    graphs = build_training_graphs(acc.model, ["a"])
    assert graphs.rewrites["pow_exponent_as_exp_log"] == 0  # the exponent 2 needs no gradient
    with ob.base(_two_params(a, b)) as acc:
        acc.set_outputs([_Power()("ya", "yb")])
    graphs = build_training_graphs(acc.model, ["a", "b"])
    assert graphs.rewrites["pow_exponent_as_exp_log"] == 1
    assert "Pow" in {n.op_type for n in graphs.eval.graph.node}  # eval: the original op, exact


# ------------------------------------------------------------------ losses
def _loss_model(loss, shapes, dtypes=None):
    dtypes = dtypes or {}
    with ob.empty_base() as acc:
        for name, shape in shapes.items():
            acc.add_input(name, dtypes.get(name, TensorProto.FLOAT), shape)
        acc.set_outputs([loss(*shapes)])
    return acc.model


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_huber_with_infinite_delta_is_finite_like_torch(reduction):
    p = np.array([0.0, 1.0, -3.0, 100.0], np.float32)
    t = np.array([0.5, -1.0, 2.0, -100.0], np.float32)
    model = _loss_model(
        losses.HuberLoss(reduction=reduction, delta=float("inf")), {"p": [4], "t": [4]}
    )
    (got,) = run_model(model, {"p": p, "t": t})
    huber = torch.nn.HuberLoss(reduction=reduction, delta=float("inf"))
    expected, expected64 = (
        huber(torch.tensor(p), torch.tensor(t)),
        huber(torch.tensor(p).double(), torch.tensor(t).double()),
    )
    assert np.all(np.isfinite(got))
    assert_close(got, expected.numpy(), expected64.numpy(), rtol=RTOL)


def test_huber_delta_that_overflows_float16_is_finite():
    p = np.array([0.0, 1.0, -3.0], np.float16)
    t = np.zeros(3, np.float16)
    model = _loss_model(
        losses.HuberLoss(delta=1e6),
        {"p": [3], "t": [3]},
        {"p": TensorProto.FLOAT16, "t": TensorProto.FLOAT16},
    )
    (got,) = run_model(model, {"p": p, "t": t})
    assert_close(got, np.float16(0.5 * (1 + 9) / 3), 0.5 * (1 + 9) / 3, rtol=1e-3)


@pytest.mark.parametrize(
    ("cls", "name", "bad"), [(losses.HuberLoss, "delta", "1"), (losses.SmoothL1Loss, "beta", None)]
)
def test_loss_options_are_checked_by_type(cls, name, bad):
    with pytest.raises(TypeError, match=f"{cls.__name__}: {name} must be a real number, not"):
        cls(**{name: bad})
    with pytest.raises(ValueError, match=f"{cls.__name__}: {name} must be"):
        cls(**{name: float("nan")})


def test_smooth_l1_with_infinite_beta_is_zero_like_torch():
    p, t = np.array([0.0, 1.0, -3.0], np.float32), np.array([1.0, 1.0, 1.0], np.float32)
    (got,) = run_model(
        _loss_model(losses.SmoothL1Loss(beta=float("inf")), {"p": [3], "t": [3]}), {"p": p, "t": t}
    )
    expected = torch.nn.SmoothL1Loss(beta=float("inf"))(torch.tensor(p), torch.tensor(t))
    assert got == expected.item() == 0.0


@pytest.mark.parametrize("weight", [None, [1.0, 0.0, 2.0]])
@pytest.mark.parametrize("ignore_index", [1, 2])
def test_nll_none_gives_plus_zero_for_ignored_labels_like_torch(weight, ignore_index):
    """-(x * 0) is -0.0 for x >= 0 (and NaN for x = -inf); torch's ignored entries are +0.0."""
    log_probs = np.array(
        [[0.5, 1.5, 0.25], [2.0, 0.0, -1.0], [1.0, -np.inf, 3.0], [0.0, 4.0, 2.0]], np.float32
    )
    labels = np.array([1, 2, 1, 0])
    loss = losses.NLLLoss(reduction="none", ignore_index=ignore_index, weight=weight)
    model = _loss_model(loss, {"lp": [4, 3], "y": [4]}, {"y": TensorProto.INT64})
    (got,) = run_model(model, {"lp": log_probs, "y": labels})
    torch_weight = None if weight is None else torch.tensor(weight)
    expected = torch.nn.NLLLoss(reduction="none", ignore_index=ignore_index, weight=torch_weight)(
        torch.tensor(log_probs), torch.tensor(labels)
    ).numpy()
    np.testing.assert_array_equal(got, expected)  # NaN where torch's is NaN (weight 0 times -inf)
    numbers = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(expected[numbers]))


# ------------------------------------------------------------------ Value arithmetic
def _values(build, inputs):
    with ob.empty_base() as acc:
        handles = {
            name: acc.add_input(name, elem, list(array.shape))
            for name, (elem, array) in inputs.items()
        }
        acc.set_outputs(list(build(**handles)))
    outs = run_model(acc.model, {name: array for name, (_, array) in inputs.items()})
    return outs


def test_integer_value_times_a_float_is_promoted_like_torch():
    labels = np.array([1, 2, 3], np.int64)
    mask = np.array([True, False, True])
    got = _values(
        lambda i, m: [i * 0.5, i / 2, 0.5 * i, i + 1, m + 1, i**0.5],
        {"i": (TensorProto.INT64, labels), "m": (TensorProto.BOOL, mask)},
    )
    ti, tm = torch.tensor(labels), torch.tensor(mask)
    for out, expected in zip(
        got, [ti * 0.5, ti / 2, 0.5 * ti, ti + 1, tm + 1, ti**0.5], strict=True
    ):
        assert out.dtype == expected.numpy().dtype
        np.testing.assert_array_equal(out, expected.numpy())


def test_numpy_scalars_and_arrays_on_either_side_of_a_value():
    v = np.array([1.0, 2.0, 3.0], np.float32)
    got = _values(
        lambda v: [
            np.float32(0.5) * v,
            np.ones(3) + v,
            v * np.float64(2),
            np.int64(2) - v,
            np.arange(3.0) / (v + 1),
        ],
        {"v": (TensorProto.FLOAT, v)},
    )

    def expected(v):  # the constants in v's type, as the Value's type wins
        one, two, half = (v.dtype.type(c) for c in (1, 2, 0.5))
        return [half * v, one + v, two * v, two - v, np.arange(3, dtype=v.dtype) / (v + one)]

    for out, want, want64 in zip(got, expected(v), expected(v.astype(np.float64)), strict=True):
        assert out.dtype == np.float32  # the Value's type wins over a float64 constant
        assert_close(out, want, want64, rtol=RTOL)


def test_values_of_two_types_are_promoted():
    got = _values(
        lambda h, f, i: [h * f, i + f, f / i],
        {
            "h": (TensorProto.FLOAT16, np.array([1, 2], np.float16)),
            "f": (TensorProto.FLOAT, np.array([0.5, 4], np.float32)),
            "i": (TensorProto.INT64, np.array([2, 8], np.int64)),
        },
    )
    assert [g.dtype for g in got] == [np.float32] * 3
    assert_equal(got[0], np.float32([0.5, 8]))  # exact: dyadic numbers
    assert_equal(got[2], np.float32([0.25, 0.5]))


def test_integer_constant_that_does_not_fit_is_refused():
    with ob.empty_base() as acc:
        small = acc.add_input("small", TensorProto.INT32, [2])
        with pytest.raises(
            ValueError, match=r"constant 3000000000 does not fit int32 Value 'small'.*Cast"
        ):
            small * 3_000_000_000
    with ob.empty_base() as acc:
        v = acc.add_input("v", TensorProto.FLOAT, [2])
        with pytest.raises(TypeError, match="unsupported operand"):
            v * {"a": 1}
        with pytest.raises(TypeError, match="not a rectangular array"):
            v * [[1, 2], [3]]


# ------------------------------------------------------------------ control flow and constant losses
def _if_model(branch_reads: str) -> onnx.ModelProto:
    then_g = helper.make_graph(
        [helper.make_node("Mul", [branch_reads, branch_reads], ["t"])], "then", [], [_vi("t", [3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", [branch_reads], ["e"])], "else", [], [_vi("e", [3])]
    )
    return _model(
        [
            helper.make_node("Mul", ["x", "W"], ["xw"]),
            helper.make_node(
                "If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"
            ),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        [_vi("x", [3]), _vi("c", [], TensorProto.BOOL)],
        [_vi("loss", [])],
        [numpy_helper.from_array(np.ones(3, np.float32), "W")],
    )


def test_if_reading_values_of_trainable_parameters_is_a_gradient_error_not_a_crash(tmp_path):
    """ONNX Runtime's gradient builder aborts the process (SIGABRT) on this model; checked in a subprocess."""
    model = tmp_path / "if.onnx"
    onnx.save(_if_model("xw"), model)
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import onnxblocks
        try:
            onnxblocks.generate_artifacts({str(model)!r}, requires_grad=["W"], artifact_directory={str(out)!r})
        except onnxblocks.errors.GradientError as exc:
            print("GradientError:", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "GradientError: ONNX Runtime cannot differentiate control flow: If node 'branch' reads ['xw']"
        in done.stdout
    )
    assert "trainable ['W']" in done.stdout and "frozen_params" in done.stdout
    assert not out.exists()


def test_if_over_frozen_parameters_or_inputs_only_builds():
    graphs = build_training_graphs(
        _if_model("x"), [], ["W"]
    )  # W frozen: nothing to differentiate through If
    assert "If" in {n.op_type for n in graphs.training.graph.node}


def test_loop_over_parameters_is_a_gradient_error():
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [3])],
    )
    model = _model(
        [
            helper.make_node("Mul", ["x", "W"], ["xw"]),
            helper.make_node("Loop", ["n", "", "x"], ["y"], body=body),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        [_vi("x", [3]), _vi("n", [], TensorProto.INT64)],
        [_vi("loss", [])],
        [numpy_helper.from_array(np.ones(3, np.float32), "W")],
    )
    with pytest.raises(
        GradientError, match=r"Loop node \(unnamed, writing 'y'\) reads \['xw'\].*\['W'\]"
    ):
        build_training_graphs(model, ["W"])


@pytest.mark.parametrize(
    "loss_nodes",
    [
        [
            helper.make_node(
                "Constant", [], ["loss"], value=numpy_helper.from_array(np.array(1.0, np.float32))
            )
        ],
        [  # through W's shape only: no gradient flows
            helper.make_node("Shape", ["W"], ["s"]),
            helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["sf"], ["loss"], keepdims=0),
        ],
    ],
)
def test_constant_loss_is_a_gradient_error_naming_it(loss_nodes):
    model = _model(
        [*loss_nodes, helper.make_node("Mul", ["x", "W"], ["y"])],
        [_vi("x", [3])],
        [_vi("loss", []), _vi("y", [3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "W")],
    )
    with pytest.raises(
        GradientError,
        match=r"loss 'loss' does not depend on any value that requires a gradient \(\['W'\]\).*constant",
    ):
        build_training_graphs(model, ["W"])


# ------------------------------------------------------------------ models
def _mse(model, tmp_path, **kwargs):
    kwargs.setdefault("requires_grad", ["W", "b"])
    return generate_artifacts(
        model, loss=LossType.MSELoss, artifact_directory=tmp_path / "out", **kwargs
    )


def test_model_without_opset_import_is_refused(tmp_path):
    model = make_linear_model()
    del model.opset_import[:]
    with pytest.raises(
        ValueError, match=r"no opset_import for the ai.onnx domain.*make_opsetid\('', 17\)"
    ):
        _mse(model, tmp_path)
    with pytest.raises(ValueError, match="no opset_import"):
        with ob.base(model):
            pass
    assert not (tmp_path / "out").exists()


def test_unsorted_nodes_are_sorted_on_a_copy(tmp_path):
    model = make_linear_model()
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    before = model.SerializeToString()
    art = _mse(model, tmp_path)
    assert model.SerializeToString() == before  # the caller's model is not changed
    sorted_model = make_linear_model()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    target = np.zeros((2, 4), np.float32)
    (loss, *_) = models.OrtTrainer(art, optimizer=False).train_step(x, target)
    _assert_mean_square(loss, run_model(sorted_model, {"x": x})[0])


def _assert_mean_square(loss, y: np.ndarray) -> None:
    """The MSE loss against a zero target: mean(y ** 2) of the forward's output, in float32 and float64."""
    assert_close(loss, np.mean(y**2), np.mean(y.astype(np.float64) ** 2), rtol=1e-5, name="loss")


def test_cyclic_nodes_are_refused_naming_them():
    model = _model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="first"),
            helper.make_node("Relu", ["a"], ["b"], name="second"),
        ],
        [_vi("x", [2])],
        [_vi("a", [2])],
    )
    with pytest.raises(ValueError, match=r"read each other in a cycle.*\['first', 'second'\]"):
        with ob.base(model):
            pass


def test_unknown_rank_of_an_input_is_named(tmp_path):
    model = make_linear_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    model.graph.output[0].type.tensor_type.ClearField("shape")
    with pytest.raises(
        ValueError, match=r"graph inputs \['x'\] of the training model have no shape.*symbolic dims"
    ):
        generate_artifacts(
            model, requires_grad=["W"], loss=_MeanLoss(), artifact_directory=tmp_path / "out"
        )
    assert not (tmp_path / "out").exists()


class _MeanLoss(ob.Block):
    def build(self, y):
        return ob.blocks.ReduceMean(keepdims=False)(y)


def test_unknown_rank_of_an_output_is_inferred(tmp_path):
    model = make_linear_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")  # inference knows it: [N, 4]
    art = generate_artifacts(
        model,
        requires_grad=["W"],
        loss=_MeanLoss(),
        artifact_directory=tmp_path,
        additional_output_names=["y"],
    )
    outputs = {o.name: o for o in onnx.load(art.eval_model).graph.output}
    assert [d.dim_param or d.dim_value for d in outputs["y"].type.tensor_type.shape.dim] == ["N", 4]


@pytest.mark.parametrize(
    ("version", "error"), [(-1, ValueError), (0, ValueError), ("17", TypeError), (22, ValueError)]
)
def test_empty_base_checks_its_opset(version, error):
    with pytest.raises(error, match="opset"):
        with ob.empty_base(opset_version=version):
            pass


def test_model_above_opset_21_is_converted_down(tmp_path):
    model = make_linear_model(opset=23)
    art = _mse(model, tmp_path, optimizer=OptimType.AdamW)
    for path in (art.training_model, art.eval_model, art.optimizer_model):
        assert {o.domain: o.version for o in onnx.load(path).opset_import}[""] == 21
    assert model.opset_import[0].version == 23
    x = np.ones((2, 8), np.float32)
    (loss, *_) = models.OrtTrainer(art).train_step(x, np.zeros((2, 4), np.float32))
    _assert_mean_square(loss, run_model(make_linear_model(), {"x": x})[0])


def test_model_above_opset_21_with_an_op_that_cannot_go_down_names_it(tmp_path):
    model = _model(
        [
            helper.make_node("RMSNormalization", ["x", "s"], ["h"]),
            helper.make_node("Relu", ["h"], ["y"]),
        ],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "s")],
        opset=23,
    )
    with pytest.raises(
        ValueError,
        match=r"opset 23; it cannot be converted to opset 21.*RMSNormalization\. Re-export",
    ):
        generate_artifacts(
            model, requires_grad=["s"], loss=LossType.MSELoss, artifact_directory=tmp_path / "out"
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("opset", [9, 10, 11])
def test_old_opset_with_cross_entropy_is_converted_before_the_loss(tmp_path, opset):
    model = make_linear_model(opset=opset)
    art = generate_artifacts(
        model, requires_grad=["W", "b"], loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path
    )
    assert {o.domain: o.version for o in onnx.load(art.eval_model).opset_import}[""] == 13
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    labels = np.array([0, 3, 1, 2, 3])
    (loss, *_) = models.OrtTrainer(art, optimizer=False).train_step(x, labels)
    logits = torch.tensor(run_model(make_linear_model(), {"x": x})[0])
    expected, expected64 = (
        torch.nn.functional.cross_entropy(t, torch.tensor(labels))
        for t in (logits, logits.double())
    )
    assert_close(loss, expected.numpy(), expected64.numpy(), rtol=1e-5, name="loss")


def test_eval_model_keeps_dropouts_training_mode_slot_empty(tmp_path):
    model = _model(
        [
            helper.make_node(
                "Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.5, np.float32))
            ),
            helper.make_node(
                "Constant", [], ["train"], value=numpy_helper.from_array(np.array(True))
            ),
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Dropout", ["h", "ratio", "train"], ["y", "mask"]),
        ],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 2])],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "W")],
    )
    art = generate_artifacts(
        model, requires_grad=["W"], loss=LossType.MSELoss, artifact_directory=tmp_path
    )
    (dropout,) = [n for n in onnx.load(art.eval_model).graph.node if n.op_type == "Dropout"]
    assert list(dropout.input) == ["h", "ratio", ""]  # as the reference leaves it
    (loss,) = models.OrtTrainer(art, optimizer=False).eval_step(
        np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32)
    )
    assert loss == 9.0  # no dropout in eval mode: (1+1+1)**2


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"artifact_directory": 3},
            TypeError,
            r"artifact_directory must be a path \(str or os.PathLike\), not int",
        ),
        ({"artifact_directory": "a\0b"}, ValueError, "artifact_directory .* NUL character"),
        ({"prefix": 5}, TypeError, "prefix must be a str, not int"),
        ({"prefix": "a\0"}, ValueError, "prefix .* NUL character"),
        (
            {"prefix": "p" * 240},
            ValueError,
            r"prefix 'p+'\.\.\. is 240 bytes long.*at most 2\d\d bytes",
        ),
        ({"prefix": ".onnxblocks-artifacts-1"}, ValueError, "staging directories"),
        ({"requires_grad": "W"}, TypeError, r"requires_grad must be a list of names.*\['W'\]"),
        ({"requires_grad": [""]}, ValueError, "requires_grad contains an empty name"),
        ({"frozen_params": 3}, TypeError, "frozen_params must be a list of names, not int"),
        (
            {"additional_output_names": "y"},
            TypeError,
            "additional_output_names must be a list of names",
        ),
        ({"ort_format": "no"}, TypeError, "ort_format must be True or False, not str"),
        ({"nominal_checkpoint": 1}, TypeError, "nominal_checkpoint must be True or False, not int"),
        ({"custom_op_library": 7}, TypeError, "custom_op_library must be a path"),
        ({"model_path": 1.5}, TypeError, "model_path must be a path"),
    ],
)
def test_generate_artifacts_arguments_are_checked_by_type_and_value(tmp_path, kwargs, error, match):
    kwargs.setdefault("requires_grad", ["W"])
    kwargs.setdefault("artifact_directory", tmp_path / "out")
    with pytest.raises(error, match=match):
        generate_artifacts(make_linear_model(), loss=LossType.MSELoss, **kwargs)
    assert os.listdir(tmp_path) == []


def test_paths_that_are_not_directories_or_files(tmp_path):
    model = make_linear_model()
    afile = tmp_path / "file"
    afile.write_text("x")
    for directory in (afile, afile / "below"):
        with pytest.raises(
            NotADirectoryError, match=r"artifact_directory: .*(is a file|not a directory)"
        ):
            generate_artifacts(
                model, requires_grad=["W"], loss=LossType.MSELoss, artifact_directory=directory
            )
    with pytest.raises(IsADirectoryError, match=r"model '.*' is a directory; pass the .onnx file"):
        generate_artifacts(tmp_path, requires_grad=["W"], artifact_directory=tmp_path / "out")
    with pytest.raises(NotADirectoryError, match="a directory on its path is a file"):
        generate_artifacts(
            afile / "m.onnx", requires_grad=["W"], artifact_directory=tmp_path / "out"
        )
    with pytest.raises(IsADirectoryError, match="custom_op_library .* is a directory"):
        generate_artifacts(
            model,
            requires_grad=["W"],
            custom_op_library=tmp_path,
            artifact_directory=tmp_path / "o",
        )
    with pytest.raises(
        TypeError, match="not bytes: parse serialized bytes first with onnx.load_from_string"
    ):
        generate_artifacts(
            model.SerializeToString(), requires_grad=["W"], artifact_directory=tmp_path / "out"
        )
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(
    not hasattr(os, "mkfifo"), reason="named pipes are POSIX"
)  # Windows has none to test
def test_model_path_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"model '.*model.onnx' is not a regular file"):
        generate_artifacts(fifo, requires_grad=["W"], artifact_directory=tmp_path / "out")


@pytest.mark.parametrize(
    "content", [b"", b"\x08\x07garbage\xff\xff\xff", b"not an onnx model at all"]
)
def test_bad_model_file_is_a_clear_error_naming_it(tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    with pytest.raises(
        ValueError, match=r"'.*bad\.onnx' (is empty|is not a valid ONNX model file)"
    ) as info:
        generate_artifacts(bad, requires_grad=["W"], artifact_directory=tmp_path / "out")
    assert "DecodeError" not in type(info.value).__name__
    assert sorted(os.listdir(tmp_path)) == ["bad.onnx"]


@contextlib.contextmanager
def _unwritable_directory(tmp_path):
    """A directory this process really cannot create files in: mode 0o555, or immutable (``chattr +i``) as root.

    Root ignores permission bits; where ``chattr`` is refused, /sys (read-only for root) is used. Fails, never
    skips, when neither works.
    """
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    immutable = False
    if os.name == "posix" and os.geteuid() == 0:
        immutable = (
            subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode == 0
        )
        if not immutable:
            target = Path("/sys")
    try:
        probe = target / "probe"
        try:
            probe.write_text("x")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.fail(
                f"could not make a directory this process cannot write into (tried {target})"
            )
        yield target
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(target)], check=True)
        if target != Path("/sys"):
            target.chmod(0o755)


def test_read_only_directory_is_found_before_the_work(tmp_path, monkeypatch):
    built = []
    real_build = ob.TrainingBlock.__call__
    monkeypatch.setattr(
        ob.TrainingBlock,
        "__call__",
        lambda self, *a, **k: built.append(1) or real_build(self, *a, **k),
    )
    with _unwritable_directory(tmp_path) as target:
        before = sorted(os.listdir(target))
        with pytest.raises(
            PermissionError,
            match=r"artifact_directory: cannot write .* is read-only\. Choose a writable",
        ):
            generate_artifacts(
                make_linear_model(),
                requires_grad=["W"],
                loss=LossType.MSELoss,
                artifact_directory=target,
            )
        assert sorted(os.listdir(target)) == before
        with pytest.raises(PermissionError, match="is read-only"):
            generate_artifacts(
                make_linear_model(),
                requires_grad=["W"],
                loss=LossType.MSELoss,
                artifact_directory=target / "new" / "dir",
            )
    assert built == []  # refused before the gradient was built

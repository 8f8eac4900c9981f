"""ScriptBlock: onnxscript functions inlined into the model, checked numerically and through ORT's gradient."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxscript import opset17 as op17
from onnxscript import opset18 as op18
from onnxscript import script
from support.numerics import assert_close, assert_equal
from support.onnx_models import run_model

import onnxblocks
from onnxblocks import losses
from onnxblocks.blocks.script import ScriptBlock, from_onnxscript
from onnxblocks.errors import UnknownNameError

RTOL = 1e-5


@script(default_opset=op18)
def weighted(a, b):
    return 0.4 * a + 0.6 * b


@script(default_opset=op17)
def scaled_mse(pred, target, scale: float = 1.0):
    diff = pred - target
    return op17.ReduceMean(diff * diff, keepdims=0) * scale


@script(default_opset=op18)
def log_cosh(pred, target):
    """A custom loss: mean(log(cosh(d))), written with exp so ORT can differentiate it."""
    d = pred - target
    return op18.ReduceMean(op18.Log((op18.Exp(d) + op18.Exp(-d)) * 0.5), keepdims=0)


@script(default_opset=op18)
def halve(x):
    return x * 0.5


@script(default_opset=op18)
def halve_sum(x, y):
    return halve(x) + halve(y)


@script(default_opset=op18)
def leaky(x, alpha: float = 0.1):
    return op18.LeakyRelu(x, alpha=alpha)


@script(default_opset=op18)
def needs_alpha(x, alpha: float):
    return op18.LeakyRelu(x, alpha=alpha)


@script(default_opset=op18)
def min_max(x):
    return op18.ReduceMin(x, keepdims=0), op18.ReduceMax(x, keepdims=0)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_weighted_sum_of_two_losses() -> None:
    rng = _rng()
    a, b, t1, t2 = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4))
    with onnxblocks.empty_base() as acc:
        acc.add_input("a", TensorProto.FLOAT, ["N", 3])
        acc.add_input("b", TensorProto.FLOAT, ["N", 3])
        total = ScriptBlock(weighted)(losses.MSELoss()("a", "t1"), losses.L1Loss()("b", "t2"))
        acc.set_outputs([total])
    model = acc.finish()
    assert isinstance(total, onnxblocks.Value) and total.startswith("weighted.")
    assert not model.functions, "the function is inlined, not referenced"
    (got,) = run_model(model, {"a": a, "b": b, "t1": t1, "t2": t2})

    def expected(a, b, t1, t2):
        return 0.4 * np.mean((a - t1) ** 2) + 0.6 * np.mean(np.abs(b - t2))

    assert_close(
        got,
        expected(a, b, t1, t2),
        expected(*(v.astype(np.float64) for v in (a, b, t1, t2))),
        rtol=RTOL,
    )


@pytest.mark.parametrize(
    ("function", "torch_loss"),
    [
        (log_cosh, lambda p, t: torch.mean(torch.log(torch.cosh(p - t)))),
        (scaled_mse, lambda p, t: 2.5 * torch.nn.functional.mse_loss(p, t)),
    ],
    ids=["log_cosh", "scaled_mse"],
)
def test_custom_loss_value_and_ort_gradient(function, torch_loss) -> None:
    """A loss written in onnxscript: its value and its ORT-built gradient equal torch's."""
    from onnxruntime.capi import _pybind_state as C

    rng = _rng()
    w = rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    target = rng.standard_normal((5, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(w, "W")],
    )
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    attrs = {"scale": 2.5} if function is scaled_mse else {}
    with onnxblocks.base(base) as acc:
        acc.add_input("target", TensorProto.FLOAT, ["N", 2])
        loss = from_onnxscript(function, **attrs)("y", "target")
        acc.set_outputs([loss])
    model = acc.finish()
    assert "CastLike" not in {n.op_type for n in model.graph.node}
    (value,) = run_model(model, {"x": x, "target": target})

    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [3, 2]))
    del model.graph.initializer[:]
    builder = C.GradientGraphBuilder(
        model.SerializeToString(), {loss}, {"W"}, loss, C.SessionOptions()
    )
    builder.build()
    (grad,) = run_model(
        onnx.load_from_string(builder.get_model()), {"x": x, "target": target, "W": w}, ["W_grad"]
    )

    references = {}
    for dtype in (torch.float32, torch.float64):
        tw = torch.tensor(w, dtype=dtype, requires_grad=True)
        tx = torch.from_numpy(x).to(dtype)
        y = tx @ tw
        expected = torch_loss(y, torch.from_numpy(target).to(dtype))
        dw, dy = torch.autograd.grad(expected, [tw, y])
        # dW = x^T dy: the sum of |terms| of each element is |x|^T |dy|
        references[dtype] = (expected.detach().numpy(), dw.numpy(), (tx.abs().T @ dy.abs()).numpy())
    (value32, grad32, _), (value64, grad64, terms) = (
        references[torch.float32],
        references[torch.float64],
    )
    assert_close(value, value32, value64, rtol=RTOL, name="loss")
    assert_close(grad, grad32, grad64, rtol=1e-4, scale=terms, name="W_grad")


def test_nested_function_calls_are_inlined() -> None:
    x, y = _rng().standard_normal((2, 4)).astype(np.float32)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [4])
        acc.add_input("y", TensorProto.FLOAT, [4])
        out = ScriptBlock(halve_sum)("x", "y")
        acc.set_outputs([out])
    model = acc.finish()
    assert {n.domain for n in model.graph.node} == {""} and not model.functions
    (got,) = run_model(model, {"x": x, "y": y})
    assert_close(got, 0.5 * x + 0.5 * y, 0.5 * x.astype(np.float64) + 0.5 * y, rtol=RTOL)


@pytest.mark.parametrize(
    ("attrs", "alpha"), [({}, 0.1), ({"alpha": 0.3}, 0.3), ({"alpha": 2}, 2.0)]
)
def test_attributes_are_substituted(attrs, alpha) -> None:
    x = np.array([-2.0, -0.5, 1.0], dtype=np.float32)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [3])
        out = ScriptBlock(leaky, **attrs)("x")
        acc.set_outputs([out])
    node = next(n for n in acc.model.graph.node if n.op_type == "LeakyRelu")
    assert not any(a.ref_attr_name for a in node.attribute)
    (got,) = run_model(acc.finish(), {"x": x})
    x64 = x.astype(np.float64)
    assert_close(
        got,
        np.where(x > 0, x, np.float32(alpha) * x),
        np.where(x64 > 0, x64, alpha * x64),
        rtol=RTOL,
    )


def test_the_same_function_twice_gets_fresh_names() -> None:
    x = _rng().standard_normal(4).astype(np.float32)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [4])
        first = ScriptBlock(halve)("x")
        second = ScriptBlock(halve)(first)
        acc.set_outputs([second])
    assert first != second
    outputs = [o for n in acc.model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))
    (got,) = run_model(acc.finish(), {"x": x})
    assert_equal(got, x / 4)  # halving twice is exact


def test_several_outputs_are_a_tuple() -> None:
    x = np.array([3.0, -1.0, 2.0], dtype=np.float32)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [3])
        low, high = ScriptBlock(min_max)("x")
        acc.set_outputs([low, high])
    got = run_model(acc.finish(), {"x": x})
    assert_equal(np.array(got), np.float32([-1.0, 3.0]))


def test_function_proto_with_library() -> None:
    """A plain onnx.FunctionProto (and the functions it calls) works too."""
    inner = helper.make_function(
        "lib",
        "twice",
        ["v"],
        ["r"],
        [helper.make_node("Add", ["v", "v"], ["r"])],
        [helper.make_opsetid("", 17)],
    )
    outer = helper.make_function(
        "lib",
        "four_times",
        ["v"],
        ["r"],
        [
            helper.make_node("twice", ["v"], ["t"], domain="lib"),
            helper.make_node("twice", ["t"], ["r"], domain="lib"),
        ],
        [helper.make_opsetid("", 17), helper.make_opsetid("lib", 1)],
    )
    with onnxblocks.empty_base(17) as acc:
        acc.add_input("x", TensorProto.FLOAT, [2])
        out = ScriptBlock(outer, functions=[inner])("x")
        acc.set_outputs([out])
    model = acc.finish()
    assert {o.domain for o in model.opset_import} <= {"", "com.microsoft"}
    (got,) = run_model(model, {"x": np.array([1.0, -2.0], dtype=np.float32)})
    assert_equal(got, np.float32([4.0, -8.0]))


# ------------------------------------------------------------------ errors
def test_function_needing_newer_opset() -> None:
    with onnxblocks.empty_base(17) as acc:
        acc.add_input("a", TensorProto.FLOAT, [2])
        with pytest.raises(
            ValueError,
            match=r"'weighted' uses ai.onnx opset 18, but the model imports opset 17.*"
            r"opset17 as op",
        ):
            ScriptBlock(weighted)("a", "a")


def test_older_function_on_newer_model() -> None:
    """A function written for opset 17 runs on an opset-21 model when its ops are unchanged."""
    with onnxblocks.empty_base(21) as acc:
        acc.add_input("p", TensorProto.FLOAT, [3])
        acc.add_input("t", TensorProto.FLOAT, [3])
        out = ScriptBlock(scaled_mse, scale=2.0)("p", "t")
        acc.set_outputs([out])
    (got,) = run_model(acc.finish(), {"p": np.ones(3, np.float32), "t": np.zeros(3, np.float32)})
    assert_equal(got, np.float32(2.0))


def test_wrong_number_of_inputs() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("a", TensorProto.FLOAT, [2])
        with pytest.raises(
            TypeError, match=r"function 'weighted' takes 2 input\(s\) \(a, b\) but was given 1"
        ):
            ScriptBlock(weighted)("a")


def test_unknown_input_name() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("a", TensorProto.FLOAT, [2])
        with pytest.raises(UnknownNameError, match=r"'b' is not a value"):
            ScriptBlock(weighted)("a", "b")


def test_unknown_and_missing_attributes() -> None:
    with pytest.raises(TypeError, match=r"unknown attribute 'alhpa'. Did you mean 'alpha'"):
        ScriptBlock(leaky, alhpa=0.2)
    with pytest.raises(TypeError, match=r"\['alpha'\] have no default"):
        ScriptBlock(needs_alpha)
    with pytest.raises(TypeError, match=r"attribute 'alpha' must be float"):
        ScriptBlock(leaky, alpha="big")


def test_not_a_function() -> None:
    def plain(a, b):
        return a + b

    with pytest.raises(
        TypeError, match=r"not function plain. Decorate it with @onnxscript.script\(\)"
    ):
        ScriptBlock(plain)


def test_import_onnxblocks_does_not_import_onnxscript() -> None:
    code = (
        "import sys, onnxblocks, onnxblocks.losses, onnxblocks.blocks.script; "
        "print(sorted(m for m in ('onnxscript', 'onnxruntime', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"

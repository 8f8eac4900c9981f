"""onnxblocks.torch.onnx_function / OnnxModule: ONNX graphs as autograd Functions, against torch autograd.

Outputs and gradients (of the weights and of the inputs) must equal torch's by
``support.numerics`` (rtol ``RTOL`` of torch in float32, or torch float32's own rounding
against torch in float64, plus the floor) for an MLP, a CNN with BatchNorm and Dropout (eval), a
GPT-style transformer, an LSTM and a model with two outputs of which the loss
uses one, exported with both torch exporters.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from support import models
from support.numerics import assert_close

from onnxblocks.errors import GradientError, UnknownNameError
from onnxblocks.torch import OnnxModule, _interop, onnx_function

RTOL = 1e-5
EXPORTERS = ("torchscript", "dynamo")


@functools.cache
def _case(
    name: str, exporter: str
) -> tuple[torch.nn.Module, dict[str, np.ndarray], onnx.ModelProto]:
    """(torch model in the mode the graph computes, inputs, ONNX export)."""
    if name in (
        "mlp",
        "gpt",
        "lstm",
    ):  # shared training-mode exports (these families behave alike in eval)
        case = models.case(name, exporter)
        return copy.deepcopy(case.torch_model).train(), case.inputs, case.onnx_model
    if name == "cnn":
        model, inputs, _, _ = models.family("cnn")
        model.drop.p = 0.5
    else:
        torch.manual_seed(0)
        model = models.TwoHeads()
        inputs = {"x": np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)}
    model.eval()
    return model, inputs, models.export(model, inputs, exporter, train_mode=False)


def _torch_gradients(model, inputs, grads, n_used, dtype=torch.float32):
    """torch's outputs and gradients, run in ``dtype`` (float64: the float64 reference) from the same values."""
    model = copy.deepcopy(model).to(dtype)
    xs = [torch.from_numpy(v.copy()) for v in inputs.values()]
    xs = [x.to(dtype).requires_grad_() if x.is_floating_point() else x for x in xs]
    outs = model(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum((o * g.to(dtype)).sum() for o, g in zip(outs[:n_used], grads, strict=True)).backward()
    params = {n: p.grad for n, p in model.named_parameters()}
    return [o.detach() for o in outs], params, [x.grad for x in xs]


def _assert_close(actual, expected, expected64, what):
    """``support.numerics.assert_close``; a gradient one side leaves None is zeros."""
    if actual is None and expected is None:
        return
    actual = torch.zeros_like(expected) if actual is None else actual
    expected = torch.zeros_like(actual) if expected is None else expected
    expected64 = (
        torch.zeros_like(expected, dtype=torch.float64) if expected64 is None else expected64
    )
    assert_close(actual, expected, expected64, rtol=RTOL, name=what)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "lstm", "two_heads"])
def test_function_gradients_match_torch(name, exporter):
    model, inputs, onnx_model = _case(name, exporter)
    params = [n for n, _ in model.named_parameters()]
    order = params[::-1]  # any order: the caller's is kept
    function = onnx_function(onnx_model, order)
    assert function.weight_names == tuple(order)
    torch.manual_seed(1)
    xs = [torch.from_numpy(v.copy()) for v in inputs.values()]
    for x in xs:
        x.requires_grad_(x.is_floating_point())
    named = dict(model.named_parameters())
    weights = [named[n].detach().clone().requires_grad_(True) for n in order]
    result = function.apply(*xs, *weights)
    outs = result if isinstance(result, tuple) else (result,)
    n_used = 1  # the second output of TwoHeads gets no gradient
    grads = [torch.randn_like(o) for o in outs[:n_used]]
    sum((o * g).sum() for o, g in zip(outs[:n_used], grads, strict=True)).backward()

    expected_outs, expected_params, expected_inputs = _torch_gradients(model, inputs, grads, n_used)
    outs64, params64, inputs64 = _torch_gradients(model, inputs, grads, n_used, torch.float64)
    for i, (out, expected, expected64) in enumerate(zip(outs, expected_outs, outs64, strict=True)):
        _assert_close(out, expected, expected64, f"output {i}")
    for n, w in zip(order, weights, strict=True):
        _assert_close(w.grad, expected_params[n], params64[n], n)
    for x, expected, expected64 in zip(xs, expected_inputs, inputs64, strict=True):
        _assert_close(x.grad, expected, expected64, "input")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_module_holds_initializers_as_parameters(exporter):
    model, inputs, onnx_model = _case("cnn", exporter)
    names = [n for n, _ in model.named_parameters()]
    module = OnnxModule(onnx_model, names)
    assert [
        n for n, _ in module.named_parameters()
    ] == names  # fc1.weight is child fc1's parameter weight
    x = torch.from_numpy(inputs["x"])
    out = module(x=x)  # by graph input name
    target = torch.from_numpy(models.family("cnn")[2])
    torch.nn.functional.cross_entropy(out, target).backward()
    reference, reference64 = copy.deepcopy(model), copy.deepcopy(model).double()
    torch.nn.functional.cross_entropy(reference(x), target).backward()
    torch.nn.functional.cross_entropy(reference64(x.double()), target).backward()
    for (n, p), q, q64 in zip(
        module.named_parameters(), reference.parameters(), reference64.parameters(), strict=True
    ):
        _assert_close(p.grad, q.grad, q64.grad, n)
    before = [p.detach().clone() for p in module.parameters()]
    torch.optim.SGD(module.parameters(), lr=0.1).step()  # any torch optimizer trains them
    assert all(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_no_grad_runs_the_forward_graph_only():
    model, inputs, onnx_model = _case("mlp", "dynamo")
    module = OnnxModule(onnx_model, [n for n, _ in model.named_parameters()])
    x = torch.from_numpy(inputs["x"])
    with torch.no_grad():
        out = module(x)
    assert not out.requires_grad
    _assert_close(
        out, model(x).detach(), copy.deepcopy(model).double()(x.double()).detach(), "output"
    )
    compiled = module.function.program.compiled(frozenset())
    assert compiled.backward is None and compiled.split is None


def _tiny(op: str = "Tanh") -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "W")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
            helper.make_node(op, ["h"], ["y"], name="act"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bad_names_dtypes_and_shapes_are_named():
    model = _tiny()
    with pytest.raises(UnknownNameError, match=r"'w' is not an initializer.*Did you mean 'W'"):
        onnx_function(model, ["w"])
    with pytest.raises(UnknownNameError, match="'y2' is not a graph output"):
        onnx_function(model, ["W"], outputs=["y2"])
    with pytest.raises(UnknownNameError, match="'z' is not a graph input"):
        onnx_function(model, ["W"], inputs=["z"])
    with pytest.raises(ValueError, match="lists \\['W'\\] more than once"):
        onnx_function(model, ["W", "W"])
    function = onnx_function(model, ["W"])
    w = torch.ones(4, 3, requires_grad=True)
    with pytest.raises(TypeError, match="'x' is torch.float64, but the graph declares it float"):
        function.apply(torch.ones(2, 4, dtype=torch.float64), w)
    with pytest.raises(
        ValueError, match=r"'x' has shape \[2, 5\], but the graph declares \['\?', 4\]"
    ):
        function.apply(torch.ones(2, 5), w)
    with pytest.raises(ValueError, match=r"'W' has shape \[3, 4\]"):
        function.apply(torch.ones(2, 4), torch.ones(3, 4))
    with pytest.raises(TypeError, match="Expected 1 input"):
        function.apply(torch.ones(2, 4))


def test_an_op_without_gradient_is_named():
    with pytest.raises(GradientError, match="node 'act': op Tan .* has no gradient builder"):
        onnx_function(_tiny("Tan"), ["W"])


def test_double_backward_and_second_backward_say_so():
    function = onnx_function(_tiny(), ["W"])
    w = torch.ones(4, 3, requires_grad=True)
    y = function.apply(torch.ones(2, 4), w)
    with pytest.raises(RuntimeError, match="Double backward"):
        torch.autograd.grad(y.sum(), w, create_graph=True)
    y = function.apply(torch.ones(2, 4), w)
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="freed by the first backward"):
        y.sum().backward()
    y = function.apply(torch.ones(2, 4), w)
    y.mul_(2)  # Tanh's gradient reads y: torch's version counter catches the change
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_model_is_not_mutated_and_paths_load(tmp_path):
    model = _tiny()
    before = model.SerializeToString()
    function = onnx_function(model, ["W"])
    function.apply(
        torch.ones(2, 4, requires_grad=True), torch.ones(4, 3, requires_grad=True)
    ).sum().backward()
    assert model.SerializeToString() == before
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    module = OnnxModule(path, ["W"])
    w = module.W.detach()
    want, want64 = (
        torch.tanh(torch.ones(2, 4) @ w),
        torch.tanh(torch.ones(2, 4, dtype=torch.float64) @ w.double()),
    )
    _assert_close(module(torch.ones(2, 4)), want, want64, "output")


def test_running_statistics_fed_by_the_caller_are_not_written():
    """ONNX Runtime's training-mode BatchNorm writes into its running-statistics inputs; ours get copies."""
    case = models.case(
        "cnn", "torchscript"
    )  # training-mode export: BatchNormalization training_mode=1
    stats = ["bn.running_mean", "bn.running_var"]
    function = onnx_function(case.onnx_model, [*case.params, *stats])
    named = dict(case.torch_model.named_parameters())
    weights = [named[n].detach().clone().requires_grad_(True) for n in case.params]
    buffers = [dict(case.torch_model.named_buffers())[n].clone() for n in stats]
    before = [b.clone() for b in buffers]
    function.apply(torch.from_numpy(case.inputs["x"]), *weights, *buffers).sum().backward()
    for b, expected in zip(buffers, before, strict=True):
        assert torch.equal(b, expected)


def test_tensors_cross_without_copies():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    vector = _interop.vector_of([t, torch.tensor([True, False])])
    assert vector[0].data_ptr() == t.data_ptr()  # ONNX Runtime reads torch's memory
    back = _interop.to_torch(vector, 0)
    assert back.data_ptr() == t.data_ptr() and torch.equal(
        back, t
    )  # and torch reads ONNX Runtime's
    assert torch.equal(_interop.to_torch(vector, 1), torch.tensor([True, False]))


def test_import_without_torch_says_what_to_install():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        try:
            import onnxblocks.torch
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert 'pip install "onnxblocks[torch]"' in out

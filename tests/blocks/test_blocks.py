"""Block/ForwardBlock behaviour and the op blocks, checked numerically through onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support.numerics import assert_close, assert_equal
from support.onnx_models import make_linear_model, run_model

import onnxblocks as ob
from onnxblocks import blocks as B

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)).astype(np.float32)
Y = RNG.standard_normal((3, 4)).astype(np.float32)


def _run_blocks(fn, feeds=None):
    """Build ``fn(a, b)`` on an empty model with float inputs a, b [3, 4] and run it."""
    feeds = feeds or {"a": X, "b": Y}
    with ob.empty_base() as acc:
        for name, arr in feeds.items():
            acc.add_input(name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))
        out = fn(*[ob.value(n) for n in feeds])
        acc.set_outputs(list(out) if isinstance(out, tuple) else [out])
    return run_model(acc.finish(), feeds)


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (lambda a, b: B.Add()(a, b), lambda x, y: x + y),
        (lambda a, b: B.Sub()(a, b), lambda x, y: x - y),
        (lambda a, b: B.Mul()(a, b), lambda x, y: x * y),
        (lambda a, b: B.Div()(a, b), lambda x, y: x / y),
        (lambda a, b: B.Pow(2.0)(a), lambda x, y: x**2),
        (lambda a, b: B.Sigmoid()(a), lambda x, y: 1 / (1 + np.exp(-x))),
        (lambda a, b: B.Log()(B.Abs()(a)), lambda x, y: np.log(np.abs(x))),
        (lambda a, b: B.Neg()(a), lambda x, y: -x),
        (lambda a, b: B.Abs()(a), lambda x, y: np.abs(x)),
        (lambda a, b: B.Exp()(a), lambda x, y: np.exp(x)),
        (lambda a, b: B.Clip(-0.5, 0.5)(a), lambda x, y: np.clip(x, -0.5, 0.5)),
        (lambda a, b: B.Clip(clip_min=0.0)(a), lambda x, y: np.maximum(x, 0)),
        (lambda a, b: B.ReduceMean()(a), lambda x, y: x.mean(keepdims=True)),
        (lambda a, b: B.ReduceSum(keepdims=False)(a), lambda x, y: x.sum()),
        (lambda a, b: B.ReduceMean(keepdims=False, axes=[1])(a), lambda x, y: x.mean(axis=1)),
        (lambda a, b: B.ReduceAllL2()(a, b), lambda x, y: np.sqrt((x**2).sum() + (y**2).sum())),
        (
            lambda a, b: B.Cast(onnx.TensorProto.INT64)(B.Clip(0.0, 10.0)(a)),
            lambda x, y: np.clip(x, 0, 10).astype(np.int64),
        ),
        (lambda a, b: B.Mul()(a, B.Constant(3.0)()), lambda x, y: x * 3.0),
        (
            lambda a, b: B.Op("Softmax", axis=-1)(a),
            lambda x, y: np.exp(x) / np.exp(x).sum(-1, keepdims=True),
        ),
    ],
)
def test_op_blocks_match_numpy(block, expected):
    """Against NumPy in float32 and in float64 (``support.numerics``); integers exactly."""
    (out,) = _run_blocks(block)
    x64, y64 = X.astype(np.float64), Y.astype(np.float64)
    assert_close(out, np.asarray(expected(X, Y)), np.asarray(expected(x64, y64)), rtol=1e-5)


def test_value_arithmetic_reads_like_the_maths():
    (out,) = _run_blocks(
        lambda a, b, bt: 0.4 * (a - b) ** 2 + 0.6 * abs(a) / 2 - ((-b) @ bt) @ a,
        {"a": X, "b": Y, "b_t": Y.T.copy()},
    )

    def expected(x, y):
        return 0.4 * (x - y) ** 2 + 0.6 * np.abs(x) / 2 - ((-y) @ y.T) @ x

    x64, y64 = X.astype(np.float64), Y.astype(np.float64)
    terms = (
        0.4 * (x64 - y64) ** 2 + 0.6 * np.abs(x64) / 2 + (np.abs(y64) @ np.abs(y64.T)) @ np.abs(x64)
    )
    assert_close(out, expected(X, Y), expected(x64, y64), rtol=1e-5, scale=terms)


def test_value_is_a_plain_string_for_name_code():
    with ob.empty_base() as acc:
        acc.add_input("a", onnx.TensorProto.FLOAT, [2])
        out = B.Neg()("a")
        assert isinstance(out, str)
        assert (
            str(out) + "_grad" == "neg_out_0_grad"
        )  # issue 18: names are built from str(v), not v + "..."
        assert f"{out}.buffer" == str(out) + ".buffer"
        assert {out: 1}[str(out)] == 1


OPERATORS = [
    ("+", lambda a, b: a + b),
    ("-", lambda a, b: a - b),
    ("*", lambda a, b: a * b),
    ("/", lambda a, b: a / b),
    ("**", lambda a, b: a**b),
    ("@", lambda a, b: a @ b),
]


@pytest.mark.parametrize(("symbol", "apply"), OPERATORS, ids=[o[0] for o in OPERATORS])
@pytest.mark.parametrize("order", ["value_first", "str_first"])
def test_value_and_plain_str_raise_for_every_operator(symbol, apply, order):
    with ob.empty_base() as acc:
        acc.add_input("a", onnx.TensorProto.FLOAT, [2, 2])
        acc.add_input("target", onnx.TensorProto.FLOAT, [2, 2])
        v = B.Neg()("a")
        nodes = len(acc.model.graph.node)
        with pytest.raises(ob.errors.ValueOperandError) as info:
            apply(v, "target") if order == "value_first" else apply("target", v)
        assert isinstance(info.value, TypeError) and isinstance(info.value, ob.OnnxBlocksError)
        message = str(info.value)
        assert "ob.value('target')" in message and "str(v)" in message and f" {symbol} " in message
        assert len(acc.model.graph.node) == nodes  # nothing was added
        # the remedy works: the wrapped name adds exactly one node of the operator's op type
        wrapped = ob.value("target")
        out = apply(v, wrapped) if order == "value_first" else apply(wrapped, v)
        op = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "**": "Pow", "@": "MatMul"}[symbol]
        (node,) = [n for n in acc.model.graph.node if str(out) in n.output]
        assert node.op_type == op
        assert list(node.input) == (
            [str(v), "target"] if order == "value_first" else ["target", str(v)]
        )


def test_sequence_construct_pass_through_and_input_like():
    with ob.empty_base() as acc:
        acc.add_input("a", onnx.TensorProto.FLOAT, [2, 3])
        seq = B.SequenceConstruct()("a", "a")
        assert acc.type_of(seq).WhichOneof("value") == "sequence_type"
        assert B.PassThrough()("a") == ("a",)
        new = B.InputLike("a")("target")
        assert new == "target"
        assert acc.shape_of("target") == [2, 3]
        assert B.InputLike("a")("target") == "target"  # reused, not duplicated
        assert [i.name for i in acc.model.graph.input] == ["a", "target"]


def test_label_encoder_and_string_cast():
    with ob.empty_base() as acc:
        acc.add_input("s", onnx.TensorProto.STRING, [3])
        ids = B.LabelEncoder(keys_strings=["a", "b", "c"], values_int64s=[0, 1, 2])("s")
        acc.set_outputs([B.Cast(onnx.TensorProto.FLOAT)(ids)])
    (out,) = run_model(acc.finish(), {"s": np.array(["c", "a", "zz"], dtype=object)})
    np.testing.assert_array_equal(out, [2.0, 0.0, -1.0])


def test_linear_block_adds_parameters():
    with ob.empty_base() as acc:
        acc.add_input("x", onnx.TensorProto.FLOAT, [2, 3])
        y = B.Linear(3, 5, seed=0)("x")
        acc.set_outputs([y])
    model = acc.finish()
    w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    terms = np.abs(x64) @ np.abs(w64) + np.abs(b)
    assert_close(run_model(model, {"x": x})[0], x @ w + b, x64 @ w64 + b, rtol=1e-5, scale=terms)


def test_generated_names_are_unique_and_user_names_kept():
    model = make_linear_model()
    # a user value that looks like a generated name must not be reused
    model.graph.node[0].output[0] = "neg_out_0"
    model.graph.node[1].input[0] = "neg_out_0"
    with ob.base(model) as acc:
        outs = [B.Neg()("y") for _ in range(3)]
        named = acc.op("Neg", ["y"], outputs=["my_name"])
    names = [o for n in acc.model.graph.node for o in n.output]
    assert len(names) == len(set(names))
    assert "neg_out_0" not in outs and named == "my_name"


def test_subclass_without_super_init_works():
    class NoInit(ob.Block):
        def __init__(self):  # deliberately no super().__init__()
            self.k = 2.0

        def build(self, x):
            return ob.blocks.Mul()(x, ob.blocks.Constant(self.k)())

    with ob.empty_base() as acc:
        acc.add_input("x", onnx.TensorProto.FLOAT, [2])
        block = NoInit()
        acc.set_outputs([block("x")])
    assert len(block.nodes) == 2
    assert_equal(run_model(acc.finish(), {"x": np.ones(2, np.float32)})[0], np.float32([2.0, 2.0]))


def test_reference_style_block_editing_the_proto():
    class Legacy(ob.Block):
        def build(self, name):
            node = onnx.helper.make_node("Relu", [name], ["legacy_out"], name="legacy")
            self.base.graph.node.append(node)
            return "legacy_out"

    with ob.base(make_linear_model()) as acc:
        out = Legacy()("y")
        doubled = out * 2.0  # types of directly appended nodes are inferred on demand
        acc.set_outputs([doubled])
    assert acc.elem_type(doubled) == onnx.TensorProto.FLOAT
    x = np.ones((1, 8), np.float32)
    (y,) = run_model(make_linear_model(), {"x": x})
    # the same linear model run twice by ONNX Runtime: float32 against float32, no float64 truth
    assert_close(run_model(acc.finish(), {"x": x})[0], 2 * np.maximum(y, 0), rtol=1e-6)


def test_forward_block_outputs_and_to_model_proto():
    class Loss(ob.ForwardBlock):
        def build(self, y):
            return ob.blocks.ReduceMean(keepdims=False)(y * y), y

    block = Loss()
    with pytest.raises(ob.errors.NotBuiltError, match="call it inside"):
        block.to_model_proto()
    with ob.base(make_linear_model()):
        block("y")
    model = block.to_model_proto()
    assert [o.name for o in model.graph.output][1] == "y"
    x = np.ones((2, 8), np.float32)
    loss, y = run_model(model, {"x": x})
    y64 = y.astype(np.float64)
    assert_close(loss, (y * y).mean(), (y64 * y64).mean(), rtol=1e-6)


def test_wrong_number_of_inputs_names_build_and_outputs():
    with ob.base(make_linear_model()):
        with pytest.raises(
            TypeError, match=r"Sub.build takes 2 input\(s\) \(input_name1, input_name2\).*\['y'\]"
        ):
            B.Sub()("y", "y", "y")


def test_unknown_input_name_is_named_with_hints():
    with ob.base(make_linear_model()):
        with pytest.raises(
            ob.errors.UnknownNameError,
            match=r"Neg: input 'yy' .*Did you mean 'y'.*Graph inputs: \['x'\]",
        ):
            B.Neg()("yy")


def test_type_mismatch_names_node_and_types():
    with ob.base(make_linear_model()):
        ints = B.Cast(onnx.TensorProto.INT64)("y")
        with pytest.raises(TypeError, match=r"Add.*float.*int64.*Cast"):
            B.Add()("y", ints)


def test_subclass_may_use_nodes_and_accessor_as_its_own_attributes():
    class Mine(ob.Block):
        def __init__(self):
            super().__init__()
            self.nodes = ["my", "own"]  # reference-era blocks use such names freely
            self.accessor = None

        def build(self, x):
            return ob.blocks.Neg()(x)

    with ob.empty_base() as acc:
        acc.add_input("x", onnx.TensorProto.FLOAT, [2])
        block = Mine()
        acc.set_outputs([block("x")])
    assert block.nodes == ["my", "own"]
    assert_equal(
        run_model(acc.finish(), {"x": np.ones(2, np.float32)})[0], np.float32([-1.0, -1.0])
    )

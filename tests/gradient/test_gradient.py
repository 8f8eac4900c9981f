"""The gradient module: parameter partition, normalisation passes, eval model, builder, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.held_weights import model_with_big_constant
from support.numerics import assert_close, assert_equal
from support.passes import on_proto
from support.reference import twice

import onnxblocks
from onnxblocks._core import weights as _weights
from onnxblocks.errors import GradientError, UnknownNameError
from onnxblocks.gradient import build_training_graphs, partition_parameters
from onnxblocks.gradient.builder import check_training_model
from onnxblocks.gradient.eval_model import DisableTrainingMode
from onnxblocks.gradient.layer_norm import ExposeLayerNormStatistics
from onnxblocks.gradient.rewrites import (
    CastLikeAsCast,
    GeluAsContribGelu,
    SplitToSequenceAsSplit,
)

cast_like_as_cast = on_proto(CastLikeAsCast)
disable_training_mode = on_proto(DisableTrainingMode)
expose_layer_norm_statistics = on_proto(ExposeLayerNormStatistics)
gelu_as_contrib_gelu = on_proto(GeluAsContribGelu)
split_to_sequence_as_split = on_proto(SplitToSequenceAsSplit)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 19 else 10
    return model


def _run(model, feeds, outputs=None):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _train_run(graphs_training, feeds, params):
    """Run a training model in an InferenceSession; return outputs and the gradients (read from the buffers)."""
    feeds = dict(feeds)
    buffers = {}
    for name, value in params.items():
        feeds[name] = value
        if f"{name}_grad.accumulation.buffer" in {i.name for i in graphs_training.graph.input}:
            buffers[name] = np.zeros_like(value)
            feeds[f"{name}_grad.accumulation.buffer"] = buffers[name]
    feeds["lazy_reset_grad"] = np.array([True])
    outs = _run(graphs_training, feeds)
    return dict(zip([o.name for o in graphs_training.graph.output], outs, strict=True)), buffers


# ------------------------------------------------------------------ partition
def _linear():
    rng = np.random.default_rng(0)
    return _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        [_vi("x", ["N", 3])],
        [_vi("loss", [])],
        [
            _init("W", rng.standard_normal((3, 2)).astype(np.float32)),
            _init("b", np.zeros(2, np.float32)),
            _init("steps", np.array([3], np.int64)),
        ],
    )


def test_partition_orders_by_initializer_and_splits_roles():
    part = partition_parameters(_linear().graph, ["b", "W", "x"], ["steps"])
    assert part.trainable == ("W", "b")
    assert part.frozen == ("steps",)
    assert part.parameters == ("W", "b", "steps")
    assert part.input_grads == ("x",)
    assert part.requires_grad == ("W", "b", "x")


def test_partition_unknown_name_lists_parameters_and_close_matches():
    with pytest.raises(UnknownNameError) as info:
        partition_parameters(_linear().graph, ["w"], [])
    message = str(info.value)
    assert (
        "'w'" in message
        and "Did you mean 'W'" in message
        and "Parameters: ['W', 'b', 'steps']" in message
    )


def test_partition_rejects_trainable_and_frozen():
    with pytest.raises(ValueError, match=r"\['W'\] cannot be both trainable"):
        partition_parameters(_linear().graph, ["W"], ["W"])


def test_partition_rejects_integer_trainable_parameter():
    with pytest.raises(TypeError, match="parameter 'steps' has element type int64.*Freeze it"):
        partition_parameters(_linear().graph, ["steps"], [])


# ------------------------------------------------------------------ passes
def test_layer_norm_gets_statistics_outputs_with_same_values():
    rng = np.random.default_rng(0)
    model = _model(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
        [_vi("x", [2, 3, 4])],
        [_vi("y", [2, 3, 4])],
        [
            _init("s", rng.standard_normal(4).astype(np.float32)),
            _init("b", rng.standard_normal(4).astype(np.float32)),
        ],
    )
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    (before,) = _run(model, {"x": x})
    assert expose_layer_norm_statistics(model) == 1
    node = model.graph.node[0]
    assert len(node.output) == 3 and all(node.output)
    (after,) = _run(model, {"x": x}, ["y"])
    np.testing.assert_array_equal(before, after)
    assert expose_layer_norm_statistics(model) == 0  # idempotent


def test_layer_norm_gradient_matches_torch():
    rng = np.random.default_rng(1)
    scale, bias = (
        rng.standard_normal(4).astype(np.float32),
        rng.standard_normal(4).astype(np.float32),
    )
    model = _model(
        [
            helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1),
            helper.make_node("Mul", ["y", "y"], ["yy"]),
            helper.make_node("ReduceMean", ["yy"], ["loss"], keepdims=0),
        ],
        [_vi("x", [2, 4])],
        [_vi("loss", [])],
        [_init("s", scale), _init("b", bias)],
    )
    graphs = build_training_graphs(model, ["s", "b"])
    assert graphs.rewrites["expose_layer_norm_statistics"] == 1
    x = rng.standard_normal((2, 4)).astype(np.float32)
    outs, grads = _train_run(graphs.training, {"x": x}, {"s": scale, "b": bias})

    def layer_norm(s, b, x):
        loss = (torch.nn.functional.layer_norm(x, (4,), s, b) ** 2).mean()
        loss.backward()
        return loss, s.grad, b.grad

    want = twice(
        layer_norm,
        torch.tensor(scale, requires_grad=True),
        torch.tensor(bias, requires_grad=True),
        torch.from_numpy(x),
    )
    want[0].check(outs[graphs.user_outputs[0]], rtol=1e-5, name="loss")
    want[1].check(grads["s"], rtol=1e-5, name="the scale's gradient")
    want[2].check(grads["b"], rtol=1e-5, name="the bias's gradient")


def _split_to_sequence_model(split, axis, keepdims, positions, shape):
    nodes, inits = [], []
    inputs = ["x"]
    if split is not None:
        inits.append(_init("split", np.asarray(split, dtype=np.int64)))
        inputs.append("split")
    nodes.append(helper.make_node("SplitToSequence", inputs, ["seq"], axis=axis, keepdims=keepdims))
    outputs = []
    for i, pos in enumerate(positions):
        nodes.append(
            helper.make_node(
                "Constant", [], [f"p{i}"], value=_init(f"p{i}", np.array(pos, np.int64))
            )
        )
        nodes.append(helper.make_node("SequenceAt", ["seq", f"p{i}"], [f"piece{i}"]))
        outputs.append(helper.make_tensor_value_info(f"piece{i}", TensorProto.FLOAT, None))
    return _model(nodes, [_vi("x", shape)], outputs, inits)


@pytest.mark.parametrize(
    ("split", "axis", "keepdims", "positions", "shape"),
    [
        (
            2,
            1,
            1,
            [0, 2, -1],
            [2, 5],
        ),  # chunk length, last piece shorter, negative and repeated positions
        ([1, 2, 3], 1, 1, [2, 0], [2, 6]),  # explicit lengths
        (None, 0, 0, [0, 2, 2], [3, 4]),  # no split: size-1 pieces, squeezed
        (None, -1, 1, [1], [2, 3]),  # no split, kept dims, negative axis
    ],
)
def test_split_to_sequence_becomes_split_with_same_values(split, axis, keepdims, positions, shape):
    model = _split_to_sequence_model(split, axis, keepdims, positions, shape)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    before = _run(model, {"x": x})
    assert split_to_sequence_as_split(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert "SplitToSequence" not in ops and "SequenceAt" not in ops and "Split" in ops
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    after = _run(model, {"x": x})
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b, a)


def test_split_to_sequence_read_otherwise_is_left_alone():
    model = _model(
        [
            helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0),
            helper.make_node("SequenceLength", ["seq"], ["n"]),
        ],
        [_vi("x", [3, 2])],
        [_vi("n", [], TensorProto.INT64)],
    )
    assert split_to_sequence_as_split(model) == 0
    assert [n.op_type for n in model.graph.node] == ["SplitToSequence", "SequenceLength"]


def test_cast_like_becomes_cast_with_same_values():
    model = _model(
        [
            helper.make_node("CastLike", ["i", "x"], ["c"]),
            helper.make_node("Mul", ["c", "x"], ["y"]),
        ],
        [_vi("i", [3], TensorProto.INT64), _vi("x", [3], TensorProto.DOUBLE)],
        [_vi("y", [3], TensorProto.DOUBLE)],
    )
    feeds = {"i": np.array([1, -2, 3]), "x": np.array([0.5, 1.5, 2.5])}
    (before,) = _run(model, feeds)
    assert cast_like_as_cast(model) == 1
    node = model.graph.node[0]
    assert node.op_type == "Cast" and list(node.input) == ["i"]
    assert helper.get_attribute_value(node.attribute[0]) == TensorProto.DOUBLE
    (after,) = _run(model, feeds)
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize(("approximate", "expected_op"), [("none", "Gelu"), ("tanh", "FastGelu")])
def test_opset20_gelu_becomes_contrib_gelu_with_same_values(approximate, expected_op):
    model = _model(
        [helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)],
        [_vi("x", [7])],
        [_vi("y", [7])],
        opset=20,
    )
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    (before,) = _run(model, {"x": x})
    assert gelu_as_contrib_gelu(model) == 1
    assert (model.graph.node[0].op_type, model.graph.node[0].domain) == (
        expected_op,
        "com.microsoft",
    )
    (after,) = _run(model, {"x": x})
    assert_close(
        after, before, rtol=1e-6, name="the contrib Gelu's values"
    )  # two kernels of ours: rtol and the floor


# ------------------------------------------------------------------ eval model
def test_eval_mode_dropout_and_single_output_batchnorm():
    rng = np.random.default_rng(0)
    c = 3
    scale, bias = (
        rng.standard_normal(c).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
    )
    mean, var = rng.standard_normal(c).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32)
    model = _model(
        [
            helper.make_node(
                "Constant", [], ["ratio"], value=_init("ratio", np.array(0.5, np.float32))
            ),
            helper.make_node("Constant", [], ["train"], value=_init("train", np.array(True))),
            helper.make_node("Dropout", ["x", "ratio", "train"], ["d", "mask"]),
            helper.make_node(
                "BatchNormalization",
                ["d", "scale", "bias", "mean", "var"],
                ["y", "running_mean", "running_var"],
                training_mode=1,
                momentum=0.9,
            ),
        ],
        [_vi("x", [4, c, 2])],
        [_vi("y", [4, c, 2]), _vi("running_mean", [c])],
        [_init("scale", scale), _init("bias", bias), _init("mean", mean), _init("var", var)],
    )
    assert disable_training_mode(model) == 2
    dropout, bn = (n for n in model.graph.node if n.op_type in ("Dropout", "BatchNormalization"))
    assert list(dropout.input) == [
        "x",
        "ratio",
        "",
    ]  # the slot stays, empty, as the reference leaves it
    assert "train" not in {o for n in model.graph.node for o in n.output}  # orphaned flag removed
    assert list(bn.output) == ["y"] and helper.get_attribute_value(bn.attribute[-1]) == 0
    x = rng.standard_normal((4, c, 2)).astype(np.float32)
    y, running_mean = _run(model, {"x": x})  # ONNX Runtime accepts the model

    def batch_norm(
        x, mean, var, scale, bias
    ):  # in the arrays' dtype; the magnitude of its terms in float64
        return (x - mean[:, None]) / np.sqrt(var[:, None] + x.dtype.type(1e-5)) * scale[
            :, None
        ] + bias[:, None]

    operands = (x, mean, var, scale, bias)
    expected, expected64 = (
        batch_norm(*operands),
        batch_norm(*(a.astype(np.float64) for a in operands)),
    )
    terms = batch_norm(
        np.abs(x.astype(np.float64)), -np.abs(mean), var, np.abs(scale), np.abs(bias)
    )
    assert_close(y, expected, expected64, rtol=1e-5, scale=terms, name="y in eval mode")
    np.testing.assert_array_equal(running_mean, mean)  # read through an Identity of the input


# ------------------------------------------------------------------ builder
def test_training_model_contract_order_and_names():
    graphs = build_training_graphs(_linear(), ["b", "W", "x"], ["steps"])
    training = graphs.training
    assert [i.name for i in training.graph.input] == [
        "x",
        "W",
        "b",
        "steps",
        "W_grad.accumulation.buffer",
        "b_grad.accumulation.buffer",
        "lazy_reset_grad",
    ]
    assert [o.name for o in training.graph.output] == [
        "loss",
        "W_grad.accumulation.out",
        "b_grad.accumulation.out",
        "x_grad",
    ]
    accumulators = [n for n in training.graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert [list(n.input) for n in accumulators] == [
        ["W_grad.accumulation.buffer", "W_grad", "lazy_reset_grad"],
        ["b_grad.accumulation.buffer", "b_grad", "lazy_reset_grad"],
    ]
    assert all(n.domain == "com.microsoft" for n in accumulators)
    flag = training.graph.output[1].type.tensor_type
    assert flag.elem_type == TensorProto.BOOL and [d.dim_value for d in flag.shape.dim] == [1]
    assert [i.name for i in graphs.eval.graph.input] == ["x", "W", "b", "steps"]
    assert [o.name for o in graphs.eval.graph.output] == ["loss"]
    assert training.ir_version <= 10 and graphs.eval.ir_version <= 10
    check_training_model(training)
    check_training_model(graphs.eval)


def test_input_gradient_matches_numpy():
    model = _linear()
    graphs = build_training_graphs(model, ["x"], [])
    w = numpy_helper.to_array(model.graph.initializer[0])
    x = np.ones((2, 3), np.float32)
    outs, _ = _train_run(graphs.training, {"x": x}, {})
    # loss = sum(x @ W + b): d loss / dx = row sums of W for every row
    want, want64 = (np.tile(a.sum(axis=1), (2, 1)) for a in (w, w.astype(np.float64)))
    terms = np.tile(np.abs(w.astype(np.float64)).sum(axis=1), (2, 1))
    assert_close(outs["x_grad"], want, want64, rtol=1e-6, scale=terms, name="x's gradient")


def test_caller_model_is_not_mutated():
    model = _linear()
    before = model.SerializeToString()
    build_training_graphs(model, ["W"], [])
    assert model.SerializeToString() == before


def test_op_without_gradient_names_node_op_domain_and_parameters():
    model = _model(
        [
            helper.make_node("Mul", ["x", "w"], ["h"]),
            helper.make_node("Round", ["h"], ["r"], name="rounding"),
            helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        ],
        [_vi("x", [3])],
        [_vi("loss", [])],
        [_init("w", np.ones(3, np.float32))],
    )
    with pytest.raises(GradientError) as info:
        build_training_graphs(model, ["w"])
    message = str(info.value)
    assert "node 'rounding'" in message and "op Round" in message and "domain 'ai.onnx'" in message
    assert "['w']" in message and "frozen_params" in message


def test_parameter_that_does_not_reach_the_loss_is_named():
    model = _model(
        [
            helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0),
            helper.make_node("Mul", ["x", "w"], ["other"]),
        ],
        [_vi("x", [3])],
        [_vi("loss", []), _vi("other", [3])],
        [_init("w", np.ones(3, np.float32))],
    )
    with pytest.raises(
        GradientError, match="loss 'loss' does not depend differentiably on 'w'.*Freeze 'w'"
    ):
        build_training_graphs(model, ["w"])


def test_loss_must_be_a_float_scalar():
    model = _linear()
    graph = model.graph
    graph.node.append(helper.make_node("Cast", ["y"], ["yi"], to=TensorProto.INT64))
    del graph.output[:]
    graph.output.extend([_vi("y", ["N", 2]), _vi("yi", ["N", 2], TensorProto.INT64)])
    with pytest.raises(ValueError, match=r"loss output 'y' has shape \['N', 2\].*must be a scalar"):
        build_training_graphs(model, ["W"])
    with pytest.raises(TypeError, match="loss output 'yi' has element type int64"):
        build_training_graphs(model, ["W"], outputs=["yi"])
    with pytest.raises(UnknownNameError, match="Did you mean 'y'"):
        build_training_graphs(model, ["W"], outputs=["yy"])


def test_opset_above_runtime_is_converted_down():
    model = _linear()
    model.opset_import[
        0
    ].version = 23  # issue 12: converted down with onnx's version converter, not refused
    graphs = build_training_graphs(model, ["W"])
    assert [o.version for o in graphs.training.opset_import if o.domain in ("", "ai.onnx")] == [21]


def test_new_ir_version_is_stamped_down():
    model = _linear()
    model.ir_version = 13
    graphs = build_training_graphs(model, ["W"])
    assert graphs.training.ir_version <= 10 and graphs.eval.ir_version <= 10
    _, grads = _train_run(
        graphs.training,
        {"x": np.ones((1, 3), np.float32)},
        {"W": numpy_helper.to_array(model.graph.initializer[0])},
    )
    assert_equal(
        grads["W"], np.ones((3, 2), np.float32), name="W's gradient"
    )  # exact: a sum of one one


# ------------------------------------------------------------------ held weights
def test_held_constants_never_reach_onnxruntime_and_come_back_as_stubs(monkeypatch):
    from onnxruntime.capi import _pybind_state as C

    model, weight, mask = model_with_big_constant()
    sizes = []
    original = C.get_optimized_model

    def spy(data, *args):
        sizes.append(len(data))
        return original(data, *args)

    monkeypatch.setattr(C, "get_optimized_model", spy)
    with onnxblocks.base(model) as acc:
        working = acc.working_model
        graphs = build_training_graphs(working, ["W"], [])
        assert (
            sizes and sizes[0] < 1024
        )  # neither W (a parameter) nor mask (a held constant) was serialized
        (mask_init,) = [i for i in graphs.training.graph.initializer if i.name == "mask"]
        assert _weights.is_stub(mask_init)
        assert any(_weights.is_stub(i) and i.name == "mask" for i in graphs.eval.graph.initializer)
        training = acc.materialize(graphs.training)
    x = np.ones((2, 32), np.float32)
    _, grads = _train_run(training, {"x": x}, {"W": weight})
    # d sum(x @ (W*mask)) / dW = colsum(x) * mask: two ones per element, exact
    assert_equal(grads["W"], 2 * mask, name="W's gradient")


def test_parameters_from_external_data_are_streamed(tmp_path):
    model, weight, mask = model_with_big_constant()
    onnx.save(
        model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0
    )
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)

    class Block(onnxblocks.blocks.training.TrainingBlock):
        def build(self, loss):
            return loss

    block = Block()
    block.requires_grad("W")
    with onnxblocks.base(loaded, model_path=tmp_path / "m.onnx"):
        block("loss")
    (source,), frozen = block.parameter_sources()
    assert frozen == [] and source.path == tmp_path / "m.data"  # read from the file when needed
    (param,), _ = block.parameters()
    np.testing.assert_array_equal(numpy_helper.to_array(param), weight)
    training, _ = block.to_model_proto()
    _, grads = _train_run(training, {"x": np.ones((1, 32), np.float32)}, {"W": weight})
    assert_equal(grads["W"], mask, name="W's gradient")  # exact: one times the mask


def test_softplus_gradient_matches_torch_including_zero_and_large_inputs():
    x = np.array([-30.0, -2.0, 0.0, 0.5, 19.0, 25.0, 100.0], np.float32)
    model = _model(
        [
            helper.make_node("Mul", ["x", "w"], ["h"]),
            helper.make_node("Softplus", ["h"], ["s"]),
            helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0),
        ],
        [_vi("x", [7])],
        [_vi("loss", [])],
        [_init("w", np.ones(7, np.float32))],
    )
    graphs = build_training_graphs(model, ["w"])
    assert graphs.rewrites["softplus_as_elementary"] == 1
    assert "Softplus" not in {n.op_type for n in graphs.training.graph.node}
    outs, grads = _train_run(graphs.training, {"x": x}, {"w": np.ones(7, np.float32)})

    def softplus(w, x):
        loss = torch.nn.functional.softplus(x * w).sum()
        loss.backward()
        return loss, w.grad

    expected = twice(softplus, torch.ones(7, requires_grad=True), torch.from_numpy(x))
    expected[0].check(outs["loss"], rtol=1e-6, name="loss")
    expected[1].check(grads["w"], rtol=1e-5, name="w's gradient")
    assert np.isfinite(grads["w"]).all()


def test_names_the_training_api_would_misread_are_warned_about():
    model = _linear()
    model.graph.input[0].name = "x_grad"
    model.graph.node[0].input[0] = "x_grad"
    with pytest.warns(UserWarning, match=r"Graph inputs \['x_grad'\] end like gradient buffers"):
        build_training_graphs(model, ["W"])


def test_initializers_listed_as_inputs_become_parameters_or_constants():
    model = _linear()
    model.graph.input.extend([_vi("W", [3, 2]), _vi("b", [2])])  # keep_initializers_as_inputs style
    graphs = build_training_graphs(model, ["W"])
    assert graphs.user_inputs == ("x",)
    assert [i.name for i in graphs.eval.graph.input] == ["x", "W"]
    assert "b" in {i.name for i in graphs.training.graph.initializer}
    assert [i.name for i in graphs.training.graph.input] == [
        "x",
        "W",
        "W_grad.accumulation.buffer",
        "lazy_reset_grad",
    ]


def test_only_the_chosen_outputs_are_kept():
    model = _linear()
    model.graph.output.append(_vi("y", ["N", 2]))
    graphs = build_training_graphs(model, ["W"], outputs=["loss"])
    assert [o.name for o in graphs.eval.graph.output] == ["loss"]
    assert [o.name for o in graphs.training.graph.output] == ["loss", "W_grad.accumulation.out"]


def test_unread_trainable_parameter_is_named():
    model = _linear()
    model.graph.initializer.append(_init("spare", np.ones(3, np.float32)))
    with pytest.raises(
        GradientError, match=r"\['spare'\] require a gradient but no node of the model reads them"
    ):
        build_training_graphs(model, ["W", "spare"])
    graphs = build_training_graphs(model, ["W"], ["spare"])  # frozen and unread is fine
    assert "spare" in {i.name for i in graphs.training.graph.input}

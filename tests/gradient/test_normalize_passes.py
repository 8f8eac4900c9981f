"""The passes of gradient/rewrites.py, and normalize() itself over one IR."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import check_pass, make_model, vi
from support.passes import on_proto

from onnxblocks.gradient import normalize as normalize_function
from onnxblocks.gradient.rewrites import (
    CastLikeAsCast,
    ExposeDropoutMask,
    GeluAsContribGelu,
    SoftplusAsElementary,
    SplitToSequenceAsSplit,
    default_passes,
)
from onnxblocks.ir.serde import from_proto, to_proto

cast_like_as_cast = on_proto(CastLikeAsCast)
split_to_sequence_as_split = on_proto(SplitToSequenceAsSplit)

RNG = np.random.default_rng(0)


def test_cast_like_becomes_cast_to_the_like_type():
    x = np.array([1.7, -2.2, 3.5], np.float32)
    model = make_model(
        [helper.make_node("CastLike", ["x", "like"], ["y"])],
        [vi("x", [3]), vi("like", [1], TensorProto.INT32)],
        [vi("y", [3], TensorProto.INT32)],
    )
    after = check_pass(
        CastLikeAsCast(),
        model,
        {"x": x, "like": np.zeros(1, np.int32)},
        {"CastLike": 1},
        gone="CastLike",
    )
    (cast,) = after.graph.node
    assert (
        list(cast.input) == ["x"]
        and helper.get_attribute_value(cast.attribute[0]) == TensorProto.INT32
    )


def test_the_proto_function_edits_in_place_and_counts():
    model = make_model(
        [helper.make_node("CastLike", ["x", "like"], ["y"])],
        [vi("x", [3]), vi("like", [1], TensorProto.DOUBLE)],
        [vi("y", [3], TensorProto.DOUBLE)],
    )
    assert cast_like_as_cast(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Cast"]
    assert cast_like_as_cast(model) == 0


def _split_to_sequence(keepdims: int, positions: list[int], split: np.ndarray | None):
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    nodes = [
        helper.make_node(
            "SplitToSequence", ["x"] + (["split"] if split is not None else []), ["seq"], axis=0
        )
    ]
    if split is None:
        nodes[0].attribute.append(helper.make_attribute("keepdims", keepdims))
    inits = [numpy_helper.from_array(split, "split")] if split is not None else []
    outputs = []
    for k, pos in enumerate(positions):
        inits.append(numpy_helper.from_array(np.array(pos, np.int64), f"p{k}"))
        nodes.append(helper.make_node("SequenceAt", ["seq", f"p{k}"], [f"y{k}"]))
        outputs.append(vi(f"y{k}", None))
    return make_model(nodes, [vi("x", [6, 4])], outputs, inits), {"x": x}


def test_split_to_sequence_with_lengths_becomes_split():
    model, feeds = _split_to_sequence(1, [0, 2, -2], np.array([1, 2, 3], np.int64))
    after = check_pass(
        SplitToSequenceAsSplit(), model, feeds, {"SplitToSequence": 1}, gone="SequenceAt"
    )
    assert "SplitToSequence" not in {n.op_type for n in after.graph.node}


def test_split_to_sequence_without_keepdims_squeezes_and_copies_a_piece_read_twice():
    model, feeds = _split_to_sequence(0, [5, 0, -1], None)  # 5 and -1: the same piece
    after = check_pass(
        SplitToSequenceAsSplit(), model, feeds, {"SplitToSequence": 1}, gone="SequenceAt"
    )
    ops = [n.op_type for n in after.graph.node]
    assert ops.count("Split") == 1 and ops.count("Squeeze") == 2 and ops.count("Identity") == 1


def test_split_to_sequence_read_otherwise_stays_and_the_proto_function_says_zero():
    model, _ = _split_to_sequence(1, [0], np.array([3, 3], np.int64))
    model.graph.output.append(vi("seq", None))
    model.graph.output[-1].type.CopyFrom(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(1, None))
    )
    assert split_to_sequence_as_split(model) == 0


def test_dropout_gets_a_fresh_mask_output():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Dropout", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])]
    )
    after = check_pass(ExposeDropoutMask(), model, {"x": x}, {"Dropout": 1})
    assert list(after.graph.node[0].output) == ["y", "y.mask_0"]
    assert dict(ExposeDropoutMask()(from_proto(after)).changes) == {}


def test_gelu_becomes_the_contrib_op():
    x = np.linspace(-5, 5, 21).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Gelu", ["x"], ["a"]),
            helper.make_node("Gelu", ["x"], ["b"], approximate="tanh"),
        ],
        [vi("x", [21])],
        [vi("a", [21]), vi("b", [21])],
        opset=20,
    )
    after = check_pass(GeluAsContribGelu(), model, {"x": x}, {"Gelu": 2})
    assert [(n.op_type, n.domain) for n in after.graph.node] == [
        ("Gelu", "com.microsoft"),
        ("FastGelu", "com.microsoft"),
    ]
    assert {o.domain for o in after.opset_import} >= {"com.microsoft"}


def test_softplus_is_torch_softplus():
    x = np.array([-30, -1, 0, 0.5, 19.9, 20.1, 40, 100], np.float32)
    model = make_model([helper.make_node("Softplus", ["x"], ["y"])], [vi("x", [8])], [vi("y", [8])])
    check_pass(SoftplusAsElementary(), model, {"x": x}, {"Softplus": 1}, gone="Softplus")


def test_normalize_runs_every_pass_over_one_ir_and_reports_by_name():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Elu", ["x"], ["e"]),
        helper.make_node("Softplus", ["e"], ["s"]),
        helper.make_node("Dropout", ["s"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])
    before = onnx.ModelProto()
    before.CopyFrom(model)
    report = normalize_function(model)
    assert list(report) == [p.name for p in default_passes()]
    assert len(report) == 27
    assert {k: v for k, v in report.items() if v} == {
        "inference_dropout_as_identity": 1,
        "activations_as_elementary": 1,
        "softplus_as_elementary": 1,
    }
    assert {n.op_type for n in model.graph.node}.isdisjoint({"Elu", "Softplus"})
    from pass_oracle import run
    from support.numerics import assert_close

    # the model before and after: two float32 graphs of ours, neither the truth (rtol and the floor)
    assert_close(
        run(model, {"x": x})[0],
        run(before, {"x": x})[0],
        rtol=1e-6,
        name="the normalized model's output",
    )


def test_normalize_leaves_a_model_with_nothing_to_do_as_it_was():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    before = model.SerializeToString()
    assert not any(normalize_function(model).values())
    assert model.SerializeToString() == before


def test_a_round_trip_through_the_ir_keeps_the_model():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    again = to_proto(from_proto(model))
    assert [n.op_type for n in again.graph.node] == ["Relu"]
    assert [i.name for i in again.graph.input] == ["x"]


def test_every_default_pass_declares_its_op_types_so_normalize_can_skip_the_ir():
    from onnxblocks.ir.rewrite import may_apply

    passes = default_passes()
    assert all(isinstance(p.op_types, frozenset) and p.op_types for p in passes)
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    assert not may_apply(passes, relu)
    mish = make_model(
        [helper.make_node("Mish", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])], opset=18
    )
    assert may_apply(passes, mish)
    report = normalize_function(
        mish
    )  # Mish writes a Softplus, which the later pass rewrites in the same run
    assert report["activations_as_elementary"] == 1 and report["softplus_as_elementary"] == 1

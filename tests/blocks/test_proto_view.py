"""The build holds one ir.Model; Block.base is a protobuf view of it, read back when edited."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

import onnxblocks
from onnxblocks import losses
from onnxblocks.blocks import Block
from onnxblocks.ir import serde


def _model(w: np.ndarray | None = None) -> onnx.ModelProto:
    """``y = x @ w``; ``w`` defaults to a 3x4 ramp."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10 if w is None else w
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, **feeds: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_a_build_of_library_blocks_converts_once_in_and_once_out(monkeypatch):
    calls = {"from_proto": 0, "to_proto": 0}
    for name in calls:
        original = getattr(serde, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(serde, name, counted)
    with onnxblocks.base(_model()) as acc:
        loss = losses.MSELoss()("y")
        mid = dict(calls)
        block = losses.L1Loss()
        block("y")
        assert acc.node_count() > 1
    assert mid == {"from_proto": 1, "to_proto": 0}
    finished = acc.finish()
    assert calls == {"from_proto": 1, "to_proto": 1}
    assert acc._view.proto is None  # nobody asked for the protobuf view
    assert loss in {n for node in finished.graph.node for n in node.output}


def test_edits_to_base_are_read_back_and_later_nodes_show_in_the_same_view():
    class EditsBase(Block):
        def build(self, name):
            base = self.base
            base.graph.node.append(helper.make_node("Relu", [name], ["relu_y"], name="r"))
            doubled = self.accessor.op("Add", ["relu_y", "relu_y"])
            assert base is self.base  # one view: the same object
            assert base.graph.node[-1].output[0] == doubled  # the build's write shows in it
            return doubled

    with onnxblocks.base(_model()) as acc:
        out = EditsBase()("y")
        assert acc.shape_of(out) == ["N", 4]  # the node read back is typed like the others
        acc.set_outputs([out])
    x = np.ones((2, 3), np.float32)
    (got,) = _run(acc.finish(), x=x)
    w64 = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    expected = 2 * np.maximum(x @ w64.astype(np.float32), 0)
    expected64 = 2 * np.maximum(x.astype(np.float64) @ w64, 0)
    scale = 2 * np.abs(x).astype(np.float64) @ np.abs(w64)
    assert_close(got, expected, expected64, rtol=0.0, scale=scale, name="Relu read back, doubled")


def test_an_edit_in_place_of_the_view_reaches_the_finished_model():
    with onnxblocks.base(_model()) as acc:
        view = acc.working_model
        view.graph.node[0].op_type = "Sub"  # an edit that adds nothing: found by its bytes
        view.graph.node[0].input[1] = "x"
        acc.set_outputs(["y"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = _run(acc.finish(), x=x)
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))


def test_the_callers_model_is_not_changed_and_a_view_edit_is_not_shared():
    model = _model()
    before = model.SerializeToString()
    with onnxblocks.base(model) as acc:
        acc.working_model.graph.node.append(helper.make_node("Relu", ["y"], ["r"]))
        losses.MSELoss()("r")
        copy = acc.proto()
        copy.graph.node.pop()  # a copy: the build keeps its nodes
        assert acc.has_value("r")
    assert model.SerializeToString() == before
    assert len(acc.finish().graph.node) > len(copy.graph.node)


def test_a_name_defined_twice_through_the_view_is_refused_by_name():
    with onnxblocks.base(_model()) as acc:
        acc.working_model.graph.node.append(helper.make_node("Relu", ["x"], ["y"]))
        with pytest.raises(onnxblocks.OnnxBlocksError, match="'y'"):
            acc.op("Relu", ["y"])


def test_a_training_block_converts_only_at_onnx_runtimes_door_and_for_the_files(monkeypatch):
    import onnx_ir as ir

    calls: list[str] = []
    for name in ("serialize_model", "deserialize_model"):
        original = getattr(ir.serde, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(ir.serde, name, counted)

    class Training(onnxblocks.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = losses.MSELoss()

        def build(self, output):
            return self.loss(output)

    block = Training()
    with onnxblocks.base(_model()) as acc:
        block.requires_grad("w")
        block("y")
    # in: the base; then the eval model and the forward out to ONNX Runtime's builder, and
    # its result in and out once (the training model)
    serialized, read = "serialize_model", "deserialize_model"
    assert calls == [read, serialized, serialized, read, serialized]
    calls.clear()
    view = acc.working_model  # the training model, left in the build as the reference does
    assert calls == []  # the build kept the training model's protobuf: nothing to convert
    assert {o.name for o in view.graph.output} == {
        o.name for o in block.graphs.training.graph.output
    }


def test_a_node_with_a_subgraph_reading_an_outer_value_runs_like_numpy():
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 4])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 4])
    then_graph = helper.make_graph([helper.make_node("Relu", ["y"], ["t"])], "then", [], [then_out])
    else_graph = helper.make_graph([helper.make_node("Neg", ["y"], ["e"])], "else", [], [else_out])
    with onnxblocks.base(_model()) as acc:
        flag = acc.add_input("flag", TensorProto.BOOL, [])
        out = acc.op("If", [flag], then_branch=then_graph, else_branch=else_graph)
        acc.set_outputs([out])
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    w64 = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    w32 = w64.astype(np.float32)
    model = acc.finish()
    scale = np.abs(x).astype(np.float64) @ np.abs(w64)
    for flag_value, branch in ((True, lambda v: np.maximum(v, 0)), (False, np.negative)):
        (got,) = _run(model, x=x, flag=np.array(flag_value))
        expected, expected64 = branch(x @ w32), branch(x.astype(np.float64) @ w64)
        assert_close(got, expected, expected64, rtol=0.0, scale=scale, name=f"If({flag_value})")


def test_a_value_removed_through_the_view_is_refused_by_name_on_the_next_write():
    with onnxblocks.base(_model()) as acc:
        acc.op("Relu", ["y"], outputs=["r"])
        view = acc.working_model
        view.graph.node.pop()  # the Relu is gone, and with it 'r'
        with pytest.raises(onnxblocks.OnnxBlocksError, match="'r'"):
            acc.op("Neg", ["r"])


def test_a_view_replaced_wholesale_becomes_the_build():
    other = _model()
    other.graph.node[0].op_type = "Add"  # x + w needs x's width: make w a [1, 3] row
    other.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((1, 3), np.float32), "w"))
    other.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 3
    with onnxblocks.base(_model()) as acc:
        acc.working_model.CopyFrom(other)
        doubled = acc.op("Add", ["y", "y"])
        acc.set_outputs([doubled])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = _run(acc.finish(), x=x)
    np.testing.assert_array_equal(got, 2 * (x + 1))


def test_held_weights_stay_held_through_a_view_round_trip():
    rng = np.random.default_rng(0)
    big = rng.standard_normal((256, 300)).astype(np.float32)  # held aside: above the threshold
    with onnxblocks.base(_model(big)) as acc:
        assert "w" in acc.weights
        acc.working_model.graph.node.append(helper.make_node("Relu", ["y"], ["r"]))
        acc.op("Neg", ["r"], outputs=["out"])
        acc.set_outputs(["out"])
        assert acc.working_model.graph.initializer[0].data_location == TensorProto.EXTERNAL
    finished = acc.finish()
    np.testing.assert_array_equal(numpy_helper.to_array(finished.graph.initializer[0]), big)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    (got,) = _run(finished, x=x)
    expected64 = -np.maximum(x.astype(np.float64) @ big.astype(np.float64), 0)
    expected = -np.maximum(x @ big, 0)
    scale = np.abs(x).astype(np.float64) @ np.abs(big).astype(np.float64)  # the sum's |terms|
    assert_close(got, expected, expected64, rtol=0.0, scale=scale, name="the held MatMul")

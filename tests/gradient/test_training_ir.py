"""ONNX Runtime's training model is finished on one IR: converted in once and out once."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import make_model, vi

from onnxblocks.gradient import add_gradient_accumulation, build_training_graphs, ort_bridge
from onnxblocks.gradient.parameters import ParameterPartition
from onnxblocks.gradient.signature import order_inputs_and_outputs, restore_held_constants
from onnxblocks.ir.serde import from_proto, to_proto


def _linear():
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array(np.ones((3, 2), np.float32), "W"),
        numpy_helper.from_array(np.zeros(2, np.float32), "b"),
    ]
    return make_model(nodes, [vi("x", [4, 3])], [vi("loss", [])], inits=inits)


def _conversions_after_the_builder(monkeypatch):
    """Count onnx-ir's model conversions once ONNX Runtime's gradient builder has returned."""
    counts: collections.Counter[str] = collections.Counter()
    after = []
    differentiate = ort_bridge.differentiate

    def differentiated(*args, **kwargs):
        result = differentiate(*args, **kwargs)
        after.append(True)
        return result

    monkeypatch.setattr(ort_bridge, "differentiate", differentiated)
    for name in ("deserialize_model", "serialize_model"):
        real = getattr(onnx_ir.serde, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            if after:
                counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(onnx_ir.serde, name, counted)
    return counts


@pytest.mark.parametrize("loss_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_the_builders_result_is_converted_to_the_ir_once_and_back_once(monkeypatch, loss_type):
    """Seed, held constants, signature order and accumulation all edit one IR (a double loss's
    float32 seed too)."""
    model = _linear()
    if loss_type == TensorProto.DOUBLE:
        graph = model.graph
        graph.node.append(helper.make_node("Cast", ["loss"], ["loss64"], to=TensorProto.DOUBLE))
        graph.output[0].CopyFrom(vi("loss64", [], TensorProto.DOUBLE))
    counts = _conversions_after_the_builder(monkeypatch)
    graphs = build_training_graphs(model, ["W", "b"])
    assert counts == {"deserialize_model": 1, "serialize_model": 1}
    assert [o.name for o in graphs.training.graph.output][1:] == [
        "W_grad.accumulation.out",
        "b_grad.accumulation.out",
    ]


def test_accumulation_on_a_proto_is_the_accumulation_on_its_ir():
    """The public ModelProto form of add_gradient_accumulation writes what the IR form writes."""
    nodes = [helper.make_node("Identity", ["p"], ["p_grad"])]
    model = make_model(nodes, [vi("p", [2, 3])], [vi("loss", []), vi("p_grad", [2, 3])])
    model.graph.node.insert(0, helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0))
    ir_model = from_proto(model)
    add_gradient_accumulation(ir_model, [("p", TensorProto.FLOAT, [2, 3])])
    add_gradient_accumulation(model, [("p", TensorProto.FLOAT, [2, 3])])
    assert model.SerializeToString() == to_proto(ir_model).SerializeToString()
    assert [i.name for i in model.graph.input] == [
        "p",
        "p_grad.accumulation.buffer",
        "lazy_reset_grad",
    ]
    assert [o.name for o in model.graph.output] == ["loss", "p_grad.accumulation.out"]
    assert {o.domain: o.version for o in model.opset_import}["com.microsoft"] == 1


def test_held_constants_come_back_as_initializers_and_the_signature_is_ordered():
    """On the IR: an unread held constant is dropped, a read one is an initializer again; inputs
    ONNX Runtime dropped come back from the forward signature, outputs go in contract order."""
    nodes = [
        helper.make_node("Mul", ["x", "c"], ["y"]),
        helper.make_node("Identity", ["y"], ["p_grad"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    built = make_model(
        nodes,
        [vi("c", [3]), vi("unread", [1]), vi("x", [3])],
        [vi("p_grad", [3]), vi("loss", [])],
    )
    held = [
        numpy_helper.from_array(np.full(3, 2.0, np.float32), "c"),
        numpy_helper.from_array(np.zeros(1, np.float32), "unread"),
    ]
    forward_inputs = {"p": vi("p", [3]), "x": vi("x", [3])}
    ir_model = from_proto(built)
    restore_held_constants(ir_model.graph, held)
    partition = ParameterPartition(trainable=("p",), frozen=(), parameters=("p",))
    order_inputs_and_outputs(ir_model.graph, forward_inputs, ["x"], partition, ["loss"])
    model = to_proto(ir_model)
    assert [i.name for i in model.graph.input] == ["x", "p"]
    assert [t.name for t in model.graph.initializer] == ["c"]
    assert model.graph.initializer[0] == held[0]
    assert [o.name for o in model.graph.output] == ["loss", "p_grad"]

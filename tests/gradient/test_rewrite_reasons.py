"""A rewrite that leaves a node as it is says why: the reason is in the pass's ``misses`` and in the
debug log of ``onnxblocks.ir.rewrite``, for the gradient rewrites and the portable lowering alike.
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import make_model, vi

from onnxblocks.gradient.einsum import EinsumAsMatMul, parse_equation
from onnxblocks.gradient.pooling import AveragePoolAsConv
from onnxblocks.gradient.reductions import CumSumAsMatMul
from onnxblocks.ir.serde import from_proto
from onnxblocks.portable.lower import LowerTrainingOps


def _axis(name: str, value: int):
    return numpy_helper.from_array(np.array(value, np.int64), name)


def test_cumsum_says_which_of_its_needs_is_missing(caplog):
    nodes = [
        helper.make_node("CumSum", ["x", "one"], ["fits"], name="fits"),
        helper.make_node("CumSum", ["x", "axis"], ["run_time_axis"], name="run_time_axis"),
        helper.make_node("CumSum", ["d", "zero"], ["dynamic_length"], name="dynamic_length"),
        helper.make_node("CumSum", ["i", "one"], ["integers"], name="integers"),
    ]
    inputs = [
        vi("x", [2, 3]),
        vi("axis", [], TensorProto.INT64),
        vi("d", ["n", 3]),
        vi("i", [2, 3], TensorProto.INT64),
    ]
    outputs = [vi(n.output[0], None) for n in nodes[:3]] + [vi("integers", None, TensorProto.INT64)]
    model = from_proto(
        make_model(nodes, inputs, outputs, [_axis("one", 1), _axis("zero", 0)], opset=14)
    )
    rewrite = CumSumAsMatMul()
    with caplog.at_level(logging.DEBUG, logger="onnxblocks.ir.rewrite"):
        result = rewrite(model)
    assert result.changes == {"CumSum": 1}
    assert rewrite.misses == [
        ("run_time_axis", "the axis is not a constant"),
        ("dynamic_length", "the summed axis is not static"),
        ("integers", "the input is not float32, float64 or float16"),
    ]
    assert "cumsum_as_matmul left CumSum 'run_time_axis': the axis is not a constant" in caplog.text


def test_einsum_and_average_pool_say_why_they_keep_a_node():
    einsum = make_model(
        [
            helper.make_node(
                "Einsum", ["a", "b"], ["y"], name="ellipsis", equation="...ij,jk->...ik"
            )
        ],
        [vi("a", None), vi("b", [3, 4])],
        [vi("y", None)],
    )
    rewrite = EinsumAsMatMul()
    assert rewrite(from_proto(einsum)).changes == {}
    assert rewrite.misses == [("ellipsis", "an operand with '...' is of unknown rank")]
    assert parse_equation("...ij,jk->...ik", [None, 2]) is None  # the public parser's answer

    pool = make_model(
        [helper.make_node("AveragePool", ["x"], ["y"], name="static", kernel_shape=[2, 2])],
        [vi("x", [1, 2, 4, 4])],
        [vi("y", [1, 2, 3, 3])],
    )
    rewrite = AveragePoolAsConv()
    assert rewrite(from_proto(pool)).changes == {}
    assert rewrite.misses == [
        ("static", "the input is static and float32: AveragePoolGrad handles it")
    ]


def test_a_lowering_that_keeps_a_node_says_why():
    model = make_model(
        [helper.make_node("Trilu", ["x"], ["y"], name="mask")],
        [vi("x", [3, 3])],
        [vi("y", [3, 3])],
        opset=13,  # Trilu is ai.onnx opset 14: a model may hold it below in "onnxruntime" mode
    )
    lowering = LowerTrainingOps("onnxruntime")
    ir_model = from_proto(model)
    assert lowering(ir_model).changes == {}
    assert [n.op_type for n in ir_model.graph] == ["Trilu"]
    assert lowering.misses == [
        ("mask", "the opset is below 14: kept for ONNX Runtime, which runs it")
    ]

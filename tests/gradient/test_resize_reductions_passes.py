"""ResizeAsMatMul, ExtremaWithTorchTies and CumSumAsMatMul: the same values through MatMul / selections."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.extrema import ExtremaWithTorchTies
from onnxblocks.gradient.reductions import CumSumAsMatMul
from onnxblocks.gradient.resize import ResizeAsMatMul

RNG = np.random.default_rng(17)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize(
    ("scales", "attrs"),
    [
        ([1, 1, 2, 2], {"mode": "nearest"}),
        ([1, 1, 1.5, 2], {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
        ([1, 1, 2, 1], {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
        ([1, 2, 1, 1], {"mode": "linear"}),
    ],
)
def test_resize_becomes_matmul_or_repeat(scales, attrs):
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    model = make_model([node], [vi("x", [2, 3, 4, 5])], [vi("y", None)], inits, opset=13)
    check_pass(ResizeAsMatMul(), model, {"x": X}, {"Resize": 1}, gone="Resize")


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 0), ([-1], 1), ([1, 3], 0), ([0, 2], 1)])
def test_reduce_extremum_becomes_selection(op, axes, keepdims):
    node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims)
    model = make_model([node], [vi("x", [2, 3, 4, 5])], [vi("y", None)], opset=17)
    check_pass(
        ExtremaWithTorchTies(), model, {"x": X}, {op: 1}
    )  # op itself stays, off the gradient path


def test_integer_reductions_stay():
    node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[1])
    model = make_model([node], [vi("x", [2, 3], 7)], [vi("y", None, 7)], opset=17)
    check_pass(ExtremaWithTorchTies(), model, {"x": np.arange(6, dtype=np.int64).reshape(2, 3)}, {})


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_becomes_matmul(axis, exclusive, reverse):
    inits = [numpy_helper.from_array(np.array(axis, np.int64), "axis")]
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [vi("x", ["N", 3, 4, 5])], [vi("y", None)], inits)
    check_pass(CumSumAsMatMul(), model, {"x": X}, {"CumSum": 1}, gone="CumSum")

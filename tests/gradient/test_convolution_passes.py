"""ConvTransposeAsConv and AveragePoolAsConv: the same values through a plain Conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.conv_transpose import ConvTransposeAsConv
from onnxblocks.gradient.pooling import AveragePoolAsConv

RNG = np.random.default_rng(5)


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2]},
        {"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
        {"group": 2, "dilations": [2, 1]},
        {"strides": [3, 3], "pads": [2, 2, 2, 2]},
    ],
)
def test_conv_transpose_becomes_conv(attrs):
    group = attrs.get("group", 1)
    x = RNG.standard_normal((1, 4, 5, 6)).astype(np.float32)
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 2)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(3 * group).astype(np.float32), "b")
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = make_model([node], [vi("x", [1, 4, 5, 6])], [vi("y", None)], [w, b])
    check_pass(ConvTransposeAsConv(), model, {"x": x}, {"ConvTranspose": 1}, gone="ConvTranspose")


def test_conv_transpose_with_output_shape_stays():
    w = numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], output_shape=[6, 6])
    model = make_model([node], [vi("x", [1, 2, 4, 4])], [vi("y", None)], [w])
    check_pass(ConvTransposeAsConv(), model, {"x": np.ones((1, 2, 4, 4), np.float32)}, {})


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0},
        {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    ],
)
def test_average_pool_with_a_dynamic_batch_becomes_a_depthwise_conv(attrs):
    x = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32)
    node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    model = make_model([node], [vi("x", ["N", 3, 5, 5])], [vi("y", None)])
    check_pass(AveragePoolAsConv(), model, {"x": x}, {"AveragePool": 1}, gone="AveragePool")


def test_static_float_average_pool_stays():
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2])
    model = make_model([node], [vi("x", [1, 3, 4, 4])], [vi("y", None)])
    check_pass(AveragePoolAsConv(), model, {"x": np.ones((1, 3, 4, 4), np.float32)}, {})

"""GroupNormAsElementary: instance and group normalization as Reshape / ReduceMean / Sqrt / affine."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.group_norm import GroupNormAsElementary

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)


def _params(n):
    return [
        numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "scale"),
        numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias"),
    ]


def test_instance_norm_with_a_dynamic_shape():
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-3)
    model = make_model([node], [vi("x", ["N", 6, "H", "W"])], [vi("y", None)], _params(6))
    check_pass(GroupNormAsElementary(), model, {"x": X}, {"InstanceNormalization": 1})


@pytest.mark.parametrize(("opset", "affine"), [(18, 3), (21, 6)])
def test_group_norm_per_group_at_18_and_per_channel_at_21(opset, affine):
    node = helper.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3, epsilon=1e-5
    )
    model = make_model(
        [node], [vi("x", [2, 6, 3, 4])], [vi("y", None)], _params(affine), opset=opset
    )
    check_pass(GroupNormAsElementary(), model, {"x": X}, {"GroupNormalization": 1})

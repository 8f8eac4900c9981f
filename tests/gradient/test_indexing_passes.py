"""Negative-step slices and border pads as Gather; DepthToSpace / SpaceToDepth as Reshape / Transpose."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.indexing import (
    BorderPadAsGather,
    DepthToSpaceAsReshape,
    NegativeStepSliceAsGather,
)

RNG = np.random.default_rng(13)
X = RNG.standard_normal((3, 5, 4)).astype(np.float32)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("shape", [[3, 5, 4], ["A", "B", "C"]])
@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([-1], [-(2**62)], [1], [-1]),
        ([3, 0], [0, 4], [1, 2], [-2, 1]),
        ([10, 2], [-10, 0], [-1, 0], [-1, -1]),
    ],
)
def test_negative_step_slice_becomes_gather(shape, starts, ends, axes, steps):
    inits = [_ints("s", starts), _ints("e", ends), _ints("a", axes), _ints("st", steps)]
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
    model = make_model([node], [vi("x", shape)], [vi("y", None)], inits)
    after = check_pass(NegativeStepSliceAsGather(), model, {"x": X}, {"Slice": 1})
    assert "Gather" in {n.op_type for n in after.graph.node}


def test_positive_steps_stay():
    inits = [_ints("s", [0]), _ints("e", [3]), _ints("a", [1]), _ints("st", [2])]
    model = make_model(
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
        [vi("x", [3, 5, 4])],
        [vi("y", None)],
        inits,
    )
    check_pass(NegativeStepSliceAsGather(), model, {"x": X}, {})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("shape", [[3, 5, 4], ["A", "B", "C"]])
def test_border_pad_becomes_gather_and_concat(mode, shape):
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = make_model(
        [node], [vi("x", shape)], [vi("y", None)], [_ints("pads", [0, 2, 1, 1, 0, 3])], opset=19
    )
    check_pass(BorderPadAsGather(), model, {"x": X}, {"Pad": 1}, gone="Pad")


@pytest.mark.parametrize(
    ("op", "mode"), [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)]
)
def test_depth_to_space_becomes_reshape_transpose_reshape(op, mode):
    x = RNG.standard_normal((2, 8, 4, 6)).astype(np.float32)
    attrs = {"blocksize": 2} | ({"mode": mode} if mode else {})
    model = make_model(
        [helper.make_node(op, ["x"], ["y"], **attrs)], [vi("x", ["N", 8, 4, 6])], [vi("y", None)]
    )
    after = check_pass(DepthToSpaceAsReshape(), model, {"x": x}, {op: 1}, gone=op)
    assert [n.op_type for n in after.graph.node if n.op_type != "Constant"] == [
        "Reshape",
        "Transpose",
        "Reshape",
    ]

"""Gaps of the reference that onnxblocks fixes: models below opset 11, unnamed nodes without a gradient.

The programs follow the reference's own tests (see ``tests/support/reference.py``), run through
``onnxblocks.compat`` and checked numerically.
"""

from __future__ import annotations

import io

import onnx
import pytest
import torch
from onnx import helper
from support.reference import (
    Session,
    assert_grads,
    loss_run,
    regression_target,
)
from support.torch_export import quiet

from onnxblocks.compat import artifacts, onnxblock
from onnxblocks.errors import GradientError


# ------------------------------------------------------------------ gaps of the reference that onnxblocks fixes
def test_model_exported_at_opset_10_trains(tmp_path, net):
    f = io.BytesIO()
    with quiet():
        torch.onnx.export(
            net.torch,
            (net.x,),
            f,
            input_names=["input-0"],
            output_names=["output-0"],
            opset_version=10,
            do_constant_folding=False,
            dynamic_axes={"input-0": {0: "n"}},
            dynamo=False,
        )
    art = artifacts.generate_artifacts(
        onnx.load_from_string(f.getvalue()),
        requires_grad=net.params,
        loss=artifacts.LossType.MSELoss,
        artifact_directory=tmp_path,
    )
    target = regression_target()
    expected = loss_run(net.torch, (net.x,), target, torch.nn.functional.mse_loss)
    session = Session.of(art)
    expected[0].check(session.train(net.x.numpy(), target.numpy())[0], name="loss")
    assert_grads(session, expected)


def test_unnamed_node_without_gradient_is_named_in_the_error(net):
    class SumOfSquares(onnxblock.TrainingBlock):
        def build(
            self, output_name
        ):  # nodes appended without names, as blocks written for the reference do
            self.base.graph.node.append(
                helper.make_node("ReduceSumSquare", [output_name], ["sos"], keepdims=0)
            )
            return "sos"

    block = SumOfSquares()
    block.requires_grad("fc2.bias")
    with (
        pytest.raises(GradientError, match="ReduceSumSquare.*domain.*fc2.bias"),
        onnxblock.base(net.onnx),
    ):
        block(net.onnx.graph.output[0].name)

"""The legacy GradientGraphBuilder (onnxblocks.compat.legacy): gradient graphs that match torch autograd."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from support.models import case
from support.reference import twice
from support.reference64 import gradient_magnitudes

from onnxblocks.compat.legacy import GradientGraphBuilder
from onnxblocks.errors import StateError, UnknownNameError


def _with_loss(model: onnx.ModelProto) -> onnx.ModelProto:
    """``loss = mean(output * r)``, ``r`` a fed weighting, appended to an exported model."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.node.extend(
        [
            helper.make_node("Mul", ["output", "r"], ["weighted"]),
            helper.make_node("ReduceMean", ["weighted"], ["loss"], keepdims=0),
        ]
    )
    out.graph.input.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    out.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return out


@pytest.mark.parametrize("family", ["mlp", "gpt"])
def test_gradient_graph_matches_torch_autograd(family, tmp_path):
    c = case(family, "torchscript")
    model = _with_loss(c.onnx_model)
    before = model.SerializeToString()
    wants_input = [
        name for name, v in c.inputs.items() if v.dtype == np.float32
    ]  # the MLP's x; not GPT's ids
    builder = GradientGraphBuilder(before, {"loss", "output"}, {*c.params, *wants_input}, "loss")
    builder.build()
    builder.save(tmp_path / "gradient.onnx")
    data = builder.get_model()
    assert (tmp_path / "gradient.onnx").read_bytes() == data
    graph = onnx.load_from_string(data).graph
    assert [i.name for i in graph.input] == [*c.inputs, "r"]  # the weights stay initializers
    names = [o.name for o in graph.output]
    assert names[:2] == ["loss", "output"]
    r = (
        np.random.default_rng(1)
        .standard_normal(c.torch_model(*c.torch_inputs()).shape)
        .astype(np.float32)
    )
    got = dict(zip(names, ort.InferenceSession(data).run(None, {**c.inputs, "r": r}), strict=True))
    torch_inputs = [
        torch.from_numpy(v.copy()).requires_grad_(v.dtype == np.float32) for v in c.inputs.values()
    ]

    def autograd(model, r, *inputs):
        model.zero_grad()
        output = model(*inputs)
        loss = (output * r).mean()
        loss.backward()
        grads = {f"{n}_grad": p.grad for n, p in model.named_parameters()}
        grads |= {
            f"{n}_grad": t.grad for n, t in zip(c.inputs, inputs, strict=True) if t.grad is not None
        }
        return loss, output, grads

    want = twice(autograd, c.torch_model, torch.from_numpy(r), *torch_inputs)
    want[0].check(got["loss"], rtol=1e-5, name="loss")
    want[1].check(got["output"], rtol=1e-5, name="output")
    assert sorted(names[2:]) == sorted(want.value[2])
    # a weight's gradient sums |g x| over the batch: its floor is that sum where known, else its largest element
    terms = gradient_magnitudes(
        c.torch_model, c.torch_inputs(), r, lambda output, r: (output * r).mean()
    )
    for name in want.value[2]:
        scale = terms.get(name.removesuffix("_grad"))
        want[2][name].check(got[name], rtol=1e-5, scale=scale, name=name)
    assert model.SerializeToString() == before  # the caller's model is not changed


def test_gradient_graph_builder_errors():
    model = _with_loss(case("mlp", "torchscript").onnx_model).SerializeToString()
    with pytest.raises(UnknownNameError, match="'los'.*loss"):
        GradientGraphBuilder(model, {"loss"}, {"fc1.weight"}, "los")
    with pytest.raises(UnknownNameError, match="'outptu'"):
        GradientGraphBuilder(model, {"outptu"}, {"fc1.weight"}, "loss")
    builder = GradientGraphBuilder(model, {"loss"}, {"fc1.weight"}, "loss")
    with pytest.raises(StateError, match="build"):
        builder.get_model()
    with pytest.raises(UnknownNameError, match="nope"):
        GradientGraphBuilder(model, {"loss"}, {"nope"}, "loss").build()

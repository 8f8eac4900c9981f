"""The reference's parameter handling: graph inputs with requires_grad, partitions, additional outputs.

The programs follow the reference's own tests (see ``tests/support/reference.py``), run through
``onnxblocks.compat`` and checked numerically.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from onnxruntime.capi import _pybind_state as C
from support.reference import (
    BATCH,
    CPU,
    D_IN,
    D_OUT,
    GRAD_RTOL,
    HIDDEN,
    NormDropNet,
    Session,
    assert_grads,
    export,
    infer,
    loss_block,
    loss_run,
    make_labels,
    regression_target,
    twice,
)

from onnxblocks.compat import artifacts, onnxblock


# ------------------------------------------------------------------ parameters: inputs, partitions, outputs
def test_requires_grad_on_an_input(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=["input-0", "fc1.weight"],
        loss=artifacts.LossType.MSELoss,
        artifact_directory=tmp_path,
    )
    assert art.requires_grad == ("fc1.weight",)
    training = onnx.load(art.training_model)
    assert training.graph.output[-1].name == "input-0_grad"
    target = regression_target()
    expected = loss_run(net.torch, (net.x,), target, torch.nn.functional.mse_loss)

    def input_gradient(model, x):
        torch.nn.functional.mse_loss(model(x), target).backward()
        return x.grad

    input_grad_expected = twice(input_gradient, net.torch, net.x.clone().requires_grad_())
    # the training API loads and trains the model with the extra gradient output
    session = Session.of(art)
    (loss,) = session.train(net.x.numpy(), target.numpy())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected, ["fc1.weight"])
    # and the input gradient is the value torch computes
    feeds = {
        "input-0": net.x.numpy(),
        "target": target.numpy(),
        "lazy_reset_grad": np.array([True]),
    }
    for name in net.params:
        feeds[name] = dict(net.torch.named_parameters())[name].detach().numpy()
    feeds = {i.name: feeds.get(i.name) for i in training.graph.input}
    feeds["fc1.weight_grad.accumulation.buffer"] = np.zeros((HIDDEN, D_IN), np.float32)
    (input_grad,) = infer(training, feeds, ["input-0_grad"])
    input_grad_expected.check(input_grad, rtol=GRAD_RTOL, name="input-0's gradient")


def test_frozen_and_trainable_parameters(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=["fc2.weight", "fc2.bias"],
        frozen_params=["fc1.weight", "fc1.bias"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path,
    )
    assert (art.requires_grad, art.frozen_params) == (
        ("fc2.weight", "fc2.bias"),
        ("fc1.weight", "fc1.bias"),
    )
    session = Session.of(art)
    torch_params = {n: p.detach().numpy() for n, p in net.torch.named_parameters()}
    # every parameter is in the checkpoint with its value; only the trainable ones get gradients
    assert sorted(session.state.parameter_names()) == sorted(net.params)
    for name in net.params:
        parameter = session.state.get_parameter(name)
        np.testing.assert_array_equal(parameter.data.numpy(), torch_params[name])
        assert parameter.requires_grad is name.startswith("fc2")
        assert parameter.grad.has_value() is name.startswith(
            "fc2"
        )  # a zero gradient buffer for trainable ones
        if name.startswith("fc2"):
            assert not parameter.grad.numpy().any()
    assert session.module.get_parameters_size(True) == HIDDEN * D_OUT + D_OUT
    assert session.module.get_parameters_size(False) == sum(p.size for p in torch_params.values())
    labels = make_labels()
    model = copy.deepcopy(net.torch)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("fc2"))

    def sgd_step(model, x):
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return (
            loss,
            grads,
            {n: p.detach() - 0.1 * grads[n] for n, p in model.named_parameters() if n in grads},
        )

    expected = twice(sgd_step, model, net.x)
    (loss,) = session.train(net.x.numpy(), labels.numpy())
    expected[0].check(loss, name="loss")
    for name in ("fc2.weight", "fc2.bias"):
        expected[1][name].check(session.grad(name), rtol=GRAD_RTOL, name=f"{name}'s gradient")
    before = session.flat(trainable_only=True).numpy().copy()
    session.optimizer.set_learning_rate(0.1)
    session.step()
    for name in net.params:  # SGD moved the trainable parameters only
        if name.startswith("fc1"):
            np.testing.assert_array_equal(session.param(name), torch_params[name])
        else:
            # p - 0.1 g: the terms are |p| and 0.1 |g|
            scale = np.abs(torch_params[name]) + 0.1 * np.abs(expected.value64[1][name])
            expected[2][name].check(
                session.param(name), rtol=1e-5, scale=scale, name=f"{name} after the step"
            )
    # the reference's copy_buffer_to_parameters round trip
    buffer = C.OrtValue.ortvalue_from_numpy(before, CPU)
    session.module.copy_buffer_to_parameters(buffer, True)
    np.testing.assert_array_equal(session.flat(trainable_only=True).numpy(), before)
    # a frozen parameter is an input fed from the state, not a constant: a new value changes the loss
    ones = np.ones((HIDDEN, D_IN), np.float32)
    session.state.get_parameter("fc1.weight").copy_from(
        session.state, C.OrtValue.ortvalue_from_numpy(ones, CPU)
    )
    with torch.no_grad():
        model.fc1.weight.copy_(torch.from_numpy(ones))
        for name in ("fc2.weight", "fc2.bias"):
            dict(model.named_parameters())[name].copy_(torch.from_numpy(session.param(name)))
        expected = twice(
            lambda model, x: torch.nn.functional.cross_entropy(model(x), labels), model, net.x
        )
    for outputs in (
        session.train(net.x.numpy(), labels.numpy()),
        session.eval(net.x.numpy(), labels.numpy()),
    ):
        expected.check(outputs[0], name="loss with fc1.weight set to ones")


def test_parameters_neither_trainable_nor_frozen_stay_constants(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=["fc2.bias"],
        loss=artifacts.LossType.L1Loss,
        artifact_directory=tmp_path,
    )
    training = onnx.load(art.training_model)
    assert {i.name for i in training.graph.initializer} >= {"fc1.weight", "fc1.bias", "fc2.weight"}
    session = Session.of(art)
    assert list(session.state.parameter_names()) == ["fc2.bias"]
    target = regression_target()
    expected = loss_run(net.torch, (net.x,), target, torch.nn.functional.l1_loss)
    (loss,) = session.train(net.x.numpy(), target.numpy())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected, ["fc2.bias"])


def test_retrieve_parameters_and_partition(net):
    block = loss_block(onnxblock.TrainingBlock, "MSELoss", {})
    with pytest.raises(
        RuntimeError, match="Please build the training model first before trying to retrieve"
    ):
        block.parameters()
    block.requires_grad("fc2.weight", False)
    block.requires_grad("fc1.bias", False)
    block.requires_grad("fc1.weight")
    block.requires_grad("fc2.bias")
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    trainable, frozen = block.parameters()
    assert [p.name for p in trainable] == ["fc1.weight", "fc2.bias"]
    assert [p.name for p in frozen] == ["fc1.bias", "fc2.weight"]
    torch_params = dict(net.torch.named_parameters())
    for tensor in trainable + frozen:
        np.testing.assert_array_equal(
            numpy_helper.to_array(tensor), torch_params[tensor.name].detach().numpy()
        )


def test_additional_outputs(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.MSELoss,
        artifact_directory=tmp_path,
    )
    assert len(onnx.load(art.eval_model).graph.output) == 1
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.MSELoss,
        artifact_directory=tmp_path,
        additional_output_names=["output-0"],
    )
    assert [o.name for o in onnx.load(art.eval_model).graph.output][1:] == ["output-0"]
    session = Session.of(art)
    target = regression_target()
    with torch.no_grad():
        expected = twice(
            lambda model, x: (torch.nn.functional.mse_loss(model(x), target), model(x)),
            net.torch,
            net.x,
        )
    for outputs in (
        session.train(net.x.numpy(), target.numpy()),
        session.eval(net.x.numpy(), target.numpy()),
    ):
        loss, out = outputs
        expected[0].check(loss, name="loss")
        expected[1].check(out, name="logits")


def test_eval_model_runs_in_inference_mode(tmp_path):
    torch.manual_seed(4)
    model = NormDropNet()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(BATCH, D_IN)
    base_model = export(model, (x,))
    assert {"Dropout", "BatchNormalization"} <= {n.op_type for n in base_model.graph.node}
    art = artifacts.generate_artifacts(
        base_model,
        requires_grad=["fc1.weight", "fc2.weight"],
        frozen_params=["bn.weight", "bn.bias"],
        loss=artifacts.LossType.CrossEntropyLoss,
        artifact_directory=tmp_path,
        additional_output_names=["output-0"],
    )
    eval_model = onnx.load(art.eval_model)
    for node in eval_model.graph.node:
        if node.op_type == "Dropout":
            assert len(node.input) < 3 or not node.input[2]
        if node.op_type == "BatchNormalization":
            assert {a.name: a.i for a in node.attribute}.get("training_mode", 0) == 0
    labels = make_labels()
    model.eval()
    with torch.no_grad():
        expected = twice(
            lambda model, x: (torch.nn.functional.cross_entropy(model(x), labels), model(x)),
            model,
            x,
        )
    feeds = {"input-0": x.numpy(), "labels": labels.numpy()}
    for p, value in model.named_parameters():
        if p in {i.name for i in eval_model.graph.input}:
            feeds[p] = value.detach().numpy()
    loss, out = infer(eval_model, feeds)  # an InferenceSession runs it, twice the same (no dropout)
    expected[0].check(loss, name="loss")
    expected[1].check(out, name="logits")
    session = Session.of(art)
    loss, out = session.eval(x.numpy(), labels.numpy())
    expected[0].check(loss, name="the training API's eval loss")
    expected[1].check(out, name="the training API's eval logits")
    # the training API's inference export of the eval model gives the same numbers
    exported = tmp_path / "inference.onnx"
    session.module.export_model_for_inferencing(os.fspath(exported), ["output-0"])
    (inferred,) = infer(exported, {"input-0": x.numpy()})
    expected[1].check(inferred, name="the exported model's logits")

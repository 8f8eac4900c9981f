"""TrainingBlock: configuration, parameters, models, and training through ONNX Runtime's training API."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from support import models
from support.numerics import assert_close
from support.reference64 import gradient_magnitudes, to64

import onnxblocks
from onnxblocks import losses
from onnxblocks._core import weights as _weights
from onnxblocks.artifacts import Artifacts
from onnxblocks.blocks.training import TrainingBlock
from onnxblocks.errors import NotBuiltError


class MSETraining(TrainingBlock):
    def __init__(self, extra_outputs=()):
        super().__init__()
        self.loss = losses.MSELoss()
        self.extra = list(extra_outputs)

    def build(self, output_name):
        loss = self.loss(output_name)
        return (loss, *self.extra) if self.extra else loss


@pytest.fixture
def mlp():
    return models.case("mlp", "torchscript")


def _built(case, block, trainable=None):
    for name in case.params if trainable is None else trainable:
        block.requires_grad(name)
    with onnxblocks.base(case.onnx_model) as acc:
        block("output")
    return acc


def _write(tmp_path, block) -> Artifacts:
    """Save a built block's models and checkpoint and describe them as Artifacts (no optimizer)."""
    from onnxblocks.checkpoint import save_checkpoint

    training, evaluation = block.to_model_proto()
    onnx.save(training, tmp_path / "training_model.onnx")
    onnx.save(evaluation, tmp_path / "eval_model.onnx")
    save_checkpoint(block.parameter_sources(), tmp_path / "checkpoint")
    p = block.graphs.partition
    return Artifacts(
        tmp_path,
        tmp_path / "training_model.onnx",
        tmp_path / "eval_model.onnx",
        tmp_path / "checkpoint",
        None,
        None,
        None,
        None,
        None,
        p.trainable,
        p.frozen,
        block.graphs.user_inputs,
        block.graphs.user_outputs,
        (),
    )


def test_requires_grad_toggles_between_trainable_and_frozen(mlp):
    block = MSETraining()
    block.requires_grad("fc1.weight")
    block.requires_grad("fc1.bias", False)
    block.requires_grad("fc2.weight")
    block.requires_grad("fc2.weight", False)  # now frozen
    block.requires_grad("fc1.bias")  # now trainable
    _built(mlp, block, trainable=[])
    trainable, frozen = block.parameters()
    assert [t.name for t in trainable] == ["fc1.weight", "fc1.bias"]
    assert [t.name for t in frozen] == ["fc2.weight"]


def test_nothing_is_known_before_the_build():
    block = MSETraining()
    for call in (block.parameters, block.parameter_sources, block.to_model_proto):
        with pytest.raises(
            NotBuiltError, match="has not been built yet.*Please build the training model first"
        ):
            call()
    assert isinstance(NotBuiltError("x"), RuntimeError)


def test_parameters_are_complete_copies_in_input_order(mlp):
    block = MSETraining()
    acc = _built(mlp, block, trainable=["fc2.bias", "fc1.weight"])
    trainable, frozen = block.parameters()
    assert [t.name for t in trainable] == ["fc1.weight", "fc2.bias"] and frozen == []
    originals = {i.name: numpy_helper.to_array(i) for i in mlp.onnx_model.graph.initializer}
    for tensor in trainable:
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), originals[tensor.name])
    sources, _ = block.parameter_sources()
    assert all(isinstance(s, _weights.TensorSource) for s in sources)
    np.testing.assert_array_equal(sources[0].array(), originals["fc1.weight"])
    # after the build the accessor holds the training model, as in the reference
    assert "fc1.weight_grad.accumulation.buffer" in {i.name for i in acc.model.graph.input}


def test_models_are_complete_and_valid_with_held_weights():
    from support.held_weights import model_with_big_constant

    model, _, mask = model_with_big_constant()

    class Sum(TrainingBlock):
        def build(self, loss):
            return loss

    block = Sum()
    block.requires_grad("W")
    with onnxblocks.base(model) as acc:
        assert set(acc.weights) == {"W", "mask"}  # both held aside as stubs while building
        block("loss")
    assert any(_weights.is_stub(i) for i in block.graphs.training.graph.initializer)
    training, evaluation = block.to_model_proto()
    for m in (training, evaluation):
        assert not any(_weights.is_stub(i) for i in m.graph.initializer)
        assert m.ir_version <= 10
    (stored,) = [i for i in evaluation.graph.initializer if i.name == "mask"]
    np.testing.assert_array_equal(numpy_helper.to_array(stored), mask)


def test_gradients_accumulate_until_reset_through_the_training_api(tmp_path, mlp):
    block = MSETraining()
    _built(mlp, block)
    trainer = models.OrtTrainer(_write(tmp_path, block), optimizer=False)
    x, target = mlp.inputs["x"], mlp.target
    trainer.train_step(x, target)
    once = trainer.grad("fc1.weight").copy()
    trainer.train_step(x, target)
    # ONNX Runtime against itself: no float64 truth, the floor from the gradient's size
    assert_close(trainer.grad("fc1.weight"), 2 * once, rtol=1e-6, name="accumulated")
    trainer.module.lazy_reset_grad()
    trainer.train_step(x, target)
    assert_close(trainer.grad("fc1.weight"), once, rtol=1e-6, name="after the reset")


def test_additional_outputs_follow_the_loss(tmp_path, mlp):
    block = MSETraining(extra_outputs=["output"])
    _built(mlp, block)
    training, evaluation = block.to_model_proto()
    assert [o.name for o in training.graph.output][:2] == [block.graphs.user_outputs[0], "output"]
    assert len(evaluation.graph.output) == 2
    trainer = models.OrtTrainer(_write(tmp_path, block), optimizer=False)
    _, output = trainer.train_step(mlp.inputs["x"], mlp.target)
    x = torch.from_numpy(mlp.inputs["x"])
    with torch.no_grad():
        expected, expected64 = mlp.torch_model(x).numpy(), to64(mlp.torch_model)(x.double()).numpy()
    assert_close(output, expected, expected64, rtol=1e-5, name="output")


def test_requires_grad_on_an_input_gives_its_gradient(tmp_path, mlp):
    block = MSETraining()
    _built(mlp, block, trainable=[*mlp.params, "x"])
    training, _ = block.to_model_proto()
    assert training.graph.output[-1].name == "x_grad"
    assert "x_grad.accumulation.buffer" not in {i.name for i in training.graph.input}
    x = torch.from_numpy(mlp.inputs["x"]).requires_grad_()
    model = copy.deepcopy(mlp.torch_model)
    torch.nn.functional.mse_loss(model(x), torch.from_numpy(mlp.target)).backward()
    x64, model64 = to64(x.detach()).requires_grad_(), to64(mlp.torch_model)
    torch.nn.functional.mse_loss(model64(x64), to64(torch.from_numpy(mlp.target))).backward()
    terms = gradient_magnitudes(
        mlp.torch_model, [mlp.inputs["x"]], mlp.target, torch.nn.functional.mse_loss
    )

    import onnxruntime as ort

    feeds = {"x": mlp.inputs["x"], "target": mlp.target, "lazy_reset_grad": np.array([True])}
    for name, param in model.named_parameters():
        feeds[name] = param.detach().numpy()
        feeds[f"{name}_grad.accumulation.buffer"] = np.zeros_like(feeds[name])
    session = ort.InferenceSession(training.SerializeToString(), providers=["CPUExecutionProvider"])
    (x_grad,) = session.run(["x_grad"], feeds)
    assert_close(x_grad, x.grad.numpy(), x64.grad.numpy(), rtol=1e-4, name="x_grad")
    # ONNX Runtime's training API still runs the model (it skips outputs named like gradients)
    trainer = models.OrtTrainer(_write(tmp_path, block), optimizer=False)
    assert len(trainer.train_step(mlp.inputs["x"], mlp.target)) == 1
    expected, expected64 = model.fc1.weight.grad.numpy(), model64.fc1.weight.grad.numpy()
    assert_close(
        trainer.grad("fc1.weight"), expected, expected64, rtol=1e-4, scale=terms["fc1.weight"]
    )


def test_weighted_sum_of_losses_with_value_arithmetic(tmp_path):
    torch.manual_seed(0)
    net = models.MLP(d_out=4)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    onnx_model = models.export(net, {"x": x}, "torchscript")

    class Weighted(TrainingBlock):
        def build(self, output_name):
            acc = self.accessor  # two heads of 2 outputs each
            a = acc.op(
                "Slice",
                [
                    output_name,
                    acc.constant([0], np.int64),
                    acc.constant([2], np.int64),
                    acc.constant([1], np.int64),
                ],
            )
            b = acc.op(
                "Slice",
                [
                    output_name,
                    acc.constant([2], np.int64),
                    acc.constant([4], np.int64),
                    acc.constant([1], np.int64),
                ],
            )
            return 0.4 * losses.MSELoss()(a, "t1") + 0.6 * losses.L1Loss()(b, "t2")

    block = Weighted()
    for name, _ in net.named_parameters():
        block.requires_grad(name)
    with onnxblocks.base(onnx_model):
        block("output")
    rng = np.random.default_rng(1)
    t1, t2 = (
        rng.standard_normal((5, 2)).astype(np.float32),
        rng.standard_normal((5, 2)).astype(np.float32),
    )
    trainer = models.OrtTrainer(_write(tmp_path, block), optimizer=False)
    (loss,) = trainer.train_step(x, t1, t2)

    def weighted(out, targets):
        first, second = targets
        mse, l1 = torch.nn.functional.mse_loss, torch.nn.functional.l1_loss
        return 0.4 * mse(out[:, :2], first) + 0.6 * l1(out[:, 2:], second)

    targets = [torch.from_numpy(t1), torch.from_numpy(t2)]
    net64 = to64(net)
    expected, expected64 = (
        weighted(net(torch.from_numpy(x)), targets),
        weighted(net64(torch.from_numpy(x).double()), [t.double() for t in targets]),
    )
    expected.backward()
    expected64.backward()
    assert_close(
        loss, expected.detach().numpy(), expected64.detach().numpy(), rtol=1e-5, name="loss"
    )
    terms = gradient_magnitudes(net, [x], targets, weighted)
    grads64 = {n: p.grad.numpy() for n, p in net64.named_parameters()}
    for name, param in net.named_parameters():
        assert_close(
            trainer.grad(name),
            param.grad.numpy(),
            grads64[name],
            rtol=1e-4,
            scale=terms[name],
            name=name,
        )


def test_parameters_created_by_blocks_can_be_trained(tmp_path, mlp):
    class Head(TrainingBlock):
        def build(self, output_name):
            hidden = onnxblocks.blocks.Linear(3, 2, seed=0)(output_name)
            return losses.MSELoss()(hidden)

    block = Head()
    block.requires_grad("linear.weight_0")
    block.requires_grad("linear.bias_0")
    with onnxblocks.base(mlp.onnx_model):
        block("output")
    trainable, _ = block.parameters()
    assert [t.name for t in trainable] == ["linear.weight_0", "linear.bias_0"]
    w, b = (numpy_helper.to_array(t) for t in trainable)
    trainer = models.OrtTrainer(_write(tmp_path, block), optimizer=False)
    target = np.zeros((6, 2), np.float32)
    trainer.train_step(mlp.inputs["x"], target)
    x = torch.from_numpy(mlp.inputs["x"])
    with torch.no_grad():
        features, features64 = mlp.torch_model(x).numpy(), to64(mlp.torch_model)(x.double()).numpy()

    def gradients(features, w, b):
        """d/db and d/dW of the mean squared residual."""
        residual = features @ w + b - target
        return 2 * residual.sum(axis=0) / residual.size, 2 * features.T @ residual / residual.size

    expected, expected64 = gradients(features, w, b), gradients(features64, w.astype(np.float64), b)
    residual64 = np.abs(features64 @ w + b - target)
    terms = (
        2 * residual64.sum(axis=0) / residual64.size,
        2 * np.abs(features64.T) @ residual64 / residual64.size,
    )
    for i, name in enumerate(["linear.bias_0", "linear.weight_0"]):
        assert_close(
            trainer.grad(name), expected[i], expected64[i], rtol=1e-4, scale=terms[i], name=name
        )


def test_html_display_hook(mlp):
    block = MSETraining()
    _built(mlp, block)
    html = block._repr_html_()
    assert html is None or ("fc1.weight" in html and "MSETraining" in html)

"""The reference's own test behaviours, run through onnxblocks.compat, with ONNX Runtime consuming the files.

Each test follows one of onnxruntime.training.onnxblock's tests, but checks
numbers (against torch) where the reference only checked that nothing raised,
and feeds the files to ONNX Runtime's training API.
"""

from __future__ import annotations

import copy
import io
import os
import random
import types

import numpy as np
import onnx
import pytest
import torch
from support import models
from support.reference import loss_run, twice
from support.torch_export import quiet

from onnxblocks.compat import artifacts, onnxblock

BATCH, D_IN, HIDDEN, D_OUT = 8, 6, 5, 4


# ------------------------------------------------------------------ helpers (as the reference's tests)
def _get_onnx_model(torch_model, model_inputs):
    """Export like the reference's tests: inputs ``input-i``, outputs ``output-i``, all dims dynamic, training mode."""
    outputs = torch_model(*model_inputs)
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else outputs
    dynamic_axes, input_names, output_names = {}, [], []
    for i, value in enumerate(model_inputs):
        input_names.append(f"input-{i}")
        dynamic_axes[f"input-{i}"] = {d: f"input-{i}_dim{d}" for d in range(value.dim())}
    for i, value in enumerate(outputs):
        output_names.append(f"output-{i}")
        dynamic_axes[f"output-{i}"] = {d: f"output-{i}_dim{d}" for d in range(value.dim())}
    f = io.BytesIO()
    with quiet():
        torch.onnx.export(
            torch_model,
            model_inputs,
            f,
            input_names=input_names,
            output_names=output_names,
            opset_version=14,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            dynamic_axes=dynamic_axes,
            dynamo=False,
        )
    return onnx.load_from_string(f.getvalue())


@pytest.fixture(scope="module")
def simple():
    torch.manual_seed(0)
    pt_model = models.MLP(D_IN, HIDDEN, D_OUT)
    x = torch.randn(BATCH, D_IN)
    return pt_model, _get_onnx_model(pt_model, (x,)), x


def _run(model, feeds, outputs=None):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def _block(kind, loss_class):
    class Simple(kind):
        def __init__(self):
            super().__init__()
            self.loss = loss_class()

        def build(self, output_name):
            return self.loss(output_name)

    return Simple()


def _target(loss_name, rng=None):
    g = torch.Generator().manual_seed(1)
    if loss_name == "CrossEntropyLoss":
        return torch.randint(0, D_OUT, (BATCH,), generator=g)
    if loss_name == "BCEWithLogitsLoss":
        return torch.rand(BATCH, D_OUT, generator=g)
    return torch.randn(BATCH, D_OUT, generator=g)


LOSSES = ["MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "L1Loss"]


# ------------------------------------------------------------------ losses and training graphs
@pytest.mark.parametrize("loss_name", LOSSES)
def test_loss_execution_matches_torch(simple, loss_name):
    pt_model, base_model, x = simple
    block = _block(onnxblock.ForwardBlock, getattr(onnxblock.loss, loss_name))
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    model = block.to_model_proto()
    target = _target(loss_name)
    (loss,) = _run(
        model, {model.graph.input[0].name: x.numpy(), model.graph.input[1].name: target.numpy()}
    )
    with torch.no_grad():
        expected = twice(
            lambda model, x: getattr(torch.nn, loss_name)()(model(x), target), pt_model, x
        )
    expected.check(loss, rtol=1e-5, name=loss_name)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_training_graph_execution_matches_torch(tmp_path, simple, loss_name):
    pt_model, base_model, x = simple
    art = artifacts.generate_artifacts(
        base_model,
        requires_grad=[n for n, _ in pt_model.named_parameters()],
        loss=artifacts.LossType[loss_name],
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    target = _target(loss_name)
    trainer = models.OrtTrainer(art)
    (loss,) = trainer.train_step(x.numpy(), target.numpy())
    expected = loss_run(pt_model, (x,), target, getattr(torch.nn, loss_name)())
    expected[0].check(loss, rtol=1e-5, name=loss_name)
    for name, _ in pt_model.named_parameters():
        scale = expected.scales[name]
        expected[1][name].check(
            trainer.grad(name), rtol=1e-5, scale=scale, name=f"{name}'s gradient"
        )
    trainer.step()  # the reference's AdamW model runs in ONNX Runtime's optimizer


def test_reference_optimizer_defaults():
    adamw = onnxblock.optim.AdamW()
    assert (adamw.step_block.eps, adamw.step_block.weight_decay, adamw.step_block.mode) == (
        1e-6,
        0.0,
        "hf",
    )
    assert artifacts.OptimType.AdamW.value == 1 and artifacts.LossType.L1Loss.value == 4


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
@pytest.mark.parametrize("clip", [None, 2.5])
def test_optimizer_composition_trains(tmp_path, simple, optimizer, clip):
    pt_model, base_model, x = simple
    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    for name, _ in pt_model.named_parameters():
        block.requires_grad(name)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    clip_grad = onnxblock.optim.ClipGradNorm(clip) if clip else None
    optim_block = getattr(onnxblock.optim, optimizer)(clip_grad=clip_grad)
    with onnxblock.empty_base() as accessor:
        _ = optim_block(block.parameters())
        optimizer_model = accessor.model
    assert any(n.op_type == "InplaceClipGradNorm" for n in optimizer_model.graph.node) == bool(clip)
    training, evaluation = block.to_model_proto()
    onnx.save(training, tmp_path / "training_model.onnx")
    onnx.save(evaluation, tmp_path / "eval_model.onnx")
    onnx.save(optimizer_model, tmp_path / "optimizer_model.onnx")
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "checkpoint")
    files = types.SimpleNamespace(
        checkpoint=tmp_path / "checkpoint",
        **{
            key: tmp_path / f"{key}.onnx"
            for key in ("training_model", "eval_model", "optimizer_model")
        },
    )
    trainer = models.OrtTrainer(files)
    trainer.optimizer.set_learning_rate(0.05)
    target = _target("MSELoss").numpy()
    losses = []
    for _ in range(5):
        losses.append(trainer.train_step(x.numpy(), target)[0])
        trainer.step()
    assert losses[-1] < losses[0]


def test_grad_clipping_execution_matches_torch(simple):
    pt_model, _, x = simple
    base_model = onnx.ModelProto()
    base_model.graph.name = "ClipGradNorm Model"
    base_model.opset_import.extend(
        [onnx.helper.make_opsetid("com.microsoft", 1), onnx.helper.make_opsetid("", 17)]
    )
    base_model.ir_version = 8
    base_model.graph.input.append(
        onnx.helper.make_tensor_sequence_value_info("gradients", onnx.TensorProto.FLOAT, None)
    )

    class GradClippingModel(onnxblock.ForwardBlock):
        def __init__(self, max_norm):
            super().__init__()
            self._grad_clip = onnxblock.optim.ClipGradNorm(max_norm)

        def build(self, grads_name):
            return self._grad_clip(grads_name)

    grad_clip = GradClippingModel(2.5)
    with onnxblock.base(base_model):
        output_name = grad_clip("gradients")
    model = grad_clip.to_model_proto()
    model_copy = copy.deepcopy(pt_model)
    torch.nn.functional.mse_loss(model_copy(x), 10 * _target("MSELoss")).backward()
    grads = [p.grad.numpy().copy() for p in model_copy.parameters()]

    def clip(*grads):  # torch's clip_grad_norm_ on the same gradients, in their dtype
        tensors = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for t, g in zip(tensors, grads, strict=True):
            t.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(tensors, 2.5)
        return [t.grad for t in tensors]

    expected = twice(clip, *(torch.from_numpy(g) for g in grads))
    (clipped,) = _run(model, {"gradients": grads}, [output_name])
    for i, ours in enumerate(clipped):
        expected[i].check(ours, rtol=1e-5, name=f"clipped gradient {i}")


# ------------------------------------------------------------------ parameters and checkpoints
def test_retrieve_parameters(simple):
    pt_model, base_model, _ = simple
    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    with pytest.raises(
        RuntimeError, match="Please build the training model first before trying to retrieve"
    ):
        block.parameters()
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    assert block.parameters() == ([], [])  # nothing requires a gradient unless asked

    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    for name, _ in pt_model.named_parameters():
        block.requires_grad(name)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    trainable, frozen = block.parameters()
    assert frozen == []
    for ort_param, (name, param) in zip(trainable, pt_model.named_parameters(), strict=True):
        assert ort_param.name == name
        np.testing.assert_array_equal(
            np.frombuffer(ort_param.raw_data, dtype=np.float32).reshape(param.shape),
            param.detach().numpy(),
        )


def test_set_requires_grad_on_parameters(simple):
    _, base_model, _ = simple
    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    block.requires_grad("fc1.weight")
    block.requires_grad("fc2.bias")
    block.requires_grad("fc2.weight", False)
    block.requires_grad("fc1.bias", False)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    trainable, frozen = block.parameters()
    assert [p.name for p in trainable] == ["fc1.weight", "fc2.bias"]
    assert [p.name for p in frozen] == ["fc1.bias", "fc2.weight"]
    training, _ = block.to_model_proto()
    outputs = [o.name for o in training.graph.output]
    assert outputs[1:] == ["fc1.weight_grad.accumulation.out", "fc2.bias_grad.accumulation.out"]


def test_set_requires_grad_on_inputs(tmp_path, simple):
    pt_model, base_model, x = simple
    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    block.requires_grad("input-0")
    block.requires_grad("fc1.weight")
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    training, _ = block.to_model_proto()
    assert training.graph.output[-1].name == "input-0_grad"
    target = _target("MSELoss")
    feeds = {
        "input-0": x.numpy(),
        "target": target.numpy(),
        "lazy_reset_grad": np.array([True]),
        "fc1.weight": pt_model.fc1.weight.detach().numpy(),
        "fc1.weight_grad.accumulation.buffer": np.zeros((HIDDEN, D_IN), np.float32),
    }
    (input_grad,) = _run(training, feeds, ["input-0_grad"])

    def input_gradient(model, x):
        torch.nn.functional.mse_loss(model(x), target).backward()
        return x.grad

    expected = twice(input_gradient, pt_model, x.clone().requires_grad_())
    expected.check(input_grad, rtol=1e-5, name="input-0's gradient")


def test_save_and_load_checkpoint_in_place(tmp_path, simple):
    pt_model, base_model, _ = simple
    zero_model = copy.deepcopy(base_model)
    for init in zero_model.graph.initializer:
        init.CopyFrom(
            onnx.numpy_helper.from_array(np.zeros_like(onnx.numpy_helper.to_array(init)), init.name)
        )
    block = _block(onnxblock.TrainingBlock, onnxblock.loss.MSELoss)
    block.requires_grad("fc2.weight")
    block.requires_grad("fc1.bias", False)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    path = tmp_path / "checkpoint"
    onnxblock.save_checkpoint(block.parameters(), path)
    assert (
        onnxblock.load_checkpoint_to_model(path, zero_model) is None
    )  # in place, as the reference
    loaded = {i.name: onnx.numpy_helper.to_array(i) for i in zero_model.graph.initializer}
    params = dict(pt_model.named_parameters())
    for name in ("fc2.weight", "fc1.bias"):
        np.testing.assert_array_equal(loaded[name], params[name].detach().numpy())
    assert not loaded["fc1.weight"].any()
    with pytest.raises(RuntimeError, match="No checkpoint parameters provided"):
        onnxblock.save_checkpoint(None, path)


# ------------------------------------------------------------------ composition
@pytest.mark.parametrize("model_type", ["ForwardBlock", "TrainingBlock"])
def test_weighted_average_model_composition(tmp_path, model_type):
    class TwoOutputNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = models.MLP(D_IN, HIDDEN, D_OUT)
            self.b = models.MLP(D_IN, HIDDEN, D_OUT)

        def forward(self, x1, x2):
            return self.a(x1), self.b(x2)

    class WeightedAvg(getattr(onnxblock, model_type)):
        def __init__(self, w1, w2):
            super().__init__()
            self.loss1 = onnxblock.loss.CrossEntropyLoss()
            self.loss2 = onnxblock.loss.CrossEntropyLoss()
            self.w1 = onnxblock.blocks.Constant(w1)
            self.w2 = onnxblock.blocks.Constant(w2)
            self.mul = onnxblock.blocks.Mul()
            self.add = onnxblock.blocks.Add()

        def build(self, loss_input_name1, loss_input_name2):
            return self.add(
                self.mul(self.w1(), self.loss1(loss_input_name1, labels_name="labels1")),
                self.mul(self.w2(), self.loss2(loss_input_name2, labels_name="labels2")),
            )

    torch.manual_seed(0)
    pt_model = TwoOutputNet()
    x1, x2 = torch.randn(BATCH, D_IN), torch.randn(BATCH, D_IN)
    base_model = _get_onnx_model(pt_model, (x1, x2))
    rnd = random.Random(0)
    w1, w2 = rnd.random(), rnd.random()
    block = WeightedAvg(w1, w2)
    if model_type == "TrainingBlock":
        for name, _ in pt_model.named_parameters():
            block.requires_grad(name)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name, base_model.graph.output[1].name)
    labels1, labels2 = _target("CrossEntropyLoss"), torch.flip(_target("CrossEntropyLoss"), [0])

    def weighted(outputs, labels):
        ce = torch.nn.functional.cross_entropy
        return w1 * ce(outputs[0], labels[0]) + w2 * ce(outputs[1], labels[1])

    expected = loss_run(pt_model, (x1, x2), torch.stack([labels1, labels2]), weighted)
    feeds = {
        "input-0": x1.numpy(),
        "input-1": x2.numpy(),
        "labels1": labels1.numpy(),
        "labels2": labels2.numpy(),
    }
    if model_type == "ForwardBlock":
        (loss,) = _run(block.to_model_proto(), feeds)
        expected[0].check(loss, rtol=1e-5, name="loss")
        return
    training, _ = block.to_model_proto()
    feeds["lazy_reset_grad"] = np.array([True])
    buffers = {}
    for name, param in pt_model.named_parameters():
        feeds[name] = param.detach().numpy()
        buffers[name] = feeds[f"{name}_grad.accumulation.buffer"] = np.zeros_like(feeds[name])
    (loss, *_) = _run(training, feeds)
    expected[0].check(loss, rtol=1e-5, name="loss")
    for (
        name,
        _,
    ) in pt_model.named_parameters():  # InPlaceAccumulatorV2 wrote the gradients into the buffers
        scale = expected.scales[name]
        expected[1][name].check(buffers[name], rtol=1e-5, scale=scale, name=f"{name}'s gradient")


def test_label_encoder_composition(simple):
    pt_model, base_model, x = simple
    base_model = copy.deepcopy(base_model)
    base_model.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml", 3))

    class SCELossWithLabelEncoder(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self._loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            labels_input = copy.deepcopy(self.base.graph.output[0])
            labels_input.type.tensor_type.elem_type = onnx.TensorProto.INT64
            labels_input.name = "labels"
            del labels_input.type.tensor_type.shape.dim[1]
            self.base.graph.input.append(labels_input)
            encoder = onnxblock.blocks.LabelEncoder(
                default_int64=0, keys_int64s=[521, 522, 523, 524], values_int64s=[0, 1, 2, 3]
            )
            return self._loss(output_name, encoder("labels"))

    block = SCELossWithLabelEncoder()
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
        model = block.to_model_proto()
    assert "LabelEncoder" in [n.op_type for n in model.graph.node]
    labels = _target("CrossEntropyLoss")
    (loss,) = _run(model, {"input-0": x.numpy(), "labels": labels.numpy() + 521})
    with torch.no_grad():
        expected = twice(
            lambda model, x: torch.nn.functional.cross_entropy(model(x), labels), pt_model, x
        )
    expected.check(loss, rtol=1e-5, name="loss")


def test_string_targets_cast_to_numbers(tmp_path, simple):
    pt_model, base_model, x = simple

    class StringTargets(onnxblock.TrainingBlock):
        def build(self, output_name):
            acc = self.accessor
            acc.add_input("target_text", onnx.TensorProto.STRING, ["batch", D_OUT])
            target = onnxblock.blocks.Cast(onnx.TensorProto.FLOAT)("target_text")
            return onnxblock.loss.MSELoss()(output_name, target)

    block = StringTargets()
    block.requires_grad("fc2.bias")
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    training, _ = block.to_model_proto()
    target = _target("MSELoss")
    text = np.array([[f"{v:.6f}" for v in row] for row in target.tolist()], dtype=object)
    buffer = np.zeros(D_OUT, np.float32)
    (loss, _) = _run(
        training,
        {
            "input-0": x.numpy(),
            "target_text": text,
            "fc2.bias": pt_model.fc2.bias.detach().numpy(),
            "fc2.bias_grad.accumulation.buffer": buffer,
            "lazy_reset_grad": np.array([True]),
        },
    )
    parsed = torch.tensor(
        [[float(v) for v in r] for r in text]
    )  # the strings' values, as Cast reads them
    expected = loss_run(pt_model, (x,), parsed, torch.nn.functional.mse_loss)
    expected[0].check(loss, rtol=1e-5, name="loss")
    expected[1]["fc2.bias"].check(
        buffer, rtol=1e-5, scale=expected.scales["fc2.bias"], name="fc2.bias's gradient"
    )


# ------------------------------------------------------------------ artifacts
class DropoutModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D_IN, D_OUT)
        self.dropout = torch.nn.Dropout(p=0.5)

    def forward(self, x):
        return self.dropout(self.fc(x))


class BatchNormModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, D_OUT, 3)
        self.batchnorm = torch.nn.BatchNorm2d(D_OUT)

    def forward(self, x):
        return self.batchnorm(self.conv(x)).mean(dim=(2, 3))


def test_additional_output_names(tmp_path):
    torch.manual_seed(0)
    onnx_model = _get_onnx_model(DropoutModel(), (torch.randn(BATCH, D_IN),))
    artifacts.generate_artifacts(
        onnx_model, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path
    )
    assert len(onnx.load(tmp_path / "eval_model.onnx").graph.output) == 1
    artifacts.generate_artifacts(
        onnx_model,
        loss=artifacts.LossType.CrossEntropyLoss,
        artifact_directory=tmp_path,
        additional_output_names=["output-0"],
    )
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert [o.name for o in eval_model.graph.output][1:] == ["output-0"]


@pytest.mark.parametrize("model_class", [DropoutModel, BatchNormModel])
def test_eval_model_has_no_training_mode_and_matches_torch_eval(tmp_path, model_class):
    torch.manual_seed(0)
    pt_model = model_class()
    x = torch.randn(BATCH, 1, 5, 5) if model_class is BatchNormModel else torch.randn(BATCH, D_IN)
    if model_class is BatchNormModel:
        with torch.no_grad():
            pt_model.batchnorm.running_mean.uniform_(-1, 1)
            pt_model.batchnorm.running_var.uniform_(0.5, 2)
    onnx_model = _get_onnx_model(pt_model, (x,))
    art = artifacts.generate_artifacts(
        onnx_model,
        requires_grad=["conv.weight"] if model_class is BatchNormModel else ["fc.weight"],
        loss=artifacts.LossType.CrossEntropyLoss,
        artifact_directory=tmp_path,
    )
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    for node in eval_model.graph.node:
        if node.op_type == "Dropout":
            assert len(node.input) < 3 or not node.input[2]
        if node.op_type == "BatchNormalization":
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs.get("training_mode", 0) == 0 and len(node.output) == 1
    assert {"Dropout", "BatchNormalization"} & {n.op_type for n in eval_model.graph.node}
    labels = _target("CrossEntropyLoss")
    (loss,) = models.OrtTrainer(art, optimizer=False).eval_step(
        x.numpy(), labels.numpy()
    )  # ONNX Runtime loads it
    pt_model.eval()
    with torch.no_grad():
        expected = twice(
            lambda model, x: torch.nn.functional.cross_entropy(model(x), labels), pt_model, x
        )
    expected.check(loss, rtol=1e-5, name="eval loss")


def test_save_ort_format(tmp_path, simple):
    _, base_model, _ = simple
    artifacts.generate_artifacts(
        base_model,
        requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
        ort_format=True,
    )
    for name in ("training_model", "eval_model", "optimizer_model"):
        assert os.path.exists(tmp_path / f"{name}.onnx") and os.path.exists(
            tmp_path / f"{name}.ort"
        )


def test_nominal_checkpoint(tmp_path, simple):
    _, base_model, _ = simple
    artifacts.generate_artifacts(
        base_model,
        requires_grad=["fc1.weight"],
        loss=artifacts.LossType.MSELoss,
        artifact_directory=tmp_path,
        nominal_checkpoint=True,
    )
    from onnxruntime.capi import _pybind_state as C

    nominal, full = (
        C.load_checkpoint(os.fspath(tmp_path / "nominal_checkpoint")),
        C.load_checkpoint(os.fspath(tmp_path / "checkpoint")),
    )
    assert list(nominal.parameter_names()) == list(full.parameter_names()) == ["fc1.weight"]
    assert (tmp_path / "nominal_checkpoint").stat().st_size < (
        tmp_path / "checkpoint"
    ).stat().st_size


def test_the_references_enums_are_accepted(tmp_path, simple):
    from onnxruntime.training import artifacts as reference

    pt_model, base_model, x = simple
    art = artifacts.generate_artifacts(
        base_model,
        requires_grad=["fc2.bias"],
        loss=reference.LossType.L1Loss,
        optimizer=reference.OptimType.SGD,
        artifact_directory=tmp_path,
    )
    target = _target("L1Loss")
    (loss,) = models.OrtTrainer(art).train_step(x.numpy(), target.numpy())
    with torch.no_grad():
        expected = twice(
            lambda model, x: torch.nn.functional.l1_loss(model(x), target), pt_model, x
        )
    expected.check(loss, rtol=1e-5, name="loss")

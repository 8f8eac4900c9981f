"""The reference's block programs: compositions of losses, string inputs, block patterns and custom blocks.

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
from onnx import TensorProto, helper, numpy_helper
from support import models
from support.reference import (
    BATCH,
    D_IN,
    D_OUT,
    GRAD_RTOL,
    Session,
    assert_grads,
    export,
    infer,
    loss_run,
    make_labels,
    probability_target,
    regression_target,
    save_block_files,
    twice,
)

from onnxblocks.compat import artifacts, onnxblock


# ------------------------------------------------------------------ compositions
def two_task_loss(kind, weights: tuple[float, float]):
    """A ``kind`` block: a weighted sum of two cross entropies, composed of Constant, Mul and Add blocks."""

    class TwoTaskLoss(kind):
        def __init__(self):
            super().__init__()
            self.losses = [onnxblock.loss.CrossEntropyLoss() for _ in weights]
            self.weights = [onnxblock.blocks.Constant(w) for w in weights]
            self.scales = [onnxblock.blocks.Mul() for _ in weights]
            self.total = onnxblock.blocks.Add()

        def build(self, logits_a, logits_b):
            terms = [
                scale(weight(), loss(logits, labels_name=f"labels{i}"))
                for i, (logits, loss, weight, scale) in enumerate(
                    zip((logits_a, logits_b), self.losses, self.weights, self.scales, strict=True),
                    start=1,
                )
            ]
            return self.total(*terms)

    return TwoTaskLoss()


def test_weighted_average_of_losses(tmp_path, two_outputs):
    w1, w2 = 0.3, 1.7
    labels1, labels2 = make_labels(5), make_labels(6)
    out1, out2 = two_outputs.onnx.graph.output[0].name, two_outputs.onnx.graph.output[1].name

    def weighted(outputs, labels):
        ce = torch.nn.functional.cross_entropy
        return w1 * ce(outputs[0], labels[0]) + w2 * ce(outputs[1], labels[1])

    labels = torch.stack([labels1, labels2])
    expected = loss_run(two_outputs.torch, (two_outputs.x1, two_outputs.x2), labels, weighted)
    inputs = [two_outputs.x1.numpy(), two_outputs.x2.numpy(), labels1.numpy(), labels2.numpy()]

    forward = two_task_loss(onnxblock.ForwardBlock, (w1, w2))
    with onnxblock.base(two_outputs.onnx):
        _ = forward(out1, out2)
    forward_model = forward.to_model_proto()
    assert [i.name for i in forward_model.graph.input] == [
        "input-0",
        "input-1",
        "labels1",
        "labels2",
    ]
    (loss,) = infer(
        forward_model, dict(zip(["input-0", "input-1", "labels1", "labels2"], inputs, strict=True))
    )
    expected[0].check(loss, name="forward loss")

    training = two_task_loss(onnxblock.TrainingBlock, (w1, w2))
    for name, _ in two_outputs.torch.named_parameters():
        training.requires_grad(name)
    with onnxblock.base(two_outputs.onnx):
        _ = training(out1, out2)
    session = Session.of(save_block_files(tmp_path, training))
    assert list(session.module.input_names(True)) == ["input-0", "input-1", "labels1", "labels2"]
    assert list(session.module.output_names(True)) == [training.graphs.user_outputs[0]]
    assert list(session.module.input_names(False)) == ["input-0", "input-1", "labels1", "labels2"]
    assert list(session.module.output_names(False)) == [training.graphs.user_outputs[0]]
    (loss,) = session.train(*inputs)
    expected[0].check(loss, name="loss")
    assert_grads(session, expected)


def test_label_encoder_composition(tmp_path, net):
    """String class names become class ids with LabelEncoder, then feed the cross entropy (training and eval)."""
    names = ["cat", "dog", "emu", "fox"]
    base_model = copy.deepcopy(net.onnx)
    base_model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    assert "LabelEncoder" not in [n.op_type for n in base_model.graph.node]

    class CrossEntropyOnNames(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self._loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            # the labels input is added by editing the proto, as blocks written for the reference do
            batch = self.base.graph.output[0].type.tensor_type.shape.dim[0]
            self.base.graph.input.append(
                helper.make_tensor_value_info(
                    "label_names", TensorProto.STRING, [batch.dim_param or batch.dim_value]
                )
            )
            encoder = onnxblock.blocks.LabelEncoder(
                default_int64=0, keys_strings=names, values_int64s=[0, 1, 2, 3]
            )
            return self._loss(output_name, encoder("label_names"))

    block = CrossEntropyOnNames()
    for name in net.params:
        block.requires_grad(name)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    for model in block.to_model_proto():  # training and eval models
        assert "LabelEncoder" in [n.op_type for n in model.graph.node]
    session = Session.of(save_block_files(tmp_path, block))
    labels = make_labels(7)
    label_names = np.array([names[i] for i in labels.tolist()], dtype=object)
    (loss,) = session.train(net.x.numpy(), label_names)
    expected = loss_run(net.torch, (net.x,), labels, torch.nn.functional.cross_entropy)
    expected[0].check(loss, name="loss")
    assert_grads(session, expected)
    (eval_loss,) = session.eval(net.x.numpy(), label_names)
    expected[0].check(eval_loss, name="eval loss")


def test_label_encoder_on_integer_labels(net):
    """The reference's mapping direction: int64 codes (521...) to class ids, in a ForwardBlock built in the with."""
    base_model = copy.deepcopy(net.onnx)

    class CodesToClasses(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self._loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            self.accessor.add_input("codes", TensorProto.INT64, ["batch"])
            encoder = onnxblock.blocks.LabelEncoder(
                default_int64=0, keys_int64s=[521, 522, 523, 524], values_int64s=[0, 1, 2, 3]
            )
            return self._loss(output_name, encoder("codes"))

    block = CodesToClasses()
    with onnxblock.base(base_model) as accessor:
        accessor.model.opset_import.append(
            helper.make_opsetid("ai.onnx.ml", 2)
        )  # as the reference's tests do
        _ = block(base_model.graph.output[0].name)
        model = block.to_model_proto()
    assert {o.domain: o.version for o in model.opset_import}["ai.onnx.ml"] == 2
    labels = make_labels(8)
    (loss,) = infer(model, {"input-0": net.x.numpy(), "codes": labels.numpy() + 521})
    with torch.no_grad():
        expected = twice(
            lambda model, x: torch.nn.functional.cross_entropy(model(x), labels), net.torch, net.x
        )
    expected.check(loss, name="loss")


# ------------------------------------------------------------------ string inputs, block patterns, custom blocks
def test_string_inputs_with_cast(tmp_path):
    """The reference's string-input model: Cast(to=FLOAT) then Linear, built on an empty base, then trained."""

    class ParseThenDense(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.parse = onnxblock.blocks.Cast(to=TensorProto.FLOAT)
            self.dense = onnxblock.blocks.Linear(4, 2)

        def build(self, text_name):
            return self.dense(self.parse(text_name))

    block = ParseThenDense()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(
            helper.make_tensor_value_info("text", TensorProto.STRING, [1, 4])
        )
        _ = block("text")
    onnx_model = block.to_model_proto()
    params = [p.name for p in onnx_model.graph.initializer]
    art = artifacts.generate_artifacts(
        onnx_model,
        requires_grad=params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    session = Session.of(art)
    strs = np.array([["1.0", "2.0", "3.0", "4.0"]], dtype=object)
    label = np.array([1], dtype=np.int64)
    weights = {
        p.name: torch.from_numpy(numpy_helper.to_array(p).copy()).requires_grad_()
        for p in onnx_model.graph.initializer
    }

    def dense(weight, bias, x):  # Linear's (in, out) weight, then its bias
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, torch.from_numpy(label))
        loss.backward()
        return loss, [weight.grad, bias.grad]

    expected = twice(dense, *(weights[n] for n in params), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    (loss,) = session.train(strs, label)
    expected[0].check(loss, name="loss")
    for i, name in enumerate(params):
        expected[1][i].check(session.grad(name), rtol=GRAD_RTOL, name=f"{name}'s gradient")
    expected[0].check(session.eval(strs, label)[0], name="eval loss")
    session.step()
    assert session.train(strs, label)[0] < loss


def test_custom_op_library_takes_the_references_argument(tmp_path):
    # A real library needs ONNX Runtime's test build (see the module docstring); the argument and the check apply.
    missing = tmp_path / "libcustom_op_library.so"
    with (
        pytest.raises(FileNotFoundError, match="libcustom_op_library.so"),
        onnxblock.custom_op_library(custom_op_library_path=missing),
    ):
        pass


def test_forward_block_usage_patterns(net):
    pristine = net.onnx.SerializeToString()

    class LossAndLogits(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.mse = onnxblock.loss.MSELoss()

        def build(self, output_name):
            # one loss instance used twice, and two graph outputs
            return self.mse(output_name, "target_a"), self.mse(output_name, "target_b")

    inside_block, outside_block = LossAndLogits(), LossAndLogits()
    with onnxblock.base(net.onnx):
        names = inside_block(net.onnx.graph.output[0].name)
        inside = inside_block.to_model_proto()
    with onnxblock.base(net.onnx):
        _ = outside_block(net.onnx.graph.output[0].name)
    outside = outside_block.to_model_proto()
    assert net.onnx.SerializeToString() == pristine  # the base model is never changed
    assert [o.name for o in inside.graph.output] == list(names)
    assert inside.SerializeToString() == outside.SerializeToString()
    ta, tb = regression_target(10), regression_target(11)
    a, b = infer(inside, {"input-0": net.x.numpy(), "target_a": ta.numpy(), "target_b": tb.numpy()})
    with torch.no_grad():
        expected = twice(
            lambda model, x: [torch.nn.functional.mse_loss(model(x), t) for t in (ta, tb)],
            net.torch,
            net.x,
        )
    expected.check([a, b], name="the two losses")


class ScaledRelu(onnxblock.Block):
    """A block written the reference's way: no super().__init__(), nodes and an initializer appended to the proto."""

    def __init__(self, scale: float):
        self._scale = scale

    def build(self, input_name):
        self.base.graph.initializer.append(
            numpy_helper.from_array(np.array([self._scale], np.float32), "act.scale")
        )
        self.base.graph.node.append(
            helper.make_node("Relu", [input_name], ["act.relu"], name="act_relu")
        )
        self.base.graph.node.append(
            helper.make_node("Mul", ["act.relu", "act.scale"], ["act.out"], name="act_mul")
        )
        return "act.out"


class RegressionPlusTagging(onnxblock.Block):
    """A loss block for two outputs: MSE on the first, BCE on the second, with named targets.

    Like many blocks written for the reference, it never calls ``super().__init__()``.
    """

    def __init__(self):
        self.parts = (onnxblock.loss.MSELoss(), onnxblock.loss.BCEWithLogitsLoss())
        self.total = onnxblock.blocks.Add()

    def build(self, regression, logits):
        mse, bce = self.parts
        return self.total(
            mse(regression, target_name="target1"), bce(logits, target_name="target2")
        )


def test_custom_blocks_written_the_reference_way(tmp_path, two_outputs):
    class ActivatedOutputs(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.act = ScaledRelu(1.5)

        def build(self, out1, out2):
            return self.act(out1), out2

    block = ActivatedOutputs()
    with onnxblock.base(two_outputs.onnx):
        _ = block(*[o.name for o in two_outputs.onnx.graph.output])
    base_model = block.to_model_proto()
    assert [o.name for o in base_model.graph.output] == ["act.out", "output-1"]
    params = [n for n, _ in two_outputs.torch.named_parameters()] + ["act.scale"]
    art = artifacts.generate_artifacts(
        base_model,
        requires_grad=params,
        loss=RegressionPlusTagging(),
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path,
    )
    assert art.input_names == ("input-0", "input-1", "target1", "target2")
    t1, t2 = regression_target(12), probability_target(13)

    def regression_plus_tagging(model, scale, x1, x2, t1, t2):
        o1, o2 = model(x1, x2)
        loss = torch.nn.functional.mse_loss(torch.relu(o1) * scale, t1)
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(o2, t2)
        loss.backward()
        return loss, {**{n: p.grad for n, p in model.named_parameters()}, "act.scale": scale.grad}

    scale = torch.tensor([1.5], requires_grad=True)
    expected = twice(
        regression_plus_tagging, two_outputs.torch, scale, two_outputs.x1, two_outputs.x2, t1, t2
    )
    session = Session.of(art)
    (loss,) = session.train(two_outputs.x1.numpy(), two_outputs.x2.numpy(), t1.numpy(), t2.numpy())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected)


def test_custom_block_reads_a_large_initializer(tmp_path):
    """A regulariser that keeps fc1.weight near its starting value, read from the model inside the build.

    Large initializers are stubs in ``self.base`` (a documented difference); ``self.accessor.tensor`` reads them.
    """
    torch.manual_seed(6)
    model = models.MLP(D_IN, 64, D_OUT)  # fc1.weight is 1.5 KiB: held as a stub during the build
    x = torch.randn(BATCH, D_IN)
    base_model = export(model, (x,))

    class StayNear(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.mse = onnxblock.loss.MSELoss()

        def build(self, output_name):
            stub = next(i for i in self.base.graph.initializer if i.name == "fc1.weight")
            assert list(stub.dims) == [64, D_IN]
            start = self.accessor.constant(
                self.accessor.tensor("fc1.weight") + 0.5, name_hint="fc1_start"
            )
            drift = onnxblock.blocks.ReduceSum(keepdims=False)(
                onnxblock.blocks.Pow(2.0)(onnxblock.blocks.Sub()("fc1.weight", start))
            )
            return self.mse(output_name) + 0.25 * drift

    block = StayNear()
    for name, _ in model.named_parameters():
        block.requires_grad(name)
    with onnxblock.base(base_model):
        _ = block(base_model.graph.output[0].name)
    session = Session.of(save_block_files(tmp_path, block))
    target = regression_target()

    def stay_near(model, x, target):
        start = model.fc1.weight.detach().clone() + 0.5
        loss = (
            torch.nn.functional.mse_loss(model(x), target)
            + 0.25 * ((model.fc1.weight - start) ** 2).sum()
        )
        loss.backward()
        return loss, {n: p.grad for n, p in model.named_parameters()}

    expected = twice(stay_near, model, x, target)
    (loss,) = session.train(x.numpy(), target.numpy())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected)


def test_custom_loss_on_outputs_of_different_ranks(tmp_path):
    """The reference's ``test_custom_loss_function``: constants plus inputs, two ranks, no trainable parameter."""

    class Shifts(torch.nn.Module):
        """Adds a fixed rank-4 offset to one input and a rank-3 one to the other."""

        def __init__(self):
            super().__init__()
            self.offsets = (
                torch.randn(2, 3, 8, 10),
                torch.randn(4, 3, 60),
            )  # > 1 KiB each: held constants

        def forward(self, x, y):
            return x + self.offsets[0], y + self.offsets[1]

    torch.manual_seed(5)
    module = Shifts()
    x, y = torch.randn(2, 3, 8, 10), torch.randn(4, 3, 60)
    art = artifacts.generate_artifacts(
        export(module, (x, y)), loss=RegressionPlusTagging(), artifact_directory=tmp_path
    )
    assert art.requires_grad == () and art.optimizer_model is None
    t1, t2 = torch.randn(2, 3, 8, 10), torch.rand(4, 3, 60)

    def regression_plus_tagging(offset1, offset2, x, y, t1, t2):
        o1, o2 = x + offset1, y + offset2
        return torch.nn.functional.mse_loss(
            o1, t1
        ) + torch.nn.functional.binary_cross_entropy_with_logits(o2, t2)

    expected = twice(regression_plus_tagging, *module.offsets, x, y, t1, t2)
    feeds = {
        "input-0": x.numpy(),
        "input-1": y.numpy(),
        "target1": t1.numpy(),
        "target2": t2.numpy(),
    }
    (loss,) = infer(art.eval_model, feeds)
    expected.check(loss, name="loss")


def test_loss_input_names_pick_the_loss_inputs(tmp_path, two_outputs):
    b_params = [n for n, _ in two_outputs.torch.named_parameters() if n.startswith("b.")]
    art = artifacts.generate_artifacts(
        two_outputs.onnx,
        requires_grad=b_params,
        frozen_params=["a.fc1.weight"],
        loss=artifacts.LossType.CrossEntropyLoss,
        loss_input_names=["output-1"],
        artifact_directory=tmp_path,
    )
    assert art.input_names == ("input-0", "input-1", "labels")
    labels = make_labels(14)

    def second_output(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs[1], labels)

    expected = loss_run(two_outputs.torch, (two_outputs.x1, two_outputs.x2), labels, second_output)
    session = Session.of(art)
    (loss,) = session.train(two_outputs.x1.numpy(), two_outputs.x2.numpy(), labels.numpy())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected, b_params)


def test_model_whose_output_is_the_loss(tmp_path, net):
    """``loss=None``: the base model's first output is the loss, the others are returned after it.

    The model is given as a path, with a prefix.
    """

    class LossThenLogits(onnxblock.ForwardBlock):
        def build(self, output_name):
            return onnxblock.loss.L1Loss(reduction="sum")(output_name), output_name

    block = LossThenLogits()
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    path = tmp_path / "with_loss.onnx"
    onnx.save(block.to_model_proto(), path)
    art = artifacts.generate_artifacts(
        os.fspath(path),
        requires_grad=net.params,
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path / "out",
        prefix="l1_",
    )
    assert sorted(p.name for p in art.files) == [
        "l1_checkpoint",
        "l1_eval_model.onnx",
        "l1_optimizer_model.onnx",
        "l1_training_model.onnx",
    ]
    target = regression_target()
    expected = loss_run(
        net.torch,
        (net.x,),
        target,
        lambda out, t: torch.nn.functional.l1_loss(out, t, reduction="sum"),
    )
    with torch.no_grad():
        outputs = twice(lambda model, x: model(x), net.torch, net.x)
    session = Session.of(art)
    loss, logits = session.train(net.x.numpy(), target.numpy())
    expected[0].check(loss, name="loss")
    outputs.check(logits, name="logits")
    assert_grads(session, expected)

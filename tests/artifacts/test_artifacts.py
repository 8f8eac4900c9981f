"""generate_artifacts: files, options, atomic writes, errors, and the files driving ONNX Runtime's training API."""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support import models
from support.numerics import assert_close
from support.reference64 import gradient_magnitudes, to64

import onnxblocks
from onnxblocks import optim
from onnxblocks.artifacts import Artifacts, LossType, OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.errors import UnknownNameError


@pytest.fixture
def mlp():
    return models.case("mlp", "torchscript")


def _generate(case, directory, **kwargs):
    kwargs.setdefault("requires_grad", case.params)
    kwargs.setdefault("loss", LossType.MSELoss)
    return generate_artifacts(case.onnx_model, artifact_directory=directory, **kwargs)


def test_files_and_result(tmp_path, mlp):
    art = _generate(
        mlp, tmp_path / "out", optimizer=OptimType.AdamW, prefix="mlp_", nominal_checkpoint=True
    )
    assert isinstance(art, Artifacts) and art.directory == tmp_path / "out"
    expected = {
        "mlp_training_model.onnx",
        "mlp_eval_model.onnx",
        "mlp_checkpoint",
        "mlp_optimizer_model.onnx",
        "mlp_nominal_checkpoint",
    }
    assert set(os.listdir(tmp_path / "out")) == expected
    assert {p.name for p in art.files} == expected
    assert art.training_model.name == "mlp_training_model.onnx" and art.optimizer_model.is_file()
    assert (
        art.training_model_ort is None
        and art.requires_grad == tuple(mlp.params)
        and art.frozen_params == ()
    )
    assert art.input_names == ("x", "target") and art.loss_name == art.output_names[0]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging leftovers
    html = art._repr_html_()
    assert html is None or "training_model" in html


def test_checkpoint_holds_the_parameters_and_frozen_ones(tmp_path, mlp):
    art = _generate(
        mlp, tmp_path, requires_grad=["fc1.weight", "fc2.weight"], frozen_params=["fc1.bias"]
    )
    ckpt = load_checkpoint(art.checkpoint)
    assert list(ckpt.trainable) == ["fc1.weight", "fc2.weight"] and list(ckpt.frozen) == [
        "fc1.bias"
    ]
    for name, value in {**ckpt.trainable, **ckpt.frozen}.items():
        np.testing.assert_array_equal(value, models.param_arrays(mlp.torch_model)[name])
    trainer = models.OrtTrainer(art)
    trainer.train_step(mlp.inputs["x"], mlp.target)
    x, target = torch.from_numpy(mlp.inputs["x"]), torch.from_numpy(mlp.target)
    model, model64 = copy.deepcopy(mlp.torch_model), to64(mlp.torch_model)
    torch.nn.functional.mse_loss(model(x), target).backward()
    torch.nn.functional.mse_loss(model64(x.double()), target.double()).backward()
    terms = gradient_magnitudes(mlp.torch_model, [x], target, torch.nn.functional.mse_loss)
    expected, expected64 = model.fc2.weight.grad.numpy(), model64.fc2.weight.grad.numpy()
    assert_close(
        trainer.grad("fc2.weight"), expected, expected64, rtol=1e-4, scale=terms["fc2.weight"]
    )


def test_ort_format_models_train_like_onnx_ones(tmp_path, mlp):
    art = _generate(mlp, tmp_path, optimizer=OptimType.SGD, ort_format=True)
    assert (
        art.training_model_ort.is_file()
        and art.eval_model_ort.is_file()
        and art.optimizer_model_ort.is_file()
    )
    as_ort = Artifacts(
        **{
            **art.__dict__,
            "training_model": art.training_model_ort,
            "eval_model": art.eval_model_ort,
            "optimizer_model": art.optimizer_model_ort,
        }
    )
    losses = []
    for files in (art, as_ort):
        trainer = models.OrtTrainer(files)
        trainer.optimizer.set_learning_rate(0.1)
        run = []
        for _ in range(3):
            run.append(trainer.train_step(mlp.inputs["x"], mlp.target)[0])
            trainer.step()
        losses.append(run)
    # ONNX Runtime on the same model in two formats: no float64 truth
    assert_close(np.array(losses[0]), np.array(losses[1]), rtol=1e-6, name="losses")
    assert losses[0][-1] < losses[0][0]


def test_nominal_checkpoint_names_parameters_without_values(tmp_path, mlp):
    art = _generate(
        mlp,
        tmp_path,
        nominal_checkpoint=True,
        frozen_params=["fc2.bias"],
        requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
    )
    nominal = load_checkpoint(art.nominal_checkpoint)
    full = load_checkpoint(art.checkpoint)
    assert nominal.is_nominal and not full.is_nominal
    assert list(nominal.trainable) == list(full.trainable) and list(nominal.frozen) == ["fc2.bias"]
    assert art.nominal_checkpoint.stat().st_size < art.checkpoint.stat().st_size
    # ONNX Runtime builds a training session from it; the values come in through a buffer
    trainer = models.OrtTrainer(art, checkpoint=art.nominal_checkpoint)
    size = trainer.module.get_parameters_size(False)
    assert size == sum(v.size for v in (*full.trainable.values(), *full.frozen.values()))
    values = np.concatenate([v.ravel() for v in (*full.trainable.values(), *full.frozen.values())])
    trainer.module.copy_buffer_to_parameters(
        trainer.C.OrtValue.ortvalue_from_numpy(values, trainer.device), False
    )
    reference = models.OrtTrainer(art)
    got, expected = (
        trainer.train_step(mlp.inputs["x"], mlp.target),
        reference.train_step(mlp.inputs["x"], mlp.target),
    )
    assert_close(np.array(got), np.array(expected), rtol=1e-6, name="outputs")


def test_custom_optimizer_attributes_are_used(tmp_path, mlp):
    adamw = optim.AdamW(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    art = _generate(mlp, tmp_path, optimizer=adamw)
    optimizer_model = onnx.load(art.optimizer_model)
    (node,) = [n for n in optimizer_model.graph.node if n.op_type == "AdamWOptimizer"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    # float32 attributes: exactly the float32 of each setting
    assert attrs["alpha"] == np.float32(0.8) and attrs["beta"] == np.float32(0.95)
    assert attrs["epsilon"] == np.float32(1e-6) and attrs["weight_decay"] == np.float32(0.1)
    trainer = models.OrtTrainer(art)
    trainer.optimizer.set_learning_rate(0.05)
    x, target = torch.from_numpy(mlp.inputs["x"]), torch.from_numpy(mlp.target)
    runs = []  # torch in float32 and in float64
    for model in (copy.deepcopy(mlp.torch_model), to64(mlp.torch_model)):
        opt = torch.optim.AdamW(
            model.parameters(), lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1
        )
        runs.append((model, opt, next(model.parameters()).dtype))
    for _ in range(5):
        (loss,) = trainer.train_step(mlp.inputs["x"], mlp.target)
        trainer.step()
        expected = []
        for model, opt, dtype in runs:
            opt.zero_grad()
            value = torch.nn.functional.mse_loss(model(x.to(dtype)), target.to(dtype))
            value.backward()
            opt.step()
            expected.append(value.detach().numpy())
        assert_close(loss, *expected, rtol=1e-5, name="loss")
    params64 = dict(runs[1][0].named_parameters())
    for name, param in runs[0][0].named_parameters():
        expected, expected64 = param.detach().numpy(), params64[name].detach().numpy()
        assert_close(trainer.param(name), expected, expected64, rtol=1e-4, name=name)


def test_loss_input_names_and_additional_outputs(tmp_path):
    torch.manual_seed(0)

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 2)
            self.b = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    net = TwoHeads()
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    onnx_model = models.export(net, {"x": x}, "torchscript")
    second = onnx_model.graph.output[1].name
    art = generate_artifacts(
        onnx_model,
        requires_grad=["b.weight", "b.bias"],
        loss=LossType.L1Loss,
        loss_input_names=[second],
        additional_output_names=["output"],
        artifact_directory=tmp_path,
    )
    assert art.output_names[1] == "output"
    target = np.ones((4, 2), np.float32)
    trainer = models.OrtTrainer(art)
    loss, first = trainer.train_step(x, target)
    net64 = to64(net)
    out_a, out_b = net(torch.from_numpy(x))
    out_a64, out_b64 = net64(torch.from_numpy(x).double())
    expected = torch.nn.functional.l1_loss(out_b, torch.from_numpy(target))
    expected64 = torch.nn.functional.l1_loss(out_b64, torch.from_numpy(target).double())
    expected.backward()
    expected64.backward()
    assert_close(
        loss, expected.detach().numpy(), expected64.detach().numpy(), rtol=1e-5, name="loss"
    )
    assert_close(first, out_a.detach().numpy(), out_a64.detach().numpy(), rtol=1e-5, name="output")
    terms = gradient_magnitudes(
        net, [x], target, lambda out, t: torch.nn.functional.l1_loss(out[1], t)
    )
    grad, grad64 = net.b.weight.grad.numpy(), net64.b.weight.grad.numpy()
    assert_close(
        trainer.grad("b.weight"), grad, grad64, rtol=1e-4, scale=terms["b.weight"], name="b.weight"
    )


def test_model_path_with_external_data(tmp_path, mlp):
    path = tmp_path / "model" / "mlp.onnx"
    path.parent.mkdir()
    onnx.save(
        copy.deepcopy(mlp.onnx_model),
        path,
        save_as_external_data=True,
        location="mlp.data",
        size_threshold=0,
    )
    art = generate_artifacts(
        path, requires_grad=mlp.params, loss=LossType.MSELoss, artifact_directory=tmp_path / "art"
    )
    ckpt = load_checkpoint(art.checkpoint)
    for name, value in models.param_arrays(mlp.torch_model).items():
        np.testing.assert_array_equal(ckpt.trainable[name], value)
    (loss,) = models.OrtTrainer(art).train_step(mlp.inputs["x"], mlp.target)
    assert np.isfinite(loss)


# ------------------------------------------------------------------ atomic writes
def test_failure_leaves_no_directory(tmp_path, mlp, monkeypatch):
    import onnxblocks.checkpoint

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(onnxblocks.checkpoint, "save_checkpoint", fail)
    with pytest.raises(OSError, match="disk full"):
        _generate(mlp, tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_failure_keeps_existing_artifacts_and_success_replaces_them(tmp_path, mlp, monkeypatch):
    import onnxblocks.checkpoint

    first = _generate(mlp, tmp_path, requires_grad=["fc1.weight"])
    (tmp_path / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in first.files}
    real = onnxblocks.checkpoint.save_checkpoint
    monkeypatch.setattr(
        onnxblocks.checkpoint,
        "save_checkpoint",
        lambda *a, **k: (_ for _ in ()).throw(OSError("x")),
    )
    with pytest.raises(OSError):
        _generate(mlp, tmp_path)
    assert {p: p.read_bytes() for p in first.files} == before
    assert sorted(os.listdir(tmp_path)) == sorted([p.name for p in first.files] + ["notes.txt"])
    monkeypatch.setattr(onnxblocks.checkpoint, "save_checkpoint", real)
    second = _generate(mlp, tmp_path)
    assert list(load_checkpoint(second.checkpoint).trainable) == mlp.params
    assert sorted(os.listdir(tmp_path)) == sorted([p.name for p in second.files] + ["notes.txt"])


def test_failure_removes_the_directories_it_created(tmp_path, mlp, monkeypatch):
    import onnxblocks.checkpoint

    monkeypatch.setattr(
        onnxblocks.checkpoint,
        "save_checkpoint",
        lambda *a, **k: (_ for _ in ()).throw(OSError("x")),
    )
    with pytest.raises(OSError):
        _generate(mlp, tmp_path / "a" / "b" / "out")
    assert os.listdir(tmp_path) == []


def test_artifacts_of_an_earlier_run_are_not_left_behind(tmp_path, mlp):
    _generate(mlp, tmp_path, optimizer=OptimType.SGD, ort_format=True, nominal_checkpoint=True)
    (tmp_path / "other_training_model.onnx").write_text("another prefix: kept")
    second = _generate(mlp, tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [p.name for p in second.files] + ["other_training_model.onnx"]
    )
    assert second.optimizer_model is None and not (tmp_path / "optimizer_model.onnx").exists()


def test_nothing_written_to_the_working_directory(tmp_path, mlp, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _generate(mlp, tmp_path / "out", ort_format=True, optimizer=OptimType.SGD)
    assert os.listdir(cwd) == []
    art = _generate(mlp, None)  # the default directory is the working directory
    assert art.directory == cwd and (cwd / "training_model.onnx").is_file()


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"loss": "mse"}, TypeError, "loss must be a LossType .*MSELoss"),
        (
            {"loss": onnxblocks.losses.MSELoss},
            TypeError,
            r"not the class MSELoss: pass MSELoss\(\)",
        ),
        ({"optimizer": "adamw"}, TypeError, "optimizer must be an OptimType"),
        ({"prefix": "sub/x_"}, ValueError, "path separator"),
        (
            {"frozen_params": ["fc1.weight"]},
            ValueError,
            r"\['fc1.weight'\] cannot be both trainable",
        ),
        ({"requires_grad": ["fc1.wieght"]}, UnknownNameError, "Did you mean 'fc1.weight'"),
        ({"requires_grad": "fc1.weight"}, TypeError, r"must be a list of names.*\['fc1.weight'\]"),
        ({"additional_output_names": ["nope"]}, UnknownNameError, "additional output 'nope'"),
        (
            {"requires_grad": [], "optimizer": OptimType.AdamW},
            ValueError,
            "at least one trainable parameter",
        ),
        ({"custom_op_library": "missing.so"}, FileNotFoundError, "missing.so"),
    ],
)
def test_bad_arguments_are_clear_errors_and_write_nothing(tmp_path, mlp, kwargs, error, match):
    with pytest.raises(error, match=match):
        _generate(mlp, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_custom_op_library_that_does_not_load(tmp_path, mlp):
    fake = tmp_path / "ops.so"
    fake.write_text("not a shared library")
    with pytest.raises(OSError, match=r"could not load the custom op library '.*ops.so'"):
        _generate(mlp, tmp_path / "out", custom_op_library=fake)
    assert not (tmp_path / "out").exists()


def test_model_of_the_wrong_kind(tmp_path):
    with pytest.raises(TypeError, match="onnx.ModelProto or the path"):
        generate_artifacts(b"bytes", artifact_directory=tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere.onnx"):
        generate_artifacts(tmp_path / "nowhere.onnx", artifact_directory=tmp_path)

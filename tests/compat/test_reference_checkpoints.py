"""The reference's checkpoints and ORT-format models, read by ONNX Runtime's training API.

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
from support.numerics import assert_close
from support.reference import (
    RTOL,
    Session,
    infer,
    loss_block,
    make_labels,
    regression_target,
    save_block_files,
    twice,
)

from onnxblocks.compat import artifacts, onnxblock


# ------------------------------------------------------------------ checkpoints and ORT format
def test_nominal_checkpoint_trains_like_the_complete_one(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
        nominal_checkpoint=True,
    )
    assert art.nominal_checkpoint.stat().st_size < art.checkpoint.stat().st_size
    complete = Session.of(art)
    nominal = Session(
        art.training_model, art.eval_model, art.nominal_checkpoint, art.optimizer_model
    )
    assert list(nominal.state.parameter_names()) == list(complete.state.parameter_names())
    with pytest.raises(Exception, match="Please load the parameter states first"):
        nominal.state.get_parameter("fc1.weight").data  # noqa: B018 - the access raises
    nominal.module.copy_buffer_to_parameters(complete.flat(trainable_only=False), False)
    labels = make_labels()
    (loss1,) = complete.train(net.x.numpy(), labels.numpy())
    (loss2,) = nominal.train(net.x.numpy(), labels.numpy())
    with torch.no_grad():
        expected = twice(
            lambda model, x: torch.nn.functional.cross_entropy(model(x), labels), net.torch, net.x
        )
    expected.check(loss1, name="the complete checkpoint's loss")
    expected.check(loss2, name="the nominal checkpoint's loss")
    complete.step()
    nominal.step()
    np.testing.assert_array_equal(complete.flat(False).numpy(), nominal.flat(False).numpy())


def test_ort_format_files_train_like_the_onnx_files(tmp_path, net):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
        ort_format=True,
    )
    for path in (art.training_model_ort, art.eval_model_ort, art.optimizer_model_ort):
        assert path.suffix == ".ort" and path.is_file()
    base_opset = {o.domain: o.version for o in net.onnx.opset_import}[""]
    for path in (art.training_model, art.eval_model, art.optimizer_model):
        assert {o.domain: o.version for o in onnx.load(path).opset_import}[""] == base_opset, (
            path.name
        )
    from_onnx, from_ort = Session.of(art), Session.of(art, ort=True)
    labels = make_labels()
    for _ in range(2):
        (a,) = from_onnx.train(net.x.numpy(), labels.numpy())
        (b,) = from_ort.train(net.x.numpy(), labels.numpy())
        # two float32 runs of the same graphs, neither the truth: rtol and the floor of their magnitude
        assert_close(b, a, rtol=1e-6, name="the ORT-format loss")
        from_onnx.step()
        from_ort.step()
    assert_close(
        from_ort.flat(False).numpy(), from_onnx.flat(False).numpy(), rtol=1e-6, name="parameters"
    )
    eval_ort, eval_onnx = (
        from_ort.eval(net.x.numpy(), labels.numpy())[0],
        from_onnx.eval(net.x.numpy(), labels.numpy())[0],
    )
    assert_close(eval_ort, eval_onnx, rtol=1e-6, name="eval loss")


def test_checkpoint_round_trips(tmp_path, net):
    block = loss_block(onnxblock.TrainingBlock, "MSELoss", {})
    block.requires_grad("fc2.weight")
    block.requires_grad("fc1.bias", False)
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    path = tmp_path / "checkpoint"
    onnxblock.save_checkpoint(block.parameters(), path)
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "nominal", nominal_checkpoint=True)
    torch_params = {n: p.detach().numpy() for n, p in net.torch.named_parameters()}

    state = C.load_checkpoint(os.fspath(path))  # ONNX Runtime reads what onnxblock wrote
    assert sorted(state.parameter_names()) == ["fc1.bias", "fc2.weight"]
    assert (
        state.get_parameter("fc2.weight").requires_grad
        and not state.get_parameter("fc1.bias").requires_grad
    )
    for name in ("fc1.bias", "fc2.weight"):
        np.testing.assert_array_equal(state.get_parameter(name).data.numpy(), torch_params[name])
    assert sorted(C.load_checkpoint(os.fspath(tmp_path / "nominal")).parameter_names()) == [
        "fc1.bias",
        "fc2.weight",
    ]

    zero_model = copy.deepcopy(net.onnx)
    for init in zero_model.graph.initializer:
        init.CopyFrom(
            numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name)
        )
    assert (
        onnxblock.load_checkpoint_to_model(path, zero_model) is None
    )  # in place, as the reference
    loaded = {i.name: numpy_helper.to_array(i) for i in zero_model.graph.initializer}
    for name in ("fc1.bias", "fc2.weight"):
        np.testing.assert_array_equal(loaded[name], torch_params[name])
    assert not loaded["fc1.weight"].any() and not loaded["fc2.bias"].any()

    # a checkpoint that ONNX Runtime wrote after training goes back into the model
    files = save_block_files(tmp_path, block)
    session = Session.of(files)
    target = regression_target()
    session.train(net.x.numpy(), target.numpy())
    trained = tmp_path / "trained_checkpoint"
    C.save_checkpoint(session.state, os.fspath(trained), False)
    reloaded = Session(files.training_model, files.eval_model, trained)
    np.testing.assert_array_equal(reloaded.flat(False).numpy(), session.flat(False).numpy())
    model = copy.deepcopy(net.onnx)
    onnxblock.load_checkpoint_to_model(trained, model)
    (eval_loss,) = session.eval(net.x.numpy(), target.numpy())
    (out,) = infer(model, {"input-0": net.x.numpy()})
    # the MSE in float32 and float64 NumPy from the exported model's float32 output
    squares = (out - target.numpy()) ** 2
    squares64 = (out.astype(np.float64) - target.numpy()) ** 2
    assert_close(
        eval_loss,
        np.mean(squares, dtype=np.float32),
        np.mean(squares64),
        rtol=RTOL,
        name="eval loss",
    )
    with pytest.raises(RuntimeError, match="No checkpoint parameters provided"):
        onnxblock.save_checkpoint(None, path)

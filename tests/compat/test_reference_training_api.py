"""The reference's end-to-end programs: artifacts trained with ONNX Runtime's training API.

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
from onnxruntime.capi import _pybind_state as C
from support.reference import (
    ATOL,
    BATCH,
    D_IN,
    D_OUT,
    RTOL,
    Session,
    assert_grads,
    hf_adamw_step,
    infer,
    make_labels,
    torch_grads,
)

from onnxblocks.compat import artifacts, onnxblock


# ------------------------------------------------------------------ end to end with the training API
def test_on_device_training_recipe(tmp_path, net):
    """The low-level recipe of ONNX Runtime's on-device training examples, step by step, then trained."""

    class ClassifierWithLoss(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            return self.loss(output_name), output_name  # the logits stay an output

    training_block = ClassifierWithLoss()
    for init in net.onnx.graph.initializer:
        training_block.requires_grad(init.name, init.name != "fc1.bias")
    with onnxblock.base(net.onnx):
        _ = training_block(*[output.name for output in net.onnx.graph.output])
        training_model, eval_model = training_block.to_model_proto()
        model_params = training_block.parameters()
    optimizer_block = onnxblock.optim.AdamW()
    with onnxblock.empty_base():
        _ = optimizer_block(model_params)
        optimizer_model = optimizer_block.to_model_proto()
    for name, proto in (
        ("training_model.onnx", training_model),
        ("eval_model.onnx", eval_model),
        ("optimizer_model.onnx", optimizer_model),
    ):
        onnx.save(proto, tmp_path / name)
    onnxblock.save_checkpoint(model_params, tmp_path / "checkpoint")

    session = Session(
        tmp_path / "training_model.onnx",
        tmp_path / "eval_model.onnx",
        tmp_path / "checkpoint",
        tmp_path / "optimizer_model.onnx",
    )
    assert [p.name for p in model_params[1]] == ["fc1.bias"]
    labels = make_labels()
    model = copy.deepcopy(net.torch)
    model.fc1.bias.requires_grad_(False)
    logits = model(net.x)
    expected = torch.nn.functional.cross_entropy(logits, labels)
    expected.backward()
    loss, out = session.train(net.x.numpy(), labels.numpy())
    np.testing.assert_allclose(loss, expected.item(), rtol=RTOL)
    np.testing.assert_allclose(out, logits.detach().numpy(), rtol=RTOL, atol=ATOL)
    assert_grads(session, torch_grads(model))
    session.optimizer.set_learning_rate(0.05)
    losses = [float(loss)]
    for _ in range(4):
        session.step()
        losses.append(float(session.train(net.x.numpy(), labels.numpy())[0]))
    assert losses == sorted(losses, reverse=True)
    np.testing.assert_array_equal(session.param("fc1.bias"), net.torch.fc1.bias.detach().numpy())  # frozen


@pytest.mark.parametrize("optim", ["AdamW", "SGD"])
def test_training_end_to_end_matches_torch(tmp_path, net, optim):
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType[optim],
        artifact_directory=tmp_path,
    )
    session = Session.of(art)
    assert session.optimizer.get_learning_rate() == pytest.approx(0.001)  # ONNX Runtime's default
    lr = 0.05
    session.optimizer.set_learning_rate(lr)
    assert session.optimizer.get_learning_rate() == pytest.approx(lr)
    model = copy.deepcopy(net.torch)
    torch_sgd = torch.optim.SGD(model.parameters(), lr=lr)
    m = {n: np.zeros(p.shape) for n, p in model.named_parameters()}
    v = {n: np.zeros(p.shape) for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(9)
    batches = [
        (torch.randn(BATCH, D_IN, generator=g), torch.randint(0, D_OUT, (BATCH,), generator=g)) for _ in range(2)
    ]
    losses = []
    for t in range(1, 9):
        x, labels = batches[t % 2]
        (loss,) = session.train(x.numpy(), labels.numpy())
        session.step()
        model.zero_grad()
        expected = torch.nn.functional.cross_entropy(model(x), labels)
        expected.backward()
        np.testing.assert_allclose(loss, expected.item(), rtol=1e-4, err_msg=f"step {t}")
        losses.append(float(loss))
        if optim == "SGD":
            torch_sgd.step()
            continue
        with torch.no_grad():  # the reference's AdamW: Hugging Face mode, eps=1e-6, no weight decay
            for n, p in model.named_parameters():
                w, m[n], v[n] = hf_adamw_step(
                    p.double().numpy(), p.grad.double().numpy(), m[n], v[n], t, lr, 0.9, 0.999, 1e-6, 0.0
                )
                p.copy_(torch.from_numpy(w))
    for n, p in model.named_parameters():
        np.testing.assert_allclose(session.param(n), p.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=n)
    assert losses[-2] < losses[0] and losses[-1] < losses[1]  # the same two batches, alternating
    # the reference's LinearLRScheduler sets the rate the optimizer model runs with (warm-up from 0)
    fresh = Session.of(art)
    scheduler = C.LinearLRScheduler(fresh.optimizer, 1, 3, 0.02)
    assert fresh.optimizer.get_learning_rate() == 0.0
    start = fresh.flat(False).numpy().copy()
    fresh.train(*(b.numpy() for b in batches[0]))
    fresh.step()
    np.testing.assert_array_equal(fresh.flat(False).numpy(), start)  # the first step ran at rate 0
    scheduler.scheduler_step()
    rate = fresh.optimizer.get_learning_rate()
    assert 0.0 < rate <= 0.02
    before = {n: fresh.param(n) for n in net.params}
    fresh.train(*(b.numpy() for b in batches[0]))
    grads = {n: fresh.grad(n) for n in net.params}
    fresh.step()
    if optim == "SGD":
        for n in net.params:
            np.testing.assert_allclose(fresh.param(n), before[n] - rate * grads[n], rtol=1e-5, atol=1e-7)
    # the state ONNX Runtime saves (with the optimizer's state) loads into a fresh Module and into the base model
    saved = tmp_path / "trained"
    session.state.add_property("epoch", 4)
    C.save_checkpoint(session.state, os.fspath(saved), True)
    again = Session(art.training_model, art.eval_model, saved, art.optimizer_model)
    assert again.state.get_property("epoch") == 4
    np.testing.assert_array_equal(again.flat(False).numpy(), session.flat(False).numpy())
    trained = copy.deepcopy(net.onnx)
    onnxblock.load_checkpoint_to_model(saved, trained)
    (logits,) = infer(trained, {"input-0": net.x.numpy()})
    np.testing.assert_allclose(logits, model(net.x).detach().numpy(), rtol=1e-4, atol=1e-5)

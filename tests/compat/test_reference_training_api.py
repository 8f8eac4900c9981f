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
from support.optim_family import step_magnitudes
from support.reference import (
    BATCH,
    D_IN,
    D_OUT,
    Session,
    Twice,
    assert_grads,
    hf_adamw_step,
    infer,
    loss_run,
    make_labels,
    twice,
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
    expected = loss_run(model, (net.x,), labels, torch.nn.functional.cross_entropy)
    with torch.no_grad():
        logits = twice(lambda model, x: model(x), model, net.x)
    loss, out = session.train(net.x.numpy(), labels.numpy())
    expected[0].check(loss, name="loss")
    logits.check(out, name="logits")
    assert_grads(session, expected)
    session.optimizer.set_learning_rate(0.05)
    losses = [float(loss)]
    for _ in range(4):
        session.step()
        losses.append(float(session.train(net.x.numpy(), labels.numpy())[0]))
    assert losses == sorted(losses, reverse=True)
    np.testing.assert_array_equal(
        session.param("fc1.bias"), net.torch.fc1.bias.detach().numpy()
    )  # frozen


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
    assert np.float32(session.optimizer.get_learning_rate()) == np.float32(
        0.001
    )  # ONNX Runtime's default
    lr = 0.05
    session.optimizer.set_learning_rate(lr)
    assert np.float32(session.optimizer.get_learning_rate()) == np.float32(lr)
    g = torch.Generator().manual_seed(9)
    batches = [
        (torch.randn(BATCH, D_IN, generator=g), torch.randint(0, D_OUT, (BATCH,), generator=g))
        for _ in range(2)
    ]
    expected = twice(lambda model: _torch_training(model, optim, lr, batches, net.x), net.torch)
    losses = []
    for t in range(1, 9):
        x, labels = batches[t % 2]
        (loss,) = session.train(x.numpy(), labels.numpy())
        session.step()
        expected[0][t - 1].check(loss, rtol=1e-5, name=f"loss at step {t}")
        losses.append(float(loss))
    history64 = expected.value64[1]
    for n, start in net.torch.named_parameters():
        scale = step_magnitudes(start.detach().numpy(), [params[n] for params in history64])[-1]
        expected[1][-1][n].check(
            session.param(n), rtol=1e-5, scale=scale, name=f"{n} after 8 steps"
        )
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
    if optim == "SGD":  # p - rate g on the session's gradients, in float32 and float64
        for n in net.params:
            step = Twice(
                before[n] - np.float32(rate) * grads[n],
                before[n] - rate * grads[n].astype(np.float64),
            )
            scale = np.abs(before[n]) + rate * np.abs(grads[n])
            step.check(
                fresh.param(n),
                rtol=1e-5,
                scale=scale,
                name=f"{n} after the step at the scheduled rate",
            )
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
    expected[2].check(logits, rtol=1e-5, name="the trained model's logits")


def _torch_training(
    model: torch.nn.Module, optim: str, lr: float, batches: list, x_logits: torch.Tensor
) -> tuple:
    """torch's 8 steps of the training above, in the model's dtype: losses, parameters after each, the logits of
    ``x_logits`` after them.

    The reference's AdamW is Hugging Face mode, eps=1e-6, no weight decay (NumPy, in the same dtype).
    """
    dtype = next(model.parameters()).dtype
    torch_sgd = torch.optim.SGD(model.parameters(), lr=lr)
    m = {n: np.zeros(tuple(p.shape), p.detach().numpy().dtype) for n, p in model.named_parameters()}
    v = {n: np.zeros_like(a) for n, a in m.items()}
    losses, history = [], []
    for t in range(1, 9):
        x, labels = batches[t % 2]
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(dtype)), labels)
        loss.backward()
        losses.append(loss.detach())
        if optim == "SGD":
            torch_sgd.step()
        else:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    w, m[n], v[n] = hf_adamw_step(
                        p.numpy(), p.grad.numpy(), m[n], v[n], t, lr, 0.9, 0.999, 1e-6, 0.0
                    )
                    p.copy_(torch.from_numpy(w))
        history.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return losses, history, model(x_logits.to(dtype))

"""Small torch models of many families, exported with both torch exporters, trained through ONNX Runtime.

These are the cases of the exporter sweep (docs/training.md, "Exporter sweep")
that failed before the normalisation passes were added and work now. For each
(model, exporter): generate_artifacts with every float parameter trainable, then

* the loss and every parameter gradient of one ``train_step`` (ONNX Runtime's
  training API, C bindings) equal torch.autograd's (rtol 1e-5 and 1e-4; torch runs in
  float32 and in float64, ``support.numerics``, gradient floors from ``support.reference64``);
* a few AdamW steps reduce the loss;
* the eval model, run in an ``onnxruntime.InferenceSession``, equals torch in eval mode.

Exporters: ``ts`` is ``torch.onnx.export(dynamo=False, do_constant_folding=False,
opset_version=17)``; ``dyn18`` / ``dyn21`` are ``dynamo=True, optimize=False`` at
opset 18 / 21. Models with random dropout only check the eval model and training, and that training
lowers the eval model's loss (dropout off), not the noisy training loss.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from support import models, sweep
from support.numerics import assert_close
from support.reference64 import gradient_magnitudes, to64
from torch import nn

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    def get(name, exporter):
        return sweep.build(name, exporter, str(tmp_path_factory.mktemp(f"{name}-{exporter}")))

    yield get
    sweep.build.cache_clear()


def _criterion(case: sweep.Case):
    """The case's torch loss on its model's output (the first output of a two-output model)."""
    loss = models.torch_loss(case.loss)
    return lambda out, target: loss(out[0] if case.multi else out, target)


def _torch_loss(case: sweep.Case, model: nn.Module, dtype=torch.float32) -> torch.Tensor:
    def tensor(value):
        t = torch.from_numpy(value)
        return t.to(dtype) if t.is_floating_point() else t

    return _criterion(case)(model(*[tensor(v) for v in case.inputs.values()]), tensor(case.target))


@pytest.mark.parametrize(
    ("name", "exporter"), sweep.CASES, ids=[f"{n}-{e}" for n, e in sweep.CASES]
)
def test_exported_model_trains_like_torch(built, name, exporter):
    case, names, artifacts = built(name, exporter)
    trainer = models.OrtTrainer(artifacts)
    (loss,) = trainer.train_step(*case.inputs.values(), case.target)[:1]
    if not case.random:
        model, model64 = copy.deepcopy(case.model).train(), to64(case.model).train()
        expected, expected64 = _torch_loss(case, model), _torch_loss(case, model64, torch.float64)
        expected.backward()
        expected64.backward()
        assert_close(
            loss, expected.detach().numpy(), expected64.detach().numpy(), rtol=1e-5, name="loss"
        )
        terms = gradient_magnitudes(model, case.inputs.values(), case.target, _criterion(case))
        params64 = dict(model64.named_parameters())
        for pname, param in model.named_parameters():
            if pname in case.frozen or not sweep.is_trained(case, pname):
                continue
            grad64 = params64[pname].grad.numpy()
            got = trainer.grad(names[pname])
            assert_close(
                got, param.grad.numpy(), grad64, rtol=1e-4, scale=terms.get(pname), name=pname
            )
    trainer.module.lazy_reset_grad()
    trainer.optimizer.set_learning_rate(1e-2)
    batch = (*case.inputs.values(), case.target)
    # dropout draws a new mask at every step, so its training losses are noisy (a run's sixth loss
    # was above its first: 0.997 against 0.943); the eval model's loss (no dropout) is not
    before = float(trainer.eval_step(*batch)[0]) if case.random else None
    losses = []
    for _ in range(6):
        losses.append(float(trainer.train_step(*batch)[0]))
        trainer.step()
    if before is not None:
        after = float(trainer.eval_step(*batch)[0])
        assert after < before, f"the eval loss went from {before} to {after} in 6 steps"
    else:
        assert losses[-1] < losses[0]


@pytest.mark.parametrize(
    ("name", "exporter"), sweep.CASES, ids=[f"{n}-{e}" for n, e in sweep.CASES]
)
def test_eval_model_matches_torch_eval(built, name, exporter):
    import onnxruntime as ort

    case, names, artifacts = built(name, exporter)
    session = ort.InferenceSession(
        os.fspath(artifacts.eval_model), providers=["CPUExecutionProvider"]
    )
    model = copy.deepcopy(case.model).eval()
    feeds = dict(case.inputs)
    inputs = [i.name for i in session.get_inputs()]
    (target,) = [n for n in inputs if n not in case.inputs and n not in set(names.values())]
    feeds[target] = case.target
    for pname, param in model.named_parameters():
        if names[pname] in inputs:  # untrained, unfrozen parameters are constants of the model
            feeds[names[pname]] = param.detach().numpy()
    got = session.run(None, feeds)
    model64 = to64(case.model).eval()
    # gradients on: torch's fused inference path stays off
    expected, expected64 = _torch_loss(case, model), _torch_loss(case, model64, torch.float64)
    assert_close(
        got[0], expected.detach().numpy(), expected64.detach().numpy(), rtol=1e-5, name="eval loss"
    )
    if case.multi:
        inputs = [torch.from_numpy(v) for v in case.inputs.values()]
        with torch.no_grad():
            aux, aux64 = model(*inputs)[1], model64(*[to64(t) for t in inputs])[1]
        assert_close(got[1], aux.numpy(), aux64.numpy(), rtol=1e-4, name="second output")


def test_double_model_is_refused_with_a_remedy(tmp_path):
    model = sweep.Activation(nn.ReLU()).double()
    case = sweep.Case(
        model, {"x": np.random.default_rng(0).standard_normal((6, 4))}, np.zeros((6, 3)), "mse"
    )
    exported = sweep.export(case, "ts")
    with pytest.raises(TypeError, match=r"double.*model\.float\(\)"):
        generate_artifacts(
            exported,
            requires_grad=[n for n, _ in model.named_parameters()],
            loss=LossType.MSELoss,
            artifact_directory=tmp_path / "a",
        )
    assert not (tmp_path / "a").exists()


def test_onnxscript_model_with_rewritten_ops_trains_like_torch(tmp_path):
    """Reflect Pad, InstanceNormalization, Elu, linear Resize, ReduceMax and CastLike, written by hand."""
    model = sweep.onnxscript_model()
    params = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    artifacts = generate_artifacts(
        model,
        requires_grad=list(params),
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    rng = np.random.default_rng(1)
    x, target = (
        rng.standard_normal((3, 2, 6, 6)).astype(np.float32),
        rng.standard_normal((3, 4)).astype(np.float32),
    )
    trainer = models.OrtTrainer(artifacts)
    (loss,) = trainer.train_step(x, target)

    references = []
    for dtype in (torch.float32, torch.float64):
        tensors = {
            n: torch.from_numpy(v.copy()).to(dtype).requires_grad_() for n, v in params.items()
        }
        h = F.conv2d(
            F.pad(torch.from_numpy(x).to(dtype), (1, 1, 1, 1), mode="reflect"),
            tensors["w"],
            tensors["b"],
        )
        h = F.elu(
            F.instance_norm(h, weight=tensors["s"], bias=tensors["beta"], eps=1e-5), alpha=0.5
        )
        h = (
            F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
            .amax(dim=3)
            .mean(dim=2)
            * 2.0
        )
        expected = F.mse_loss(h, torch.from_numpy(target).to(dtype))
        expected.backward()
        references.append(
            (expected.detach().numpy(), {n: t.grad.numpy() for n, t in tensors.items()})
        )
    (loss32, grads32), (loss64, grads64) = references
    assert_close(loss, loss32, loss64, rtol=1e-5, name="loss")
    for name, grad in grads32.items():
        assert_close(trainer.grad(name), grad, grads64[name], rtol=1e-4, name=name)
    trainer.module.lazy_reset_grad()
    losses = []
    for _ in range(5):
        losses.append(float(trainer.train_step(x, target)[0]))
        trainer.step()
    assert losses[-1] < losses[0]

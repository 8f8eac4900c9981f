"""Four model families, exported three ways, trained through ONNX Runtime's training API against torch.

For each (family, exporter): generate_artifacts, load them with the training API's
C bindings, and check that

* the loss and every parameter gradient equal torch.autograd's (rtol 1e-4, atol 1e-5);
* 20 AdamW steps track 20 ``torch.optim.AdamW`` steps within 1e-4 relative on the loss;
* the eval model equals the torch model in eval mode.

Every built-in loss is also checked on the MLP against its torch counterpart.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from support import models

from onnxblocks import optim
from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

CASES = models.FAMILY_CASES
LR = 1e-2


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """generate_artifacts once per case (cached for the module)."""
    cache = {}

    def get(name: str, exporter: str):
        key = (name, exporter)
        if key not in cache:
            case = models.case(name, exporter)
            directory = tmp_path_factory.mktemp(f"{name}-{exporter}")
            artifacts = generate_artifacts(
                case.onnx_model,
                requires_grad=case.params,
                loss=LossType[models.LOSS_TYPES[case.loss]],
                optimizer=OptimType.AdamW,
                artifact_directory=directory,
            )
            cache[key] = (case, artifacts)
        return cache[key]

    return get


def _torch_step(case: models.Case, model: torch.nn.Module) -> torch.Tensor:
    target = torch.from_numpy(case.target)
    return models.torch_loss(case.loss)(model(*case.torch_inputs()), target)


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_gradients_match_torch(built, name, exporter):
    case, artifacts = built(name, exporter)
    assert artifacts.requires_grad == tuple(case.params)
    trainer = models.OrtTrainer(artifacts)
    (loss,) = trainer.train_step(*case.inputs.values(), case.target)

    model = copy.deepcopy(case.torch_model).train()
    model.zero_grad()
    expected = _torch_step(case, model)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5, atol=1e-6)
    for pname, param in model.named_parameters():
        np.testing.assert_allclose(trainer.grad(pname), param.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=pname)


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_adamw_steps_track_torch(built, name, exporter):
    case, artifacts = built(name, exporter)
    trainer = models.OrtTrainer(artifacts)
    trainer.optimizer.set_learning_rate(LR)
    model = copy.deepcopy(case.torch_model).train()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=LR)  # onnxblocks' AdamW has torch's defaults
    ort_losses, torch_losses = [], []
    for _ in range(20):
        ort_losses.append(trainer.train_step(*case.inputs.values(), case.target)[0])
        trainer.step()
        torch_opt.zero_grad()
        loss = _torch_step(case, model)
        loss.backward()
        torch_opt.step()
        torch_losses.append(loss.item())
    np.testing.assert_allclose(ort_losses, torch_losses, rtol=1e-4)
    assert torch_losses[-1] < torch_losses[0]  # it trained
    for pname, param in model.named_parameters():
        # Elements whose gradient is zero in exact arithmetic (a conv bias before BatchNorm, the key bias of
        # attention) get rounding noise that Adam normalises to full-size steps: compare the others only.
        live = param.grad.abs().numpy() > 1e-6
        np.testing.assert_allclose(
            trainer.param(pname)[live], param.detach().numpy()[live], rtol=1e-3, atol=1e-5, err_msg=pname
        )


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_eval_model_matches_torch_eval(built, name, exporter):
    case, artifacts = built(name, exporter)
    trainer = models.OrtTrainer(artifacts, optimizer=False)
    (loss,) = trainer.eval_step(*case.inputs.values(), case.target)
    model = copy.deepcopy(case.torch_model).eval()
    with torch.no_grad():
        expected = _torch_step(case, model)
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5, atol=1e-6)


def _loss_case(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Input batch and target for the MLP (3 outputs) that fit loss ``kind``."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    if kind in ("cross_entropy", "nll"):
        return x, rng.integers(0, 3, 6).astype(np.int64)
    if kind == "bce":
        return x, rng.uniform(0, 1, (6, 3)).astype(np.float32)
    if kind == "kl_div":
        p = rng.uniform(0.1, 1, (6, 3)).astype(np.float32)
        return x, p / p.sum(axis=1, keepdims=True)
    return x, (3 * rng.standard_normal((6, 3))).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(models.LOSS_TYPES))
def test_every_builtin_loss_matches_torch(tmp_path, kind):
    case = models.case("mlp", "torchscript")
    artifacts = generate_artifacts(
        case.onnx_model,
        requires_grad=case.params,
        loss=LossType[models.LOSS_TYPES[kind]],
        optimizer=optim.SGD(),
        artifact_directory=tmp_path,
    )
    x, target = _loss_case(kind)
    trainer = models.OrtTrainer(artifacts)
    (loss,) = trainer.train_step(x, target)
    model = copy.deepcopy(case.torch_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KLDivLoss(reduction="mean") warns about its definition
        expected = models.torch_loss(kind)(model(torch.from_numpy(x)), torch.from_numpy(target))
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5, atol=1e-6)
    for pname, param in model.named_parameters():
        np.testing.assert_allclose(trainer.grad(pname), param.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=pname)

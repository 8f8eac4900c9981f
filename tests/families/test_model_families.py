"""Four model families, exported three ways, trained through ONNX Runtime's training API against torch.

For each (family, exporter): generate_artifacts, load them with the training API's
C bindings, and check that

* the loss and every parameter gradient equal torch.autograd's (rtol 1e-5 and 1e-4);
* 20 AdamW steps track 20 ``torch.optim.AdamW`` steps within 1e-4 relative on the loss;
* the eval model equals the torch model in eval mode.

torch runs in float32 and in float64: ``support.numerics`` passes a value within the relative bound of the
float32 result or within torch's own float32-vs-float64 distance, above a floor from the operands (for a
gradient, the sum of |terms| it adds up, ``support.reference64``).

Every built-in loss is also checked on the MLP against its torch counterpart.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from support import models
from support.numerics import assert_close
from support.reference64 import gradient_magnitudes, to64

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


def _tensors(values, dtype) -> list[torch.Tensor]:
    """NumPy arrays as tensors, the floating ones in ``dtype``."""
    return [
        torch.from_numpy(v).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v)
        for v in values
    ]


def _torch_step(case: models.Case, model: torch.nn.Module, dtype=torch.float32) -> torch.Tensor:
    (target,) = _tensors([case.target], dtype)
    return models.torch_loss(case.loss)(model(*_tensors(case.inputs.values(), dtype)), target)


def _assert_gradients_match_torch(trainer, loss, model, inputs, target, criterion) -> None:
    """The loss (rtol 1e-5) and each parameter gradient (rtol 1e-4) against torch's float32 and float64."""
    references = []
    for dtype in (torch.float32, torch.float64):
        copied = copy.deepcopy(model) if dtype == torch.float32 else to64(model)
        copied.zero_grad()
        (target_t,) = _tensors([target], dtype)
        value = criterion(copied(*_tensors(inputs, dtype)), target_t)
        value.backward()
        references.append(
            (value.detach().numpy(), {n: p.grad.numpy() for n, p in copied.named_parameters()})
        )
    (loss32, grads32), (loss64, grads64) = references
    terms = gradient_magnitudes(model, inputs, target, criterion)
    assert_close(loss, loss32, loss64, rtol=1e-5, name="loss")
    for name, grad in grads32.items():
        assert_close(
            trainer.grad(name), grad, grads64[name], rtol=1e-4, scale=terms.get(name), name=name
        )


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_gradients_match_torch(built, name, exporter):
    case, artifacts = built(name, exporter)
    assert artifacts.requires_grad == tuple(case.params)
    trainer = models.OrtTrainer(artifacts)
    (loss,) = trainer.train_step(*case.inputs.values(), case.target)
    model = copy.deepcopy(case.torch_model).train()
    criterion = models.torch_loss(case.loss)
    _assert_gradients_match_torch(
        trainer, loss, model, list(case.inputs.values()), case.target, criterion
    )


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_adamw_steps_track_torch(built, name, exporter):
    case, artifacts = built(name, exporter)
    trainer = models.OrtTrainer(artifacts)
    trainer.optimizer.set_learning_rate(LR)
    model, model64 = copy.deepcopy(case.torch_model).train(), to64(case.torch_model).train()
    runs = {
        dtype: (m, torch.optim.AdamW(m.parameters(), lr=LR))
        for dtype, m in ((torch.float32, model), (torch.float64, model64))
    }
    ort_losses, torch_losses = (
        [],
        {torch.float32: [], torch.float64: []},
    )  # onnxblocks' AdamW has torch's defaults
    for _ in range(20):
        ort_losses.append(trainer.train_step(*case.inputs.values(), case.target)[0])
        trainer.step()
        for dtype, (m, torch_opt) in runs.items():
            torch_opt.zero_grad()
            loss = _torch_step(case, m, dtype)
            loss.backward()
            torch_opt.step()
            torch_losses[dtype].append(loss.item())
    losses32 = np.float32(torch_losses[torch.float32])
    assert_close(
        np.float32(ort_losses), losses32, torch_losses[torch.float64], rtol=1e-4, name="losses"
    )
    assert losses32[-1] < losses32[0]  # it trained
    terms = gradient_magnitudes(
        model, list(case.inputs.values()), case.target, models.torch_loss(case.loss)
    )
    params64 = dict(model64.named_parameters())
    for pname, param in model.named_parameters():
        # Elements whose gradient is zero in exact arithmetic (a conv bias before BatchNorm, the key bias of
        # attention: in float64, within rounding of the |terms| it sums) get rounding noise that Adam
        # normalises to full-size steps: compare the others only.
        grad64 = params64[pname].grad.numpy()
        scale = terms.get(pname, np.abs(grad64).max())
        live = np.abs(grad64) > 1e3 * np.finfo(np.float64).eps * scale
        expected, expected64 = param.detach().numpy()[live], params64[pname].detach().numpy()[live]
        assert_close(trainer.param(pname)[live], expected, expected64, rtol=1e-3, name=pname)


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_eval_model_matches_torch_eval(built, name, exporter):
    case, artifacts = built(name, exporter)
    trainer = models.OrtTrainer(artifacts, optimizer=False)
    (loss,) = trainer.eval_step(*case.inputs.values(), case.target)
    with torch.no_grad():
        expected = _torch_step(case, copy.deepcopy(case.torch_model).eval()).numpy()
        expected64 = _torch_step(case, to64(case.torch_model).eval(), torch.float64).numpy()
    assert_close(loss, expected, expected64, rtol=1e-5, name="eval loss")


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KLDivLoss(reduction="mean") warns about its definition
        _assert_gradients_match_torch(
            trainer, loss, case.torch_model, [x], target, models.torch_loss(kind)
        )

"""onnxblocks.torch.OrtModule: torch modules trained through ONNX Runtime, against torch eager.

* gradients of the weights and the inputs equal torch autograd's (``support.numerics``: rtol
  ``RTOL`` of torch in float32, or torch float32's own rounding against torch float64) for an MLP, a CNN with BatchNorm and Dropout (eval), a GPT-style transformer, an LSTM
  and a two-output model whose loss reads one output, with both exporters;
* 20 AdamW steps track torch eager within 1e-5 relative on the loss (or the float32 run's own
  rounding against the same run in float64), and the BatchNorm running statistics (and
  ``num_batches_tracked``, exactly) match;
* the module keeps its parameters and buffers; modes, signatures, keywords, nested
  outputs, failures and the eager fallback behave as documented.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from support import models
from support.numerics import assert_close, assert_equal

from onnxblocks.errors import GradientError
from onnxblocks.torch import ExportError, OrtModule

RTOL = 1e-5
EXPORTERS = ("torchscript", "dynamo")


def _family(name: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    if name == "two_heads":
        torch.manual_seed(0)
        return models.TwoHeads(), [torch.randn(5, 4)]
    model, inputs, _, _ = models.family(name)
    if name == "cnn":
        model.drop.p = 0.5
    return model, [torch.from_numpy(v) for v in inputs.values()]


def _close(actual, expected, expected64, what):
    """``support.numerics.assert_close``; a gradient one side leaves None is zeros."""
    if actual is None and expected is None:
        return
    actual = torch.zeros_like(expected) if actual is None else actual
    expected = torch.zeros_like(actual) if expected is None else expected
    expected64 = (
        torch.zeros_like(expected, dtype=torch.float64) if expected64 is None else expected64
    )
    assert_close(actual, expected, expected64, rtol=RTOL, name=what)


def _run(model, inputs, grads, dtype=torch.float32):
    """Outputs, input gradients and output gradients of ``model``, fed its inputs in ``dtype``."""
    xs = [
        x.to(dtype, copy=True).requires_grad_() if x.is_floating_point() else x.clone()
        for x in inputs
    ]
    outs = model(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if grads is None:
        grads = [torch.randn_like(outs[0])]
    (outs[0] * grads[0].to(dtype)).sum().backward()  # a second output gets no gradient
    return outs, [x.grad for x in xs], grads


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "lstm", "two_heads"])
def test_gradients_match_torch(name, exporter):
    model, inputs = _family(name)
    reference = copy.deepcopy(model).eval()
    reference64 = copy.deepcopy(model).eval().double()
    wrapped = OrtModule(model.eval(), exporter=exporter)
    torch.manual_seed(1)
    outs, input_grads, grads = _run(wrapped, inputs, None)
    expected, expected_input_grads, _ = _run(reference, inputs, grads)
    expected64, expected_input_grads64, _ = _run(reference64, inputs, grads, torch.float64)
    for i, (a, b, b64) in enumerate(zip(outs, expected, expected64, strict=True)):
        _close(a, b, b64, f"output {i}")
    params = zip(
        model.named_parameters(), reference.parameters(), reference64.parameters(), strict=True
    )
    for (n, p), q, q64 in params:
        _close(p.grad, q.grad, q64.grad, n)
    for a, b, b64 in zip(input_grads, expected_input_grads, expected_input_grads64, strict=True):
        _close(a, b, b64, "input gradient")


@pytest.mark.parametrize(
    ("name", "exporter"),
    [("cnn", "torchscript"), ("cnn", "dynamo"), ("gpt", "dynamo"), ("lstm", "torchscript")],
)
def test_adamw_steps_track_torch_and_batch_norm_statistics_match(name, exporter):
    model, inputs, target, loss_kind = models.family(name)
    if name == "cnn":
        # The conv bias before BatchNorm has a zero gradient in exact arithmetic: Adam turns its rounding
        # noise into full-size steps (different in each engine) that move the running mean. Freeze it.
        model.conv.bias.requires_grad_(False)
    reference = copy.deepcopy(model).train()
    reference64 = copy.deepcopy(model).train().double()
    wrapped = OrtModule(model.train(), exporter=exporter)
    loss_fn = models.torch_loss(loss_kind)
    xs, y = [torch.from_numpy(v) for v in inputs.values()], torch.from_numpy(target)

    def as64(t: torch.Tensor) -> torch.Tensor:
        return t.double() if t.is_floating_point() else t

    runs: list[tuple[torch.nn.Module, torch.optim.Optimizer, list[float], list, torch.Tensor]] = [
        (wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-2), [], xs, y),
        (reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), [], xs, y),
        (
            reference64,
            torch.optim.AdamW(reference64.parameters(), lr=1e-2),
            [],
            [as64(x) for x in xs],
            as64(y),
        ),
    ]
    for _ in range(20):
        for module, optimizer, losses, inputs_, target_ in runs:
            optimizer.zero_grad()
            loss = loss_fn(module(*inputs_), target_)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    ours, theirs, theirs64 = runs[0][2], runs[1][2], runs[2][2]
    assert_close(np.float32(ours), np.float32(theirs), theirs64, rtol=1e-5, name="losses")
    assert theirs[-1] < theirs[0]
    buffers = zip(model.named_buffers(), reference.buffers(), reference64.buffers(), strict=True)
    for (n, b), c, c64 in buffers:
        assert_close(b, c, c64, rtol=1e-5, name=n)
    assert wrapped.exports == 1


def test_the_module_keeps_its_parameters_buffers_and_modes():
    model, inputs = _family("cnn")
    wrapped = OrtModule(model)
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in wrapped.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert wrapped.conv is model.conv  # attributes of the module
    x = inputs[0]
    wrapped.eval()
    assert not model.training and not model.drop.training
    with torch.no_grad():
        _close(
            wrapped(x),
            copy.deepcopy(model)(x),
            copy.deepcopy(model).double()(x.double()),
            "eval output",
        )
    wrapped.train()
    # Dropout(0.5) is on: calls draw different masks. (Not always the first two: once onnxruntime.training is
    # imported, torch.manual_seed(0) seeds ONNX Runtime with 0, and its next two Dropout seeds, 0 and 1, give
    # libstdc++'s minstd engine the same state.)
    outs = {tuple(wrapped(x).flatten().tolist()) for _ in range(3)}
    assert len(outs) > 1
    assert wrapped.exports == 2  # one export per mode
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.fc.weight.zero_()
    wrapped.load_state_dict(state)
    assert torch.equal(model.fc.weight, state["fc.weight"])


def test_new_signatures_export_again_and_are_cached():
    model, _ = _family("mlp")
    dynamo, traced = OrtModule(model), OrtModule(copy.deepcopy(model), exporter="torchscript")
    for batch in (6, 3, 6):
        dynamo(torch.randn(batch, 4))
        traced(torch.randn(batch, 4))
    assert dynamo.exports == 1  # the batch dimension is dynamic
    assert traced.exports == 2  # TorchScript exports static shapes, each once
    dynamo(torch.randn(2, 5, 4))
    assert dynamo.exports == 2  # a new rank
    model.double()
    with (
        torch.no_grad()
    ):  # ONNX Runtime's CPU gradient kernels are float32: float64 runs forward only
        out = dynamo(torch.randn(3, 4, dtype=torch.float64))
    assert out.dtype == torch.float64 and dynamo.exports == 3


class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x, scale=1.0, *, mask=None):
        h = self.a(x) * scale
        if mask is not None:
            h = h * mask
        return {"h": h, "pair": (self.b(x), x.shape[0])}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_keyword_inputs_and_nested_outputs(exporter):
    torch.manual_seed(0)
    model = Nested()
    reference = copy.deepcopy(model)
    reference64 = copy.deepcopy(model).double()
    wrapped = OrtModule(model, exporter=exporter)
    x, mask = torch.randn(5, 4), (torch.rand(5, 3) > 0.3).float()
    theirs64 = reference64(x.double(), 2.0, mask=mask.double())
    (theirs64["h"].sum() + theirs64["pair"][0].square().sum()).backward()
    ours = wrapped(x, 2.0, mask=mask)
    theirs = reference(x, 2.0, mask=mask)
    assert ours["pair"][1] == 5
    (ours["h"].sum() + ours["pair"][0].square().sum()).backward()
    (theirs["h"].sum() + theirs["pair"][0].square().sum()).backward()
    _close(ours["h"], theirs["h"], theirs64["h"], "h")
    params = zip(
        model.named_parameters(), reference.parameters(), reference64.parameters(), strict=True
    )
    for (n, p), q, q64 in params:
        _close(p.grad, q.grad, q64.grad, n)
    wrapped(x, 3.0, mask=mask)
    assert wrapped.exports == 2  # a non-tensor argument is part of the signature
    assert wrapped(x[:3], 3.0, mask=mask[:3])["pair"][1] == 3  # a non-tensor output pins the shapes


class DataDependent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


class Tangent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.tan(self.fc(x))


def test_failures_name_the_module_and_the_fallback_says_so():
    x = torch.ones(2, 3)
    with pytest.raises(ExportError, match="could not export DataDependent.*data-dependent"):
        OrtModule(DataDependent())(x)
    with pytest.raises(
        GradientError, match="Training Tangent through ONNX Runtime.*op Tan .*no gradient builder"
    ):
        OrtModule(Tangent())(x)
    model = DataDependent()
    wrapped = OrtModule(model, fallback=True)
    with pytest.warns(
        RuntimeWarning, match=r"OrtModule\(DataDependent\): running .* eagerly in torch"
    ):
        out = wrapped(x)
    assert_equal(
        out.detach(), model(x).detach(), name="fallback output"
    )  # both run eagerly in torch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per signature
        wrapped(x)

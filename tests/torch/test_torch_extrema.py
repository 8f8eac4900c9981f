"""torch's min and max trained through OrtModule, exported by dynamo and by torchscript, on tied inputs.

The family of ``tests/gradient/test_extrema_ties.py`` (ONNX graphs, both backends) from the other end: real
exports of ``torch.max(x)``, ``amax``, ``max(x, dim)`` (values and indices), ``torch.maximum`` in float16,
bfloat16, float32 and float64. The inputs are multiples of 1/4 in a small range, so every reduction ties. The
reference is torch in the tested dtype and in float64.

One deviation is by design and tested as such: the torchscript exporter writes ``amax(x, dim)`` as the same
one-axis ``ReduceMax`` as ``max(x, dim).values`` and records no aten op, so it gets ``max(x, dim)``'s rule
(``onnxblocks.gradient.extrema``).
"""

from __future__ import annotations

import pytest
import torch
from support.numerics import assert_close, assert_equal, eps

from onnxblocks.torch import OrtModule

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


class Extremum(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x, y):
        if self.kind == "max()":
            return torch.max(x)
        if self.kind == "min()":
            return torch.min(x)
        if self.kind == "amax(0, 1)":
            return x.amax(dim=(0, 1))
        if self.kind == "amin(-1)":
            return x.amin(dim=-1, keepdim=True)
        if self.kind == "max(x, 1)":
            return torch.max(x, 1)  # values and indices
        if self.kind == "min(x, -1).values":
            return torch.min(x, -1).values
        return torch.maximum(x, y)


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    x = torch.randint(0, 3, (4, 3, 5), generator=generator) / 4
    y = torch.randint(0, 3, (3, 5), generator=generator) / 4
    return x.to(dtype), y.to(dtype)


def _step(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    xs = [t.detach().to(dtype).clone().requires_grad_() for t in (x, y)]
    out = module(*xs)
    values = out[0] if isinstance(out, tuple) else out
    weights = torch.arange(1, values.numel() + 1).reshape(values.shape) % 7 + 1
    (values * weights.to(dtype)).sum().backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in xs]
    return out, grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize(
    "kind",
    ["max()", "min()", "amax(0, 1)", "amin(-1)", "max(x, 1)", "min(x, -1).values", "maximum"],
)
def test_ortmodule_gives_torch_gradients_on_ties(kind, exporter, dtype):
    x, y = _inputs(dtype)
    expected, grads = _step(Extremum(kind), x, y, dtype)
    expected64, grads64 = _step(Extremum(kind), x, y, torch.float64)
    if (
        kind == "amin(-1)" and exporter == "torchscript"
    ):  # read as min(x, -1): the gradient goes to the index
        _, grads = _step(lambda x, y: torch.min(x, -1, keepdim=True).values, x, y, dtype)
        _, grads64 = _step(lambda x, y: torch.min(x, -1, keepdim=True).values, x, y, torch.float64)
    got, got_grads = _step(OrtModule(Extremum(kind), exporter=exporter), x, y, dtype)
    if isinstance(expected, tuple):
        assert_equal(got[1], expected[1], name="indices")
        got, expected, expected64 = got[0], expected[0], expected64[0]
    # the dynamo exporter computes amax/amin of float16 and bfloat16 in float32 and returns float32
    assert_close(
        got.detach().to(dtype),
        expected.detach(),
        expected64.detach(),
        rtol=eps(dtype),
        name="value",
    )
    for name, g, e, e64 in zip("xy", got_grads, grads, grads64, strict=True):
        assert_close(g, e, e64, rtol=eps(dtype), name=f"gradient of {name}")

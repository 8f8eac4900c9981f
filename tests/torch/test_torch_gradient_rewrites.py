"""Gradients ONNX Runtime's builder lacks or gets wrong, against torch: Einsum, upsample, bfloat16 min/max, uint8
comparisons, a Split with unused outputs.

Each module is exported with torch's dynamo exporter and differentiated two ways:

* the training build: ``OrtModule`` (the normalisation passes rewrite the graph before ONNX
  Runtime's gradient builder; ONNX Runtime's gradient kernels run it);
* the portable path: the same VJP graph lowered to standard ops (``lower_training_ops``) and run
  by a plain ``InferenceSession``.

Both must give torch eager's outputs and gradients (the weights' and the input's) by
``support.numerics``: within rtol ``RTOL`` of eager float32, or within eager float32's own
rounding against the same module run in float64, plus the floor.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from support.numerics import assert_close

from onnxblocks._core.ort import onnxruntime
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.gradient.einsum import parse_equation
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops
from onnxblocks.torch import OrtModule
from onnxblocks.torch.export import export_module

RTOL = 1e-5


class Einsum(torch.nn.Module):
    def __init__(self, equation: str, x_shape, w_shapes) -> None:
        super().__init__()
        self.equation = equation
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(*s)) for s in w_shapes)

    def forward(self, x):
        return torch.einsum(self.equation, x, *self.ws)


class Upsample(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.mode = mode

    def forward(self, x):
        kwargs = {} if self.mode == "nearest" else {"align_corners": False}
        return torch.nn.functional.interpolate(
            self.conv(x), scale_factor=2, mode=self.mode, **kwargs
        )


class BFloat16Extrema(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)

    def forward(self, x):
        h = self.fc(x).to(torch.bfloat16)
        return h.amax(dim=1).float() * 2 + h.amin(dim=-1).float()


class ByteMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x, t):
        return self.fc(x) * (t == 3).float().unsqueeze(1) + self.fc(x) * (t < 2).float().unsqueeze(
            1
        )


class PartlyUsedChunk(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = torch.sin(self.fc(x))
        h = h.clone()
        h.mul_(2)  # functionalised: each piece read comes from a Split whose other output is unused
        return h.chunk(2, dim=1)[1] * 3


EINSUMS = {
    "matmul": ("bi,ij->bj", (3, 4), [(4, 5)]),
    "attention": ("bhqd,bhkd->bhqk", (2, 2, 3, 4), [(2, 2, 5, 4)]),
    "implicit": ("ij,jk", (3, 4), [(4, 2)]),
    "outer": ("bi,j->bij", (3, 4), [(5,)]),
    "transposed_out": ("bij,jk->kib", (2, 3, 4), [(4, 5)]),
    "sum_only": ("bij,k->bk", (2, 3, 4), [(5,)]),
    "several_contracted": ("bijk,jkl->bil", (2, 3, 4, 5), [(4, 5, 6)]),
    "three_operands": ("bi,ij,jk->bk", (3, 4), [(4, 5), (5, 2)]),
    "ellipsis": ("...i,ij->...j", (2, 3, 4), [(4, 5)]),
    "bilinear": ("bi,oij,bj->bo", (3, 4), [(2, 4, 5), (3, 5)]),
}


def _cases():
    for name, (equation, x_shape, w_shapes) in EINSUMS.items():
        yield pytest.param(
            lambda e=equation, w=w_shapes: Einsum(e, None, w),
            [torch.randn(*x_shape)],
            id=f"einsum-{name}",
        )
    for mode in ("nearest", "bilinear", "bicubic"):
        yield pytest.param(
            lambda m=mode: Upsample(m), [torch.randn(2, 2, 4, 5)], id=f"upsample-{mode}"
        )
    yield pytest.param(BFloat16Extrema, [torch.randn(3, 6)], id="bfloat16-min-max")
    yield pytest.param(PartlyUsedChunk, [torch.randn(2, 4, 6)], id="partly-used-split")
    yield pytest.param(
        ByteMask,
        [torch.randn(5, 6), torch.tensor([3, 1, 3, 0, 7], dtype=torch.uint8)],
        id="uint8-comparisons",
    )


def _eager(model, inputs, grad_out, dtype=None):
    """The output and the gradients (parameters, then the first input) of eager torch; ``dtype`` runs a float64
    copy of the module on float64 inputs (the float64 reference)."""
    if dtype is not None:
        model = copy.deepcopy(model).to(dtype)
        inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
        grad_out = grad_out.to(dtype)
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = model(*xs)
    (out * grad_out).sum().backward()
    grads = [p.grad for p in model.parameters()] + [xs[0].grad]
    return out.detach(), grads


def _close(actual, expected, expected64, what):
    assert_close(np.asarray(actual), expected, expected64, rtol=RTOL, name=what)


@pytest.mark.parametrize(("make", "inputs"), list(_cases()))
def test_training_build_matches_torch(make, inputs):
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():
        grad_out = torch.randn_like(model(*inputs))
    expected, expected_grads = _eager(copy.deepcopy(model), inputs, grad_out)
    expected64, expected_grads64 = _eager(model, inputs, grad_out, torch.float64)
    wrapped = OrtModule(copy.deepcopy(model))
    out, grads = _eager(wrapped, inputs, grad_out)
    _close(out, expected, expected64, "output")
    for i, (g, e, e64) in enumerate(zip(grads, expected_grads, expected_grads64, strict=True)):
        _close(g, e, e64, f"gradient {i}")


@pytest.mark.parametrize(("make", "inputs"), list(_cases()))
def test_portable_lowering_matches_torch(make, inputs):
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():
        grad_out = torch.randn_like(model(*inputs))
    expected, expected_grads = _eager(copy.deepcopy(model), inputs, grad_out)
    expected64, expected_grads64 = _eager(model, inputs, grad_out, torch.float64)
    exported = export_module(model, tuple(inputs), {}, "dynamo", dynamic="none")
    first = exported.inputs[0]
    vjp = build_vjp_graph(
        exported.model, requires_grad=[*exported.weights, first], outputs=exported.outputs
    )
    assert sum(vjp.rewrites.values()) > 0, vjp.rewrites  # a normalisation pass did the work
    lowered = vjp.model
    lower_training_ops(lowered)
    assert not non_portable_ops(lowered), [op for _, op, _ in non_portable_ops(lowered)]
    session = onnxruntime().InferenceSession(
        lowered.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    params = dict(model.named_parameters())
    feeds = {
        name: inputs[i].numpy()
        for name, i in zip(exported.inputs, exported.input_leaves, strict=True)
    }
    feeds |= {name: params[name].detach().numpy() for name in exported.weights}
    feeds[vjp.output_grads[0]] = grad_out.numpy()
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(None, feeds), strict=True))
    _close(got[exported.outputs[0]], expected, expected64, "output")
    order = [n for n, _ in model.named_parameters()] + [first]
    for name, e, e64 in zip(order, expected_grads, expected_grads64, strict=True):
        _close(got[f"{name}_grad"], e, e64, f"gradient of {name}")


@pytest.mark.parametrize(
    ("equation", "ranks", "expected"),
    [
        ("ij,jk", [2, 2], (["ij", "jk"], "ik")),
        ("...i,ij->...j", [3, 2], (["ABi", "ij"], "ABj")),
        ("b...,b->b", [1, 1], (["b", "b"], "b")),
        ("ii->i", [2], (["ii"], "i")),  # a diagonal
        ("ij->k", [2], None),  # an output letter no operand has
        ("...i", [None], None),  # an ellipsis of unknown rank
    ],
)
def test_parse_equation(equation, ranks, expected):
    assert parse_equation(equation, ranks) == expected

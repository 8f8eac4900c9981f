"""A randomized differential test of OrtModule: every gradient equals torch eager's (hypothesis, derandomized).

Each example draws a module composed of two stages and an output structure, and a calling
pattern, then compares the outputs and every gradient (parameters and inputs) with eager
torch by ``support.numerics`` (rtol ``RTOL`` of eager float32, or eager float32's own rounding
against eager float64, plus the floor); a gradient torch leaves None must be None.

* stages: ``split`` and ``chunk`` along each dim, views (``reshape`` / ``view``), a transpose,
  in-place ops on an intermediate, a Linear applied twice (shared parameters);
* output structures: tuples, the pieces of ``chunk`` along each dim, the same tensor twice, an
  input returned unchanged with a ``None``, nested dicts with ``None``, a dataclass, a ``ModelOutput``
  (transformers' when installed, else a dataclass like it);
* calling patterns: the batch size (one export serves them all), whether the inputs require a
  gradient, ``None`` or a tensor for an optional argument, which outputs the loss uses (the others get
  no gradient), and two forwards before their backwards.

The modules are drawn from a fixed pool (every stage and every structure appears), so the exports are
cached across examples: 200 examples build 48 graphs at most.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.numerics import assert_close
from torch.utils import _pytree as pytree

from onnxblocks.torch import OrtModule

RTOL = 1e-5
DIMS = (0, 1, 2)


@dataclass
class Out:
    logits: torch.Tensor
    extra: torch.Tensor | None = None


try:
    from transformers.utils import ModelOutput as _ModelOutput

    @dataclass
    class LikeModelOutput(_ModelOutput):
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None

except ImportError:  # transformers is optional: a dataclass of the same shape

    @dataclass
    class LikeModelOutput:  # type: ignore[no-redef]
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None


class Composed(torch.nn.Module):
    """``x [B, 4, 6]`` (and an optional ``y``) through two stages, returned in one of the output structures."""

    def __init__(self, stages: tuple[str, str], output: str) -> None:
        super().__init__()
        self.stages, self.output = stages, output
        self.fc = torch.nn.Linear(6, 6)
        self.shared = torch.nn.Linear(6, 6)
        self.scale = torch.nn.Parameter(torch.randn(6))
        self.bias = torch.nn.Parameter(torch.randn(4, 6))

    def stage(self, name: str, h: torch.Tensor) -> torch.Tensor:
        kind, _, dim_text = name.partition("_")
        dim = int(dim_text) if dim_text else 0
        if kind == "split":
            first, rest = h.split([1, h.shape[dim] - 1], dim=dim)
            return torch.cat([rest, torch.tanh(first)], dim=dim)
        if kind == "chunk":
            parts = h.chunk(2, dim=dim)
            return (
                torch.cat([parts[-1] * 2, *parts[:-1]], dim=dim) if len(parts) > 1 else parts[0] * 2
            )
        if kind == "view":
            return torch.sin(h.reshape(h.shape[0], -1)).view(h.shape[0], 4, 6)
        if kind == "transpose":
            return (h.transpose(1, 2) * self.scale[:, None]).transpose(1, 2)
        if kind == "inplace":
            h = h.clone()
            h.mul_(2)
            h.add_(self.bias)
            return torch.relu_(h)
        assert kind == "shared"
        return self.shared(torch.tanh(self.shared(h)))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        h = self.fc(x)
        if y is not None:
            h = h + y
        for name in self.stages:
            h = self.stage(name, h)
        kind, _, dim_text = self.output.partition("_")
        if kind == "tuple":
            return h, h.sum(-1)
        if kind == "chunks":
            return h.chunk(2, dim=int(dim_text))
        if kind == "repeated":
            return h, h
        if kind == "passthrough":
            return h, x, None
        if kind == "dict":
            return {"a": h, "nested": {"mean": h.mean(1), "none": None}}
        if kind == "dataclass":
            return Out(logits=h, extra=h * 3)
        assert kind == "modeloutput"
        return LikeModelOutput(loss=h.pow(2).mean(), logits=h)


STAGES = [f"{k}_{d}" for k in ("split", "chunk") for d in DIMS] + [
    "view",
    "transpose",
    "inplace",
    "shared",
]
OUTPUTS = [
    "tuple",
    *(f"chunks_{d}" for d in DIMS),
    "repeated",
    "passthrough",
    "dict",
    "dataclass",
    "modeloutput",
]


def _pool() -> list[tuple[tuple[str, str], str]]:
    """Module configurations: every stage first and second, every output structure, in 12 modules."""
    rng = np.random.default_rng(21)
    firsts = [*STAGES, "chunk_0", "split_0"]
    seconds = [*rng.permutation(STAGES), "shared", "inplace"]
    outputs = (OUTPUTS * 2)[: len(firsts)]
    return [((str(a), str(b)), o) for a, b, o in zip(firsts, seconds, outputs, strict=True)]


POOL = _pool()
_CACHE: dict[int, tuple[OrtModule, torch.nn.Module, torch.nn.Module]] = {}


def _models(index: int) -> tuple[OrtModule, torch.nn.Module, torch.nn.Module]:
    """The wrapped module, the eager one and the eager one in float64 (the float64 reference)."""
    if index not in _CACHE:
        torch.manual_seed(index)
        eager = Composed(*POOL[index])
        _CACHE[index] = (OrtModule(copy.deepcopy(eager)), eager, copy.deepcopy(eager).double())
    return _CACHE[index]


def _loss(out, weights: list[float], grads: list[torch.Tensor]) -> torch.Tensor | None:
    leaves = [leaf for leaf in pytree.tree_leaves(out) if isinstance(leaf, torch.Tensor)]
    terms = [
        w * (leaf * g).sum()
        for leaf, w, g in zip(leaves, weights, grads, strict=False)
        if w and leaf.requires_grad
    ]
    return sum(terms) if terms else None  # type: ignore[return-value]


def _close(actual, expected, expected64, what: str) -> None:
    if actual is None or expected is None:
        assert actual is None and expected is None, (
            f"{what}: got {actual is not None}, torch {expected is not None}"
        )
        return
    assert_close(actual, expected, expected64, rtol=RTOL, name=what)


@settings(
    max_examples=int(os.environ.get("ONNXBLOCKS_DIFFERENTIAL_EXAMPLES", "200")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    index=st.integers(0, len(POOL) - 1),
    batch=st.sampled_from([2, 3, 5]),
    x_grad=st.booleans(),
    y_kind=st.sampled_from(["none", "tensor_grad"]),
    weights=st.lists(st.sampled_from([0.0, 1.0, -0.5, 2.0]), min_size=4, max_size=4),
    twice=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_gradient_matches_eager(index, batch, x_grad, y_kind, weights, twice, seed):
    wrapped, eager, eager64 = _models(index)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, 6, generator=generator)
    y = None if y_kind == "none" else torch.randn(batch, 4, 6, generator=generator)
    runs = []
    for model, dtype in (
        (wrapped, torch.float32),
        (eager, torch.float32),
        (eager64, torch.float64),
    ):
        model.zero_grad(set_to_none=True)
        xi = x.to(dtype, copy=True).requires_grad_(x_grad)
        yi = None if y is None else y.to(dtype, copy=True).requires_grad_(y_kind == "tensor_grad")
        outs = [model(xi, yi) for _ in range(2 if twice else 1)]
        grads = [torch.randn(leaf.shape, generator=torch.Generator().manual_seed(seed + i)).to(dtype) for i, leaf in
                 enumerate(t for t in pytree.tree_leaves(outs[0]) if isinstance(t, torch.Tensor))]  # fmt: skip
        for out in reversed(outs):  # the second forward's backward first
            loss = _loss(out, weights, grads)
            if loss is not None:
                loss.backward()
        runs.append((outs[0], xi, yi, model))
    (out_o, x_o, y_o, _), (out_e, x_e, y_e, _), (out_64, x_64, y_64, _) = runs
    assert type(out_o) is type(out_e)
    leaves_o, spec_o = pytree.tree_flatten(out_o)
    leaves_e, spec_e = pytree.tree_flatten(out_e)
    leaves_64 = pytree.tree_leaves(out_64)
    assert spec_o == spec_e
    for i, (a, b, b64) in enumerate(zip(leaves_o, leaves_e, leaves_64, strict=True)):
        if isinstance(b, torch.Tensor):
            _close(a, b, b64, f"output {i}")
            assert a.requires_grad == b.requires_grad, (
                f"output {i}: requires_grad {a.requires_grad} vs torch"
            )
        else:
            assert a == b
    where = f"module {POOL[index]}, batch {batch}"
    _close(x_o.grad, x_e.grad, x_64.grad, f"x.grad ({where})")
    y_grads = [None if t is None else t.grad for t in (y_o, y_e, y_64)]
    _close(*y_grads, f"y.grad ({where})")
    ours, theirs64 = dict(wrapped.named_parameters()), dict(eager64.named_parameters())
    for name, p in eager.named_parameters():
        _close(ours[name].grad, p.grad, theirs64[name].grad, f"{name}.grad ({where})")


def test_the_pool_covers_every_stage_and_output():
    assert {s for (a, b), _ in POOL for s in (a, b)} == set(STAGES)
    assert {o for _, o in POOL} == set(OUTPUTS)

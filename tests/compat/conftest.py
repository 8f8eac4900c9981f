"""Fixtures of the reference-behaviour tests (``test_reference_*.py``): the models their programs run on."""

from __future__ import annotations

import types

import pytest
import torch
from support import models
from support.reference import BATCH, D_IN, D_OUT, HIDDEN, TwoOutputNet, export


@pytest.fixture(scope="module")
def net():
    """An MLP (fc1, ReLU, fc2), one batch, its ONNX export; tests copy the torch model before changing it."""
    torch.manual_seed(0)
    model = models.MLP(D_IN, HIDDEN, D_OUT)
    x = torch.randn(BATCH, D_IN)
    return types.SimpleNamespace(
        torch=model, x=x, onnx=export(model, (x,)), params=[n for n, _ in model.named_parameters()]
    )


@pytest.fixture(scope="module")
def two_outputs():
    torch.manual_seed(3)
    model = TwoOutputNet()
    x1, x2 = torch.randn(BATCH, D_IN), torch.randn(BATCH, D_IN)
    return types.SimpleNamespace(torch=model, x1=x1, x2=x2, onnx=export(model, (x1, x2)))

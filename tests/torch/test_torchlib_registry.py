"""``onnxblocks.torch.torchlib.shared_registry``: torchlib's table built once, each export its own copy,
the same graph."""

from __future__ import annotations

import numpy as np
import torch
from support.torch_export import export_onnx
from torch.onnx._internal.exporter import _registration

from onnxblocks.torch import torchlib


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)).softmax(-1)


def test_each_export_gets_its_own_copy_of_one_table_and_the_builder_is_restored():
    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    with torchlib.shared_registry():
        first = _registration.ONNXRegistry.from_torchlib(opset_version=18)
        second = _registration.ONNXRegistry.from_torchlib(opset_version=18)
        assert first is not second and first.functions is not second.functions
        assert first.functions == second.functions and first.opset_version == 18
        target = next(iter(first.functions))
        assert first.functions[target] is not second.functions[target]
        first.functions[target].append("a custom translation of this call")
        first.functions["custom::op"] = []
        third = _registration.ONNXRegistry.from_torchlib(opset_version=18)
        assert third.functions == second.functions  # one call's additions stay its own
        assert len([k for k in torchlib._TABLES if k == ((), (("opset_version", 18),))]) == 1
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is original


def test_the_export_is_the_same_graph_with_the_shared_table(monkeypatch):
    torch.manual_seed(0)
    model = Small()
    inputs = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    shared = [export_onnx(model, inputs, dynamo=True, opset=18) for _ in range(2)]
    monkeypatch.setattr("support.torch_export.shared_registry", torchlib.contextlib.nullcontext)
    alone = export_onnx(model, inputs, dynamo=True, opset=18)
    same = alone.SerializeToString(deterministic=True)
    assert all(m.SerializeToString(deterministic=True) == same for m in shared)

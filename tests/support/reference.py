"""The reference's test programs, shared by ``tests/compat/test_reference_*.py``: models, export, runners.

The reference (``onnxruntime.training.onnxblock`` / ``artifacts``) tests its loss
blocks, compositions, parameter partitions, checkpoints, optimizers and artifacts,
and its training-API tests (``Module``, ``Optimizer``, ``CheckpointState``) consume
the generated files. The tests in ``tests/compat/test_reference_*.py`` write the same
programs against ``from onnxblocks.compat import artifacts, onnxblock`` and check
every behaviour numerically: against torch, or against the optimizer formulas in
numpy, with the files loaded by ONNX Runtime's training API C bindings
(``C.load_checkpoint``, ``C.Module``, ``C.Optimizer``) through :class:`Session`.
The fixtures ``net`` and ``two_outputs`` are in ``tests/compat/conftest.py``.

Not covered, because it cannot apply here:

* CUDA devices (the reference's ``device="cuda"`` tests): this build of ONNX
  Runtime is CPU-only; every test runs on the CPU.
* Custom op libraries (the reference's ``test_ort_custom_ops``): it needs the
  compiled ``libcustom_op_library.so`` from ONNX Runtime's build tree, which no
  wheel ships.
* ``requires_grad`` on a graph input giving an accumulation *buffer*: onnxblocks
  gives the output ``<input>_grad`` instead (documented difference; the training
  API cannot feed such a buffer). The gradient's value is checked.
"""

from __future__ import annotations

import io
import os
import types

import numpy as np
import onnx
import torch
from onnxruntime.capi import _pybind_state as C

from onnxblocks.compat import onnxblock
from support import models

BATCH, D_IN, HIDDEN, D_OUT = 8, 6, 5, 4
RTOL, ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
CPU = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


# ------------------------------------------------------------------ torch models, export, runners
class TwoOutputNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = models.MLP(D_IN, HIDDEN, D_OUT)
        self.b = models.MLP(D_IN, HIDDEN, D_OUT)

    def forward(self, x1, x2):
        return self.a(x1), self.b(x2)


class NormDropNet(torch.nn.Module):
    """Linear, BatchNorm, Dropout(0.5), Linear: eval mode differs from training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(D_IN, HIDDEN)
        self.bn = torch.nn.BatchNorm1d(HIDDEN)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(HIDDEN, D_OUT)

    def forward(self, x):
        return self.fc2(self.drop(self.bn(self.fc1(x))))


def export(torch_model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> onnx.ModelProto:
    """Export as the reference's tests do: ``input-i`` / ``output-i``, every dim dynamic, training mode, opset 14."""
    outputs = torch_model(*inputs)
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
    names_in = [f"input-{i}" for i in range(len(inputs))]
    names_out = [f"output-{i}" for i in range(len(outputs))]
    axes = {
        n: {d: f"{n}_dim{d}" for d in range(t.dim())}
        for n, t in zip(names_in + names_out, (*inputs, *outputs), strict=True)
    }
    f = io.BytesIO()
    with models._quiet():
        torch.onnx.export(
            torch_model,
            inputs,
            f,
            input_names=names_in,
            output_names=names_out,
            opset_version=14,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            dynamic_axes=axes,
            dynamo=False,
        )
    torch_model.train()
    return onnx.load_from_string(f.getvalue())


def infer(model: onnx.ModelProto | str | os.PathLike, feeds: dict, outputs: list[str] | None = None) -> list:
    """Run a model (proto or file) in an InferenceSession."""
    import onnxruntime as ort

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(outputs, feeds)


class Session:
    """ONNX Runtime's training API on a set of files: checkpoint state, Module, Optimizer (C bindings)."""

    def __init__(self, training, eval_model, checkpoint, optimizer=None) -> None:
        self.state = C.load_checkpoint(os.fspath(checkpoint))
        self.module = C.Module(
            os.fspath(training), self.state, os.fspath(eval_model) if eval_model else None, CPU, C.SessionOptions()
        )
        self.optimizer = C.Optimizer(os.fspath(optimizer), self.state, CPU, C.SessionOptions()) if optimizer else None

    @classmethod
    def of(cls, art, ort: bool = False) -> Session:
        if ort:
            return cls(art.training_model_ort, art.eval_model_ort, art.checkpoint, art.optimizer_model_ort)
        return cls(art.training_model, art.eval_model, art.checkpoint, art.optimizer_model)

    def train(self, *inputs) -> list[np.ndarray]:
        fetches = C.OrtValueVector()
        self.module.train_step(list(inputs), fetches)
        return [f.numpy() for f in fetches]

    def eval(self, *inputs) -> list[np.ndarray]:
        fetches = C.OrtValueVector()
        self.module.eval_step(list(inputs), fetches)
        return [f.numpy() for f in fetches]

    def step(self) -> None:
        self.optimizer.optimizer_step()
        self.module.lazy_reset_grad()

    def param(self, name: str) -> np.ndarray:
        return self.state.get_parameter(name).data.numpy().copy()

    def grad(self, name: str) -> np.ndarray:
        return self.state.get_parameter(name).grad.numpy().copy()

    def flat(self, trainable_only: bool) -> C.OrtValue:
        size = self.module.get_parameters_size(trainable_only)
        buffer = C.OrtValue.ortvalue_from_shape_and_type([size], np.float32, CPU)
        self.module.copy_parameters_to_buffer(buffer, trainable_only)
        return buffer


def save_block_files(directory, block, optimizer_model: onnx.ModelProto | None = None):
    """Write a built TrainingBlock the reference's low-level way: to_model_proto, save_checkpoint, onnx.save."""
    training, evaluation = block.to_model_proto()
    files = types.SimpleNamespace(
        training_model=directory / "training_model.onnx",
        eval_model=directory / "eval_model.onnx",
        checkpoint=directory / "checkpoint",
        optimizer_model=None,
    )
    onnx.save(training, files.training_model)
    onnx.save(evaluation, files.eval_model)
    onnxblock.save_checkpoint(block.parameters(), files.checkpoint)
    if optimizer_model is not None:
        files.optimizer_model = directory / "optimizer_model.onnx"
        onnx.save(optimizer_model, files.optimizer_model)
    return files


def torch_grads(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads(session: Session, expected: dict[str, np.ndarray], names=None) -> None:
    for name in names or expected:
        np.testing.assert_allclose(session.grad(name), expected[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=name)


def make_labels(seed: int = 1, with_ignored: bool = False) -> torch.Tensor:
    labels = torch.randint(0, D_OUT, (BATCH,), generator=torch.Generator().manual_seed(seed))
    if with_ignored:
        labels[::3] = -100
    return labels


def regression_target(seed: int = 2) -> torch.Tensor:
    return torch.randn(BATCH, D_OUT, generator=torch.Generator().manual_seed(seed))


def probability_target(seed: int = 3) -> torch.Tensor:
    return torch.rand(BATCH, D_OUT, generator=torch.Generator().manual_seed(seed))


def loss_block(kind, loss_name: str, options: dict):
    """A block of ``kind`` whose build applies one reference loss to the model output (the reference's pattern)."""

    class SimpleLossBlock(kind):
        def __init__(self):
            super().__init__()
            self.loss = getattr(onnxblock.loss, loss_name)(**options)

        def build(self, output_name):
            return self.loss(output_name)

    return SimpleLossBlock()


def hf_adamw_step(w, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """Hugging Face AdamW (ONNX Runtime's adam_mode=1, the reference's optimizer), with bias correction."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    step_size = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t)
    w = w - step_size * m / (np.sqrt(v) + eps)
    return w - lr * weight_decay * w, m, v

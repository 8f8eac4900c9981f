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

import copy
import dataclasses
import io
import os
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from onnxruntime.capi import _pybind_state as C

from onnxblocks._core.ort import session_options
from onnxblocks.compat import onnxblock
from support import models
from support.numerics import assert_close
from support.reference64 import gradient_magnitudes
from support.torch_export import quiet

BATCH, D_IN, HIDDEN, D_OUT = 8, 6, 5, 4
#: relative bounds of a loss or an output, and of a gradient, against torch (``support.numerics.assert_close``)
RTOL = 1e-5
GRAD_RTOL = 1e-5
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
    with quiet():
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


def infer(
    model: onnx.ModelProto | str | os.PathLike, feeds: dict, outputs: list[str] | None = None
) -> list:
    """Run a model (proto or file) in an InferenceSession."""
    import onnxruntime as ort

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(outputs, feeds)


class Session:
    """ONNX Runtime's training API on a set of files: checkpoint state, Module, Optimizer (C bindings)."""

    def __init__(self, training, eval_model, checkpoint, optimizer=None) -> None:
        self.state = C.load_checkpoint(os.fspath(checkpoint))
        # the library's options: ONNXBLOCKS_ORT_THREADS sets their thread count (support/ort_threads.py)
        self.module = C.Module(
            os.fspath(training),
            self.state,
            os.fspath(eval_model) if eval_model else None,
            CPU,
            session_options(),
        )
        self.optimizer = (
            C.Optimizer(os.fspath(optimizer), self.state, CPU, session_options())
            if optimizer
            else None
        )

    @classmethod
    def of(cls, art, ort: bool = False) -> Session:
        if ort:
            return cls(
                art.training_model_ort, art.eval_model_ort, art.checkpoint, art.optimizer_model_ort
            )
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


# ------------------------------------------------------------------ references in float32 and float64
@dataclasses.dataclass(frozen=True)
class Twice:
    """A torch reference computed in float32 (the tested dtype) and again in float64 from the same operands.

    ``value`` and ``value64`` have the same structure (a tensor's NumPy value, or a tuple, list or dict of them);
    indexing gives the pair of one part. ``scales`` holds, where known, the floor's ``scale`` of each gradient
    (the sum of ``|terms|`` it adds up, ``support.reference64.gradient_magnitudes``).
    """

    value: Any
    value64: Any
    scales: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __getitem__(self, key: Any) -> Twice:
        return Twice(self.value[key], self.value64[key])

    def check(
        self, actual: Any, *, rtol: float = RTOL, scale: Any = None, name: str = "value"
    ) -> None:
        """``support.numerics.assert_close(actual, value, value64, ...)``; a ``[1]`` loss compares as a scalar."""
        actual = np.asarray(actual)
        if actual.shape != np.shape(self.value) and actual.size == np.size(self.value) == 1:
            actual = actual.reshape(np.shape(self.value))
        assert_close(actual, self.value, self.value64, rtol=rtol, scale=scale, name=name)


def _numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_numpy(v) for v in value)
    return np.asarray(value)


def _operand(value: Any, dtype: torch.dtype | None) -> Any:
    """A private copy of an operand, floats in ``dtype`` (``None``: as they are); leaves stay leaves."""
    if isinstance(value, torch.nn.Module):
        module = copy.deepcopy(value)
        return module if dtype is None else module.to(dtype)
    if isinstance(value, torch.Tensor):
        copied = value.detach().clone()
        if dtype is not None and copied.is_floating_point():
            copied = copied.to(dtype)
        return copied.requires_grad_(value.requires_grad)
    if (
        isinstance(value, np.ndarray)
        and dtype is not None
        and np.issubdtype(value.dtype, np.floating)
    ):
        return value.astype(np.float64)
    return value


def twice(compute: Callable[..., Any], *operands: Any) -> Twice:
    """``compute(*operands)`` on private copies, then on float64 copies (modules, float tensors and arrays).

    ``compute`` returns tensors, floats, or a tuple, list or dict of them; the caller's operands never change.
    """
    return Twice(
        _numpy(compute(*(_operand(o, None) for o in operands))),
        _numpy(compute(*(_operand(o, torch.float64) for o in operands))),
    )


def loss_run(
    model: torch.nn.Module, inputs: tuple, target: Any, loss: Callable[..., torch.Tensor]
) -> Twice:
    """``loss(model(*inputs), target)`` and every parameter's gradient, in float32 and float64.

    ``value`` is ``(loss, {parameter: gradient})``; ``scales`` the gradients' floors. ``loss`` may be a torch
    loss module (its weights run in float64 too). The model keeps its mode; the caller's model never changes.
    """

    def compute(model, loss, target, *inputs):
        value = loss(model(*inputs), target)
        value.backward()
        return value, torch_grads(model)

    run = twice(compute, model, loss, target, *inputs)
    scales = gradient_magnitudes(model, inputs, target, _operand(loss, torch.float64))
    return Twice(run.value, run.value64, scales)


def assert_grads(session: Session, run: Twice, names=None, rtol: float = GRAD_RTOL) -> None:
    """The session's gradients against a :func:`loss_run`'s (all it has, or ``names``)."""
    grads = run[1]
    for name in names or grads.value:
        grads[name].check(
            session.grad(name), rtol=rtol, scale=run.scales.get(name), name=f"{name}'s gradient"
        )


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
    """Hugging Face AdamW (ONNX Runtime's adam_mode=1, the reference's optimizer), with bias correction.

    NumPy in the dtype of ``w`` (float32 or float64): the hyperparameters are cast to it.
    """
    real = np.asarray(w).dtype.type
    beta1, beta2, eps = real(beta1), real(beta2), real(eps)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    step_size = real(lr * np.sqrt(1 - float(beta2) ** t) / (1 - float(beta1) ** t))
    w = w - step_size * m / (np.sqrt(v) + eps)
    return w - real(lr * weight_decay) * w, m, v

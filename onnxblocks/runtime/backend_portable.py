"""The portable backend: portable artifacts on plain ``InferenceSession`` objects of any
onnxruntime.

Portable artifacts (``generate_artifacts(..., portable=True)``, contract in
docs/portable.md) use standard ONNX ops only, and state that the training build
keeps inside its kernels is explicit: the training model takes each gradient
accumulation buffer and returns its new value, the optimizer (and the fused step
model) take parameters and moments and return the updated ones.

Everything the training loop updates lives in ONNX Runtime as ``OrtValue``
buffers, two per tensor, bound with IOBinding once per (model, buffer parity):
a run reads one buffer of each pair and writes the other, then the parity
flips. So a step binds only the batch; no parameter, gradient or moment passes
through numpy. The learning rate, step and ``lazy_reset_grad`` inputs are
one-element arrays whose memory the bound ``OrtValue`` shares, updated in place.

The models are run as they are written: nothing is rewritten at load time (the
optimizer model takes each parameter, gradient and moment as a tensor of its own,
so it binds like the others). Portable artifacts of the first layout, whose
optimizer model takes tensor sequences, are refused with the command that
regenerates them. Checkpoints are read and written by :mod:`onnxblocks.checkpoint` in ONNX
Runtime's layout (optimizer group ``group0``, moments ``momentum0`` /
``momentum1``), so a run moves between this backend and the training build.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.contracts import (
    DEFAULT_LEARNING_RATE,
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    STEP,
    accumulated_name,
    buffer_name,
    checkpoint_moment_name,
    gradient_name,
    state_names,
)
from onnxblocks._core.errors import InvalidValueError, StateError, preview
from onnxblocks.checkpoint import Checkpoint, OptimizerState, save_checkpoint
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.runtime import _ort
from onnxblocks.runtime.artifact_set import ArtifactSet, CheckpointRead
from onnxblocks.runtime.backend import BackendName
from onnxblocks.runtime.portable_bindings import BufferBindings, PortableModel


class PortableBackend(BufferBindings):
    """Portable artifacts on any onnxruntime, state bound with IOBinding (see the module
    docstring).
    """

    name: BackendName = "portable"

    def __init__(self, artifacts: ArtifactSet, device: str, options: Any) -> None:
        files = self.files = artifacts.files
        self._C = _ort.capi()
        providers = _ort.providers(device)
        self._device = _ort.make_device(device)
        self._cpu = _ort.make_device("cpu")
        # no pre-packed or folded copies of the memory-mapped frozen base in each session
        # (runtime/_ort.py)
        frozen = files.base_weights is not None
        options = options or _ort.session_options(prepack=not frozen, frozen_base=frozen)
        self._run_options = _ort.run_options()
        self._keep: list[np.ndarray] = []  # numpy memory that CPU OrtValues share
        # the models fit the checkpoint and each other: the artifact set checked them
        checkpoint = artifacts.checkpoint.path
        ck = _values(artifacts.checkpoint)
        self._trainable, self._frozen = sorted(ck.trainable), sorted(ck.frozen)
        self._specs = {
            n: (a.dtype, tuple(a.shape)) for n, a in (*ck.trainable.items(), *ck.frozen.items())
        }
        self._train = PortableModel(
            os.fspath(files.training_model), options, providers, "training model"
        )
        special = {
            *self._trainable,
            *self._frozen,
            *map(buffer_name, self._trainable),
            LAZY_RESET_GRAD,
        }
        accumulated = set(map(accumulated_name, self._trainable))
        self.train_inputs = [n for n in self._train.inputs if n not in special]
        self.train_outputs = [n for n in self._train.outputs if n not in accumulated]
        # the eval, optimizer and step models' sessions open on their first run (a training loop
        # runs the optimizer or the step model, never both); their inputs and outputs are known
        # from the files the artifact set read (an .ort file's from its session, opened now)
        self._eval: PortableModel | None = None
        self._optimizer: PortableModel | None = None
        self._fused: PortableModel | None = None
        self._sources = {
            kind: (os.fspath(path), options, providers, what)
            for kind, path, what in (
                ("eval", files.eval_model, "eval model"),
                ("optimizer", files.optimizer_model, "optimizer model"),
                ("step", files.step_model, "step model"),
            )
            if path is not None
        }
        eval_io = self._io("eval", artifacts.eval)
        self.eval_inputs = [n for n in eval_io[0] if n not in special] if eval_io else []
        self.eval_outputs = list(eval_io[1]) if eval_io else []
        self.has_fused_step = files.step_model is not None
        optimizer_io = self._io("optimizer", artifacts.optimizer)
        optimizer_inputs = optimizer_io[0] if optimizer_io else None
        if optimizer_inputs is not None:
            bound = {LEARNING_RATE, STEP, *self._frozen}
            for name in self._trainable:
                bound.update((name, gradient_name(name), *state_names(name)))
            unknown = [n for n in optimizer_inputs if n not in bound]
            if unknown:
                raise InvalidValueError(
                    f"The optimizer model '{files.optimizer_model}' takes {preview(unknown)}, "
                    "which are not this "
                    "checkpoint's trainable parameters, their gradients or moments. Use the "
                    "optimizer model "
                    "generated with these artifacts."
                )
        # the state inputs the models take for each parameter (SGD's optimizer model takes one it
        # never reads)
        step_io = self._io("step", artifacts.step)
        stateful = optimizer_inputs or (step_io[0] if step_io else None)
        moments = 0
        if stateful is not None and self._trainable:
            moments = sum(name in stateful for name in state_names(self._trainable[0]))
        self.has_optimizer = self.has_fused_step or optimizer_inputs is not None
        self._moments = moments
        self._lr = np.array([DEFAULT_LEARNING_RATE], np.float32)
        self._step = np.zeros(1, np.int64)
        self._reset = np.ones(1, np.bool_)
        self._scalars = {
            LEARNING_RATE: self._value(self._lr),
            STEP: self._value(self._step),
            LAZY_RESET_GRAD: self._value(self._reset),
        }
        self._p = {n: self._pair(ck.trainable[n]) for n in self._trainable}
        self._g = {n: self._pair(np.zeros_like(ck.trainable[n])) for n in self._trainable}
        self._m = {
            (n, k): self._pair(np.zeros_like(ck.trainable[n]))
            for n in self._trainable
            for k in range(moments)
        }
        self._f = {n: self._value(np.array(ck.frozen[n], order="C")) for n in self._frozen}
        self._pp = self._gp = (
            0  # which buffer of each pair holds the parameters+moments / the gradients
        )
        self._bindings: dict[tuple[str, int, int], Any] = {}
        self._batch_shapes: dict[
            int, tuple
        ] = {}  # per binding (its id): the input shapes of its last run
        self._props: dict[str, int | float | str] = {}
        self._grads_valid = False
        self._opt_step = 0
        self._initial_lr = DEFAULT_LEARNING_RATE
        self._apply(ck, checkpoint, first=True)

    # ------------------------------------------------------------- loading
    def load(self, checkpoint: CheckpointRead) -> None:
        self._apply(_values(checkpoint), checkpoint.path, first=False)

    def _apply(self, ck: Any, checkpoint: Path, first: bool) -> None:
        """Take parameters, optimizer state and properties from a read checkpoint."""
        if sorted(ck.trainable) != self._trainable or sorted(ck.frozen) != self._frozen:
            raise InvalidValueError(
                f"Checkpoint '{checkpoint}' holds parameters "
                f"{preview(sorted([*ck.trainable, *ck.frozen]))}, but the "
                f"session has {preview(sorted([*self._trainable, *self._frozen]))}. Load a "
                "checkpoint saved from "
                "these artifacts."
            )
        self._check_specs(ck, checkpoint)
        group = ck.optimizer_state.primary
        for name in self._trainable:
            saved = group.slots(name) if group is not None else ()
            if group is not None and self._moments >= 2 and len(saved) < self._moments:
                raise InvalidValueError(
                    f"Checkpoint '{checkpoint}' holds {len(saved)} optimizer moment(s) for "
                    f"'{name}'; these artifacts' "
                    f"optimizer keeps {self._moments} ({checkpoint_moment_name(0)}...). Save the "
                    "checkpoint with the same optimizer, or "
                    "save it with include_optimizer_state=False."
                )
            if not first:
                self._p[name][self._pp].update_inplace(np.ascontiguousarray(ck.trainable[name]))
            for k in range(self._moments):
                value = (
                    saved[k]
                    if k < len(saved)
                    else np.zeros(self._specs[name][1], self._specs[name][0])
                )
                for buffer in self._m[(name, k)]:
                    buffer.update_inplace(np.ascontiguousarray(value))
        if not first:
            for name in self._frozen:
                self._f[name].update_inplace(np.ascontiguousarray(ck.frozen[name]))
        self._opt_step = group.step if group is not None else 0
        self._initial_lr = (
            group.initial_learning_rate if group is not None else DEFAULT_LEARNING_RATE
        )
        self._lr[0] = self._initial_lr
        self._props = dict(ck.properties)
        self.lazy_reset_grad()
        self._grads_valid = False

    def _check_specs(self, ck: Any, checkpoint: Path) -> None:
        for name, array in (*ck.trainable.items(), *ck.frozen.items()):
            dtype, shape = self._specs[name]
            if array.dtype != dtype or tuple(array.shape) != shape:
                raise InvalidValueError(
                    f"Checkpoint '{checkpoint}' holds '{name}' as {array.dtype} "
                    f"{list(array.shape)}, but the session's "
                    f"is {dtype} {list(shape)}. Load a checkpoint saved from these artifacts."
                )

    # --------------------------------------------------------------- steps
    def train_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        out = self._run(
            self._train, self._binding("train"), self.train_inputs, arrays, self.train_outputs
        )
        self._gp ^= 1
        self._reset[0] = False
        self._grads_valid = True
        return out

    def eval_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        return self._run(
            self._model("eval"), self._binding("eval"), self.eval_inputs, arrays, self.eval_outputs
        )

    def optimizer_step(self) -> None:
        if "optimizer" not in self._sources:
            raise StateError(
                f"The artifacts in '{self.files.directory}' have a fused step model but no "
                "optimizer model, so "
                "gradients cannot be applied after train_step. Use session.train_and_update(...) "
                "for each batch."
            )
        self._step[0] = self._opt_step + 1  # the step being taken, as ONNX Runtime's AdamW counts
        self._run(self._model("optimizer"), self._binding("optimizer"), (), (), ())
        self._pp ^= 1
        self._opt_step += 1

    def lazy_reset_grad(self) -> None:
        self._reset[0] = True

    def step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        if not self.has_fused_step:
            out = self.train_step(arrays)
            self.optimizer_step()
            self.lazy_reset_grad()
            return out
        self._step[0] = self._opt_step + 1
        model, binding = self._model("step"), self._binding("step")
        out = self._run(model, binding, self.train_inputs, arrays, self.train_outputs)
        self._pp ^= 1
        self._opt_step += 1
        self._reset[0] = True  # the accumulation buffers hold no gradient of this step
        self._grads_valid = False
        return out

    def get_learning_rate(self) -> float:
        return float(self._lr[0])

    def set_learning_rate(self, value: float) -> None:
        self._lr[0] = value

    # ---------------------------------------------------------- parameters
    def _current(self, name: str) -> Any:
        return self._p[name][self._pp] if name in self._p else self._f[name]

    def parameter_names(self) -> list[str]:
        return sorted([*self._trainable, *self._frozen])

    def has_parameter(self, name: str) -> bool:
        return name in self._specs

    def is_trainable(self, name: str) -> bool:
        return name in self._p

    def get_parameter(self, name: str) -> np.ndarray:
        return np.array(self._current(name).numpy(), copy=True)

    def parameter_spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        return self._specs[name]

    def write_parameters(self, values: dict[str, np.ndarray]) -> None:
        for name, array in values.items():
            self._current(name).update_inplace(array)

    def gradient(self, name: str) -> np.ndarray | None:
        return np.array(self._g[name][self._gp].numpy(), copy=True) if self._grads_valid else None

    def write_gradients(self, values: dict[str, np.ndarray]) -> None:
        for name, array in values.items():  # the buffer the optimizer model is bound to
            self._g[name][self._gp].update_inplace(array)

    def num_parameters(self) -> int:
        return sum(int(np.prod(self._specs[n][1])) for n in self._trainable)

    # --------------------------------------------------------- checkpoints
    def properties(self) -> dict[str, int | float | str]:
        return dict(self._props)

    def set_property(self, name: str, value: int | float | str) -> None:
        self._props[name] = value

    def save(self, path: Path, include_optimizer_state: bool) -> None:
        state = OptimizerState()
        if include_optimizer_state and self.has_optimizer:
            moments = {
                n: [self._m[(n, k)][self._pp].numpy() for k in range(self._moments)]
                for n in self._trainable
            }
            state = OptimizerState.single(self._opt_step, self._initial_lr, moments)
        save_checkpoint(
            (
                {n: self._current(n).numpy() for n in self._trainable},
                {n: self._f[n].numpy() for n in self._frozen},
            ),
            path,
            optimizer_state=state,
            properties=self._props,
        )


def _values(read: CheckpointRead) -> Checkpoint:
    """The values of a checkpoint the artifact set read, its extras (a weight average's tensors,
    which the session reads and writes: runtime/checkpoint_extras.py) left out.

    Raises:
        InvalidValueError: for a nominal checkpoint (names without values).
    """
    ck = read.contents()
    if ck.is_nominal:
        raise InvalidValueError(
            f"Checkpoint '{read.path}' is nominal (parameter names without values); the "
            "portable backend trains from values. Pass the complete checkpoint "
            "generate_artifacts wrote."
        )
    frozen = {n: v for n, v in ck.frozen.items() if not n.startswith(EXTRA_PREFIX)}
    return dataclasses.replace(ck, frozen=frozen)

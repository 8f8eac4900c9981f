"""The portable backend's buffers and their IOBindings.

Everything the training loop updates lives in ONNX Runtime as ``OrtValue`` buffers,
two per tensor (:meth:`BufferBindings._pair`), bound with IOBinding once per (model,
buffer parity): a run reads one buffer of each pair and writes the other, then the
parity flips. So a step binds only the batch; no parameter, gradient or moment passes
through numpy. The learning rate, step and ``lazy_reset_grad`` inputs are one-element
arrays whose memory the bound ``OrtValue`` shares, updated in place.

:class:`BufferBindings` is the part of
:class:`~onnxblocks.runtime.backend_portable.PortableBackend` that opens the models' sessions
(the training model's with the backend, each other's on its first run) and makes and runs the
bindings; the backend owns the buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core.contracts import (
    accumulated_name,
    buffer_name,
    gradient_name,
    state_names,
    updated_name,
)
from onnxblocks._core.errors import PortabilityError, preview
from onnxblocks.runtime import _ort
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.load_errors import load_error

if TYPE_CHECKING:
    from onnxblocks.runtime.artifact_set import ModelFile


class PortableModel:
    """One InferenceSession, its C session (the hot path calls it directly) and its signature."""

    def __init__(self, source: str | bytes, options: Any, providers: list[str], what: str) -> None:
        ort = _ort.onnxruntime()
        try:
            self.session = ort.InferenceSession(source, sess_options=options, providers=providers)
        except Exception as exc:
            raise load_error(ort.__version__, what, source, _ort.clean_message(exc)) from None
        self.run = self.session._sess.run_with_iobinding
        self.what = what
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        #: outputs whose shape is not fixed (it may follow the batch): bound afresh when the batch's
        #: shapes change
        self.dynamic = frozenset(
            o.name
            for o in self.session.get_outputs()
            if o.shape is None or not all(isinstance(d, int) for d in o.shape)
        )

    def binding(self) -> Any:
        return _ort.capi().SessionIOBinding(self.session._sess)


class BufferBindings:
    """Making and running the IOBindings of the portable backend's models (see the module
    docstring).
    """

    files: ArtifactFiles
    train_outputs: list[str]
    eval_outputs: list[str]
    _eval: PortableModel | None
    _optimizer: PortableModel | None
    _fused: PortableModel | None
    _sources: dict[str, tuple[str, Any, list[str], str]]
    _C: Any
    _device: Any
    _cpu: Any
    _run_options: Any
    _keep: list[np.ndarray]
    _train: PortableModel
    _trainable: list[str]
    _moments: int
    _scalars: dict[str, Any]
    _f: dict[str, Any]
    _p: dict[str, tuple[Any, Any]]
    _g: dict[str, tuple[Any, Any]]
    _m: dict[tuple[str, int], tuple[Any, Any]]
    _pp: int
    _gp: int
    _bindings: dict[tuple[str, int, int], Any]
    _batch_shapes: dict[int, tuple]

    def _value(self, array: np.ndarray) -> Any:
        self._keep.append(array)
        return self._C.OrtValue.ortvalue_from_numpy(array, self._device)

    def _pair(self, initial: np.ndarray) -> tuple[Any, Any]:
        # both hold the value: a moment no model updates (SGD's) is read from either
        return self._value(np.array(initial, copy=True, order="C")), self._value(
            np.array(initial, copy=True, order="C")
        )

    def _model(self, kind: str) -> PortableModel:
        """The session of model ``kind`` (``"eval"``, ``"optimizer"``, ``"step"``), opened on first
        use.
        """
        attribute = {"eval": "_eval", "optimizer": "_optimizer", "step": "_fused"}[kind]
        model = getattr(self, attribute)
        if model is None:
            model = PortableModel(*self._sources[kind])
            if kind == "optimizer":
                _refuse_sequences(
                    [i.name for i in model.session.get_inputs() if i.type.startswith("seq(")],
                    self.files,
                )
            setattr(self, attribute, model)
        return model

    def _io(self, kind: str, file: ModelFile | None) -> tuple[list[str], list[str]] | None:
        """The input and output names of model ``kind``, or None when the set has none.

        Read from the file's structure; an ``.ort`` file, which onnx cannot read, is opened now.
        """
        if kind not in self._sources:
            return None
        if file is None or file.model is None:
            model = self._model(kind)
            return model.inputs, model.outputs
        graph = file.model.graph
        if kind == "optimizer":
            kinds = {i.name: i.type.WhichOneof("value") for i in graph.input}
            _refuse_sequences([n for n, k in kinds.items() if k == "sequence_type"], self.files)
        signature = file.signature
        assert signature is not None
        # as ONNX Runtime lists them: an input with an initializer is not one the run feeds
        constant = {i.name for i in graph.initializer}
        inputs = [n for n in signature.inputs if n not in constant]
        return inputs, list(signature.outputs)

    def _binding(self, kind: str) -> Any:
        """The binding of model ``kind`` for the current buffer parities, made on first use."""
        key = (kind, self._pp, self._gp if kind in ("train", "optimizer") else 0)
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self._bind(kind, key[1], key[2])
        return binding

    def _bind(self, kind: str, pp: int, gp: int) -> Any:
        model = self._train if kind == "train" else self._model(kind)
        binding = model.binding()
        user_outputs = {
            "train": self.train_outputs,
            "eval": self.eval_outputs,
            "step": self.train_outputs,
        }
        for name in user_outputs.get(kind, ()):
            binding.bind_output(name, self._cpu)  # first: get_outputs() starts with them
        inputs = set(model.inputs)
        bind_in, bind_out = binding.bind_ortvalue_input, binding.bind_ortvalue_output
        for name, value in self._scalars.items():
            if name in inputs:
                bind_in(name, value)
        for name, value in self._f.items():
            if name in inputs:
                bind_in(name, value)
        outputs = set(model.outputs)
        for name in self._trainable:
            bind_in(name, self._p[name][pp])
            if kind == "train":
                bind_in(buffer_name(name), self._g[name][gp])
                bind_out(accumulated_name(name), self._g[name][1 - gp])
            if kind == "optimizer":
                bind_in(gradient_name(name), self._g[name][gp])
            if kind in ("step", "optimizer"):
                bind_out(updated_name(name), self._p[name][1 - pp])
                for k, moment in enumerate(state_names(name, self._moments)):
                    if (
                        moment in inputs
                    ):  # (SGD keeps a moment for ONNX Runtime's checkpoints, but updates none)
                        bind_in(moment, self._m[(name, k)][pp])
                    if updated_name(moment) in outputs:
                        bind_out(updated_name(moment), self._m[(name, k)][1 - pp])
        return binding

    def _run(
        self,
        model: PortableModel,
        binding: Any,
        names: Sequence[str],
        arrays: Sequence[Any],
        user_outputs: Sequence[str],
    ) -> tuple:
        for name, array in zip(names, arrays, strict=True):
            binding.bind_input(name, array)
        count = len(user_outputs)
        if count and not model.dynamic.isdisjoint(user_outputs):
            # A binding keeps its output tensors and writes the next run into them: an output whose
            # shape follows
            # the batch (``"none"`` losses, extra outputs such as logits) is bound afresh when the
            # batch's shapes
            # change, so ONNX Runtime allocates it in the new shape.
            shapes = tuple(getattr(a, "shape", None) for a in arrays)
            if self._batch_shapes.get(id(binding), shapes) != shapes:
                for name in user_outputs:
                    binding.bind_output(name, self._cpu)
            self._batch_shapes[id(binding)] = shapes
        try:
            model.run(binding, self._run_options)
        except Exception as exc:
            raise _ort.run_error(exc, f"the {model.what}") from None
        outputs = binding.get_outputs()
        # copies: the binding keeps its output tensors and the next run with it writes into them
        # again
        return tuple(np.array(outputs[i].numpy()) for i in range(count))


def _refuse_sequences(sequences: list[str], files: ArtifactFiles) -> None:
    """Refuse an optimizer model of the first portable layout (tensor-sequence inputs
    ``sequences``), saying how to regenerate.

    Raises:
        PortabilityError: if it takes tensor sequences.
    """
    if sequences:
        raise PortabilityError(
            f"The optimizer model '{files.optimizer_model}' takes tensor sequences "
            f"{preview(sequences)}; the portable runtime runs artifacts as they are written, with "
            "one tensor per parameter, gradient and moment (docs/portable.md), so it cannot feed "
            "them. Regenerate the artifacts: `onnxblocks artifacts MODEL.onnx ... "
            "--portable`, or "
            "onnxblocks.generate_artifacts(..., portable=True)."
        )

"""What a training session hands on: the inference model and the LoRA adapters.

Part of :class:`~onnxblocks.runtime.session.TrainingSession` (see
:mod:`onnxblocks.runtime.session_core`). The inference model is the eval model cut
down to the outputs asked for, with the current (or averaged) weights
(:mod:`onnxblocks.runtime.export`); the adapters are written and read as a PEFT
directory (:mod:`onnxblocks.peft.files`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onnxblocks._core.errors import InvalidTypeError, StateError
from onnxblocks.runtime import guards as _guards
from onnxblocks.runtime.export import export_inference, forward_outputs_of
from onnxblocks.runtime.session_parameters import ParameterAccess

if TYPE_CHECKING:
    from onnxblocks.peft.info import LoraInfo


class InferenceExport(ParameterAccess):
    """The inference model and the LoRA adapters of a session."""

    def default_inference_outputs(self) -> list[str]:
        """The outputs :meth:`export_inference_model` keeps by default.

        These are the eval model's outputs after the loss, i.e. the
        ``additional_output_names`` the artifacts were generated with.
        """
        outputs = self.eval_output_names[1:]
        model = self._artifacts.eval
        model_outputs = forward_outputs_of(model.metadata) if model is not None else []
        return model_outputs or outputs

    def export_inference_model(
        self,
        path: str | os.PathLike,
        output_names: Sequence[str] | None = None,
        *,
        use_ema: bool = False,
        merge_adapters: bool = False,
    ) -> Path:
        """Write an inference model with the current (trained) parameters.

        The eval model is cut down to the nodes that compute ``output_names``;
        the loss and label inputs are dropped. The export is self-contained on
        both backends and at any size: one ``.onnx`` file, or, when the weights
        total 1 GiB or more (or the eval model keeps constants in external data),
        the ``.onnx`` file and ``<file name>.data`` beside it, referenced by a
        relative location. Both are written atomically; nothing refers back to
        the artifacts directory.

        Args:
            path: Destination ``.onnx`` file.
            output_names: Outputs to keep; default :meth:`default_inference_outputs`.
            use_ema: Export the weight EMA (:attr:`weight_ema`: a ``WeightEMA`` of ``fit``, or the
            one the
                loaded checkpoint holds) instead of the trained weights.
            merge_adapters: For artifacts with LoRA adapters (docs/lora.md): write a plain model
            with
                each adapted weight replaced by ``W + (lora_alpha / r) * B @ A`` (in the weight's
                stored
                layout and dtype) and the adapter branches removed, as PEFT's
                ``merge_and_unload()``.
                False (default) keeps the branches, with the current adapters as initializers, so
                they stay swappable.

        Returns:
            The path written.

        Raises:
            RuntimeError: if the artifacts have no eval model, or ``use_ema`` without a weight EMA.
            TypeError: if ``output_names`` is a str (one name: pass ``[name]``) or holds a non-str.
            ValueError: if no output names are given and none can be inferred, the
                eval model computes no value of that name, or ``merge_adapters`` is asked of
                artifacts without LoRA adapters.
        """
        if not self.has_eval_model:
            raise StateError(
                "export_inference_model needs the eval model, but the artifacts have none."
            )
        if output_names is not None and (
            not isinstance(output_names, (list, tuple))
            or not all(isinstance(n, str) for n in output_names)
        ):
            one = (
                f" For one output pass [{output_names!r:.40}]."
                if isinstance(output_names, str)
                else ""
            )
            raise InvalidTypeError(
                f"export_inference_model: output_names must be a list of output names (str), not "
                f"{type(output_names).__name__} {output_names!r:.60}.{one}"
            )
        if not isinstance(merge_adapters, bool):
            raise InvalidTypeError(
                f"merge_adapters must be True or False, not {merge_adapters!r:.40}."
            )
        merge = merge_adapters
        names = list(output_names) if output_names is not None else self.default_inference_outputs()
        assert (
            self.files.eval_model is not None
        )  # export_inference refuses an empty `names`, saying what to pass
        backend = self._backend
        specs = {n: backend.parameter_spec(n) for n in self.parameter_names()}
        if use_ema and (self.weight_ema is None or self.weight_ema.average is None):
            raise StateError(
                "export_inference_model(use_ema=True): the session holds no weight EMA. Train with "
                "fit(..., callbacks=[WeightEMA(decay)]) or load a checkpoint saved from such a run."
            )
        ema = self.weight_ema if use_ema else None
        with ema.applied(self) if ema is not None else contextlib.nullcontext():
            return export_inference(
                self.files.eval_model,
                Path(path),
                names,
                specs,
                backend.get_parameter,
                self.eval_output_names,
                merge,
            )

    def export_hub(
        self,
        out_dir: str | os.PathLike,
        *,
        quantize: Sequence[str] = ("q8",),
        safetensors: bool = True,
        merge_adapters: bool = True,
        into: str | os.PathLike | None = None,
        source: str | os.PathLike | None = None,
    ) -> Path:
        """Write the trained model as a hub folder that Transformers.js and transformers load.

        ``config.json``, ``generation_config.json`` and the tokenizer files are copied from the
        hub folder the artifacts came from (``hub.json``, or ``source``); ``onnx/model.onnx`` is
        that folder's ONNX file (its signature, past inputs and ``present.*`` outputs kept) with
        the trained weights; ``quantize`` adds ``onnx/model_quantized.onnx`` (``"q8"``) and
        ``onnx/model_q4.onnx`` (``"q4"``); ``model.safetensors`` holds the state dict under
        Hugging Face's names. ``into`` writes the weights into another export of the same model
        (no-cache <-> with-past). See :func:`onnxblocks.hub.export.export_hub` and docs/hub.md.

        Returns:
            ``out_dir``.
        """
        from onnxblocks.hub.export import export_hub

        return export_hub(
            self,
            out_dir,
            quantize=quantize,
            safetensors=safetensors,
            merge_adapters=merge_adapters,
            into=into,
            source=source,
        )

    @property
    def lora(self) -> LoraInfo | None:
        """The artifacts' LoRA adapters (:class:`onnxblocks.peft.LoraInfo`), or None without
        them.
        """
        return self._artifacts.lora

    def _require_lora(self, what: str) -> LoraInfo:
        info = self.lora
        if info is None:
            raise StateError(
                f"{what}: the artifacts in '{self.files.directory}' have no LoRA adapters. "
                "Generate them with "
                "generate_artifacts(..., lora=onnxblocks.peft.LoraConfig(...)) (docs/lora.md)."
            )
        return info

    def save_adapters(self, directory: str | os.PathLike) -> Path:
        """Write the current LoRA adapters as a PEFT directory that
        ``peft.PeftModel.from_pretrained`` loads.

        ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and
        ``lora_B.weight`` ``[out, r]``) and ``adapter_config.json`` are written by onnxblocks itself
        (no torch, no peft), each beside its destination and renamed into place.

        Args:
            directory: The directory (created if missing).

        Returns:
            The directory.

        Raises:
            StateError: if the artifacts have no LoRA adapters.
            NotAFolderError: if ``directory`` is a file.
        """
        from onnxblocks.peft.files import write_adapters

        info = self._require_lora("save_adapters")
        target = _guards.as_path(directory, "directory")
        return write_adapters(
            target, info, {name: self.get_parameter(name) for name in info.adapter_names}
        )

    def load_adapters(self, directory: str | os.PathLike) -> None:
        """Replace the LoRA adapters with those of a PEFT directory (saved by :meth:`save_adapters`
        or ``peft``).

        The directory's ``adapter_config.json`` must fit the artifacts (same ``r`` and scale
        ``lora_alpha / r``, no option onnxblocks does not support) and its
        ``adapter_model.safetensors``
        hold exactly the adapters of the artifacts' target modules (F32, F16 or BF16, read as
        float32);
        nothing is written unless all of it does. The optimizer state is kept (zero in fresh
        artifacts).

        Args:
            directory: The PEFT adapter directory.

        Raises:
            StateError: if the artifacts have no LoRA adapters.
            FileMissingError: if the directory or one of its two files is missing.
            InvalidValueError: for a config or a tensor that does not fit (the message names the
            file and tensor).
        """
        from onnxblocks.peft.files import read_adapters

        info = self._require_lora("load_adapters")
        self.set_parameters(read_adapters(_guards.as_path(directory, "directory"), info))

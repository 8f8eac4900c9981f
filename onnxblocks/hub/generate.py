"""``from_hub``: training artifacts from a Hugging Face hub folder (Optimum, Transformers.js)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks._core.weights import load_structure
from onnxblocks.artifacts import Artifacts, OptimType, generate_artifacts
from onnxblocks.hub.layout import read_hub
from onnxblocks.hub.losses import IGNORE_INDEX, task_loss
from onnxblocks.hub.record import HubRecord, write_record
from onnxblocks.peft import LoraConfig

#: PEFT's ``task_type`` for each task.
PEFT_TASK_TYPES = {
    "causal-lm": "CAUSAL_LM",
    "sequence-classification": "SEQ_CLS",
    "token-classification": "TOKEN_CLS",
    "masked-lm": "FEATURE_EXTRACTION",
}
_FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
#: generate_artifacts arguments from_hub sets itself.
_DECIDED = {"loss", "loss_input_names", "additional_output_names", "model_path"}


def from_hub(
    hub_dir: str | os.PathLike,
    artifact_directory: str | os.PathLike,
    *,
    task: str = "auto",
    lora: LoraConfig | None = None,
    portable: bool | str = False,
    file: str | os.PathLike | None = None,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
    **generate_kwargs: Any,
) -> Artifacts:
    """Generate training artifacts from a hub folder, with the loss its task trains with.

    The folder is what Optimum exports and Transformers.js loads: ``config.json``, tokenizer
    files and ``onnx/model.onnx`` (or ``model.onnx`` at the top). The training and eval models
    take the export's inputs plus ``labels`` (transformers' labels: the input ids for a causal
    LM, shifted inside the graph; -100 ignored); the past key values of a with-past export stay
    inputs, and an empty cache (past length 0) is a valid batch. The eval model also returns
    ``logits`` and the ``present.*`` outputs. ``hub.json`` records the source folder
    (:class:`~onnxblocks.hub.HubRecord`).

    Args:
        hub_dir: The hub folder.
        artifact_directory: Where to write the artifacts.
        task: ``"auto"`` (from ``config.json``'s ``architectures``), ``"causal-lm"``,
            ``"sequence-classification"``, ``"token-classification"`` or ``"masked-lm"``.
        lora: LoRA adapters to train (docs/lora.md); ``task_type`` and
            ``base_model_name_or_path`` are filled from the folder where unset. Without it,
            every floating-point weight trains (a full fine-tune).
        portable: As :func:`~onnxblocks.generate_artifacts` (stock onnxruntime).
        file: The ONNX file: a name in ``onnx/`` or at the top (``"model_q4.onnx"``), or a path
            relative to the folder. Default ``onnx/model.onnx``, else ``model.onnx``.
        ignore_index: The label that adds nothing to the loss.
        chunk_size: Tokens per chunk of the log-softmax (a large vocabulary's memory).
        **generate_kwargs: Passed to :func:`~onnxblocks.generate_artifacts` (``optimizer``
            defaults to AdamW).

    Returns:
        The :class:`~onnxblocks.Artifacts`.

    Raises:
        FileMissingError, NotAFolderError: for a missing folder or ONNX file (the message lists
            the folder's ONNX files).
        InvalidValueError: for a task that cannot be told or served.
        InvalidTypeError: for a ``lora`` that is not a LoraConfig.
    """
    taken = sorted(_DECIDED & generate_kwargs.keys())
    if taken:
        raise InvalidValueError(
            f"from_hub decides {', '.join(taken)} from the task; drop them, or call "
            "generate_artifacts on the hub file for a loss of your own."
        )
    hub = read_hub(hub_dir, file, task)
    if lora is not None and not isinstance(lora, LoraConfig):
        raise InvalidTypeError(
            f"from_hub: lora must be an onnxblocks.peft.LoraConfig, not {type(lora).__name__}."
        )
    kwargs: dict[str, Any] = {"optimizer": OptimType.AdamW, **generate_kwargs}
    if lora is not None:
        lora = dataclasses.replace(
            lora,
            task_type=lora.task_type or PEFT_TASK_TYPES[hub.task],
            base_model_name_or_path=lora.base_model_name_or_path or hub.base_model,
        )
    elif "requires_grad" not in kwargs:
        kwargs["requires_grad"] = _float_weights(hub.path)
        # torch trains one weight per module where the exporter merged equal ones
        kwargs.setdefault("untie", True)
    outputs = ["logits", *hub.present_outputs]
    artifacts = generate_artifacts(
        os.fspath(hub.path),
        loss=task_loss(hub.task, ignore_index=ignore_index, chunk_size=chunk_size),
        artifact_directory=artifact_directory,
        loss_input_names=["logits"],
        additional_output_names=outputs,
        portable=portable,
        lora=lora,
        **kwargs,
    )
    record = HubRecord(
        source=hub.root,
        file=hub.file,
        task=hub.task,
        with_past=bool(hub.past_inputs),
        past_inputs=hub.past_inputs,
        present_outputs=hub.present_outputs,
        base_model=hub.base_model,
    )
    write_record(record, Path(artifact_directory))
    return artifacts


def _float_weights(path: Path) -> list[str]:
    """The floating-point initializers of the model at ``path``: what a full fine-tune trains."""
    graph = load_structure(path).graph
    return [i.name for i in graph.initializer if i.data_type in _FLOAT_TYPES and i.dims]

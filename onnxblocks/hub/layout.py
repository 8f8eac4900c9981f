"""A Hugging Face hub folder read once: which ONNX file, which task, which past and present names.

Optimum and Transformers.js folders keep the models in ``onnx/`` (``model.onnx``,
``model_quantized.onnx``, ``model_q4.onnx``...) beside ``config.json`` and the tokenizer files;
older exports put ``model.onnx`` at the top. The task comes from ``config.json``'s
``architectures`` (``LlamaForCausalLM`` -> ``causal-lm``), and is checked against the outputs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import FileMissingError, InvalidValueError, NotAFolderError
from onnxblocks._core.weights import load_structure
from onnxblocks.hub.record import TASKS

#: Where a hub folder keeps its default model, in the order they are looked for.
DEFAULT_FILES = ("onnx/model.onnx", "model.onnx")
#: ``architectures`` suffix -> task.
ARCHITECTURE_TASKS = {
    "ForCausalLM": "causal-lm",
    "LMHeadModel": "causal-lm",
    "ForSequenceClassification": "sequence-classification",
    "ForTokenClassification": "token-classification",
    "ForMaskedLM": "masked-lm",
}
#: Prefixes of Optimum's past key-value inputs and present outputs.
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."


@dataclass(frozen=True)
class HubFolder:
    """What :func:`read_hub` found in a hub folder.

    Attributes:
        root: The folder (absolute).
        file: The ONNX file used, relative to ``root`` (POSIX form).
        config: ``config.json`` (empty when the folder has none).
        inputs: The model's input names.
        outputs: The model's output names.
        task: The task (one of :data:`~onnxblocks.hub.record.TASKS`).
    """

    root: Path
    file: str
    config: dict[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    task: str

    @property
    def path(self) -> Path:
        return self.root / self.file

    @property
    def past_inputs(self) -> tuple[str, ...]:
        return tuple(n for n in self.inputs if n.startswith(PAST_PREFIX))

    @property
    def present_outputs(self) -> tuple[str, ...]:
        return tuple(n for n in self.outputs if n.startswith(PRESENT_PREFIX))

    @property
    def base_model(self) -> str:
        """``_name_or_path`` of the config when it names a hub model, else the folder's name."""
        name = self.config.get("_name_or_path")
        return (
            name if isinstance(name, str) and name and not os.path.isabs(name) else self.root.name
        )


def find_file(root: Path, file: str | os.PathLike | None) -> str:
    """The ONNX file of the folder ``root``, relative to it: ``file`` by name, else the default.

    ``file`` is a path relative to the folder, or a bare name looked for in ``onnx/`` then at
    the top (``"model_q4.onnx"``).

    Raises:
        FileMissingError: naming what was looked for and the ONNX files the folder has.
    """
    if file is not None:
        name = os.fspath(file)
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise InvalidValueError(
                f"from_hub: file={name!r} must name a file inside the hub folder {str(root)!r} "
                "('model_q4.onnx' or 'onnx/model_q4.onnx'), not a path outside it."
            )
        candidates = [name] if "/" in name else [f"onnx/{name}", name]
    else:
        candidates = list(DEFAULT_FILES)
    for candidate in candidates:
        if (root / candidate).is_file():
            return candidate
    present = sorted(str(p.relative_to(root)) for p in root.rglob("*.onnx"))
    raise FileMissingError(
        f"from_hub: no {' or '.join(candidates)} in the hub folder {str(root)!r}. "
        + (
            f"It has {', '.join(present)}: pass file= with one of them."
            if present
            else "It has no .onnx file: export one with `optimum-cli export onnx`."
        )
    )


def _config(root: Path) -> dict[str, Any]:
    path = root / "config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidValueError(f"from_hub: {str(path)!r} is not JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise InvalidValueError(f"from_hub: {str(path)!r} must hold a JSON object.")
    return data


def task_of(config: dict[str, Any], outputs: tuple[str, ...], where: str) -> str:
    """The task ``config.json``'s ``architectures`` names, checked against the outputs.

    Raises:
        InvalidValueError: when the config names none (saying to pass ``task=``).
    """
    names = config.get("architectures") or []
    for architecture in names if isinstance(names, list) else []:
        for suffix, task in ARCHITECTURE_TASKS.items():
            if isinstance(architecture, str) and architecture.endswith(suffix):
                if "logits" not in outputs:
                    break
                return task
    raise InvalidValueError(
        f"from_hub: cannot tell the task of {where}: config.json's architectures are "
        f"{names!r} and the outputs {list(outputs)}. Pass task= one of {', '.join(TASKS)}."
    )


def read_hub(
    hub_dir: str | os.PathLike, file: str | os.PathLike | None = None, task: str = "auto"
) -> HubFolder:
    """Read the hub folder ``hub_dir``: its ONNX file's signature, config and task.

    Raises:
        NotAFolderError: when ``hub_dir`` is not a folder.
        FileMissingError: when the ONNX file is not there.
        InvalidValueError: for an unknown task, or one the outputs cannot serve.
    """
    root = Path(hub_dir).resolve()
    if not root.is_dir():
        raise (FileMissingError if not root.exists() else NotAFolderError)(
            f"from_hub: the hub folder {os.fspath(hub_dir)!r} is not a folder; pass the folder "
            "that holds config.json and onnx/model.onnx."
        )
    relative = find_file(root, file)
    structure = load_structure(root / relative)
    initializers = {i.name for i in structure.graph.initializer}
    inputs = tuple(i.name for i in structure.graph.input if i.name not in initializers)
    outputs = tuple(o.name for o in structure.graph.output)
    config = _config(root)
    if task == "auto":
        task = task_of(config, outputs, repr(str(root / relative)))
    elif task not in TASKS:
        raise InvalidValueError(f"from_hub: task={task!r} is not one of auto, {', '.join(TASKS)}.")
    if "logits" not in outputs:
        raise InvalidValueError(
            f"from_hub: {str(root / relative)!r} has no 'logits' output (outputs: "
            f"{list(outputs)}); the {task} loss reads it. Export the model with a head "
            f"(optimum-cli export onnx --task ...)."
        )
    return HubFolder(root, relative, config, inputs, outputs, task)

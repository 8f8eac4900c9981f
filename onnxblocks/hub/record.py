"""Where an artifact set made from a Hugging Face hub folder came from: ``hub.json``.

:func:`onnxblocks.hub.from_hub` writes a :class:`HubRecord` beside the artifacts it generates;
``TrainingSession.export_hub`` reads it back to find the source folder (config, tokenizer and the
ONNX file the training graph was built from). The file is read as untrusted input: every field is
checked for its type and range, and a bad file raises an :class:`InvalidValueError` that names it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from onnxblocks._core.atomic import atomic_file
from onnxblocks._core.contracts import HUB_RECORD
from onnxblocks._core.errors import FileMissingError, InvalidValueError

#: The tasks a hub folder is trained for (``from_hub(task=...)``).
TASKS = ("causal-lm", "sequence-classification", "token-classification", "masked-lm")
#: The version of ``hub.json`` this module writes and reads.
RECORD_VERSION = 1
#: Refuse records larger than this (a record is names and paths: kilobytes).
_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class HubRecord:
    """What an artifact set was generated from.

    Attributes:
        source: The hub folder (absolute path): ``config.json``, tokenizer files, ONNX files.
        file: The ONNX file the training graph came from, relative to ``source`` (POSIX form,
            e.g. ``onnx/model.onnx``).
        task: One of :data:`TASKS`.
        with_past: Whether the file takes past key values (``past_key_values.*`` inputs).
        past_inputs: The past key-value input names, in the file's order (empty without past).
        present_outputs: The ``present.*`` output names, in the file's order.
        module_paths: Initializer name -> Hugging Face module path (``model.layers.0.mlp.up_proj``)
            where it is known; empty otherwise.
        base_model: ``_name_or_path`` of ``config.json`` (or the folder's name), for the
            ``base_model_name_or_path`` of saved adapters.
    """

    source: Path
    file: str
    task: str
    with_past: bool = False
    past_inputs: tuple[str, ...] = ()
    present_outputs: tuple[str, ...] = ()
    module_paths: Mapping[str, str] = field(default_factory=dict, hash=False)
    base_model: str = ""

    def __post_init__(self) -> None:
        _check(self, "<HubRecord>")

    @property
    def source_file(self) -> Path:
        """The ONNX file in the source folder."""
        return self.source / PurePosixPath(self.file)

    def check_source(self) -> Path:
        """The source folder, after checking it and its ONNX file still exist.

        Raises:
            FileMissingError: naming the missing folder or file and the record.
        """
        if not self.source.is_dir():
            raise FileMissingError(
                f"The hub folder {str(self.source)!r} recorded in {HUB_RECORD} is gone; "
                "restore it, or regenerate the artifacts with onnxblocks.hub.from_hub."
            )
        if not self.source_file.is_file():
            raise FileMissingError(
                f"{self.file!r} is no longer in the hub folder {str(self.source)!r}; restore it, "
                "or regenerate the artifacts with onnxblocks.hub.from_hub."
            )
        return self.source

    def to_json(self) -> dict[str, Any]:
        """The record as ``hub.json`` holds it."""
        return {
            "version": RECORD_VERSION,
            "source": os.fspath(self.source),
            "file": self.file,
            "task": self.task,
            "with_past": self.with_past,
            "past_inputs": list(self.past_inputs),
            "present_outputs": list(self.present_outputs),
            "module_paths": dict(self.module_paths),
            "base_model": self.base_model,
        }


def _check(record: HubRecord, where: str) -> None:
    def bad(what: str) -> InvalidValueError:
        return InvalidValueError(
            f"{where}: {what}. Regenerate the artifacts with onnxblocks.hub.from_hub."
        )

    if not isinstance(record.source, Path) or not record.source.is_absolute():
        raise bad(f"'source' must be an absolute path, not {record.source!r}")
    name = PurePosixPath(record.file) if isinstance(record.file, str) else None
    if name is None or not record.file or name.is_absolute() or ".." in name.parts:
        raise bad(f"'file' must be a path inside the hub folder, not {record.file!r}")
    if record.task not in TASKS:
        raise bad(f"'task' must be one of {', '.join(TASKS)}, not {record.task!r}")
    if not isinstance(record.with_past, bool):
        raise bad(f"'with_past' must be true or false, not {record.with_past!r}")
    for label in ("past_inputs", "present_outputs"):
        names = getattr(record, label)
        if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
            raise bad(f"{label!r} must be a list of names, not {names!r}")
    if record.with_past and not record.past_inputs:
        raise bad("'with_past' is true but 'past_inputs' is empty")
    paths = record.module_paths
    if not isinstance(paths, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in paths.items()
    ):
        raise bad("'module_paths' must map initializer names to module paths")
    if not isinstance(record.base_model, str):
        raise bad(f"'base_model' must be a string, not {record.base_model!r}")


def write_record(record: HubRecord, artifact_directory: str | os.PathLike) -> Path:
    """Write ``record`` as ``hub.json`` in ``artifact_directory`` (atomically); return its path."""
    target = Path(artifact_directory) / HUB_RECORD
    with atomic_file(target) as temp:
        temp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
    return target


def has_record(artifact_directory: str | os.PathLike) -> bool:
    """Whether ``artifact_directory`` holds a ``hub.json``."""
    return (Path(artifact_directory) / HUB_RECORD).is_file()


def read_record(artifact_directory: str | os.PathLike) -> HubRecord:
    """The :class:`HubRecord` in ``artifact_directory``'s ``hub.json``, checked field by field.

    Raises:
        FileMissingError: when there is no ``hub.json`` (the set was not made by ``from_hub``).
        InvalidValueError: when the file is not a valid record; the message names the field.
    """
    path = Path(artifact_directory) / HUB_RECORD
    if not path.is_file():
        raise FileMissingError(
            f"{str(artifact_directory)!r} has no {HUB_RECORD}: it was not generated from a hub "
            "folder. Generate it with onnxblocks.hub.from_hub(hub_dir, artifact_directory)."
        )
    where = str(path)
    if path.stat().st_size > _MAX_BYTES:
        raise InvalidValueError(f"{where} is larger than {_MAX_BYTES} bytes: not a hub record.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidValueError(f"{where} is not JSON ({exc}); regenerate the artifacts.") from None
    if not isinstance(data, dict):
        raise InvalidValueError(f"{where} must hold a JSON object; regenerate the artifacts.")
    if data.get("version") != RECORD_VERSION:
        raise InvalidValueError(
            f"{where} has version {data.get('version')!r}; this onnxblocks reads version "
            f"{RECORD_VERSION}. Regenerate the artifacts with onnxblocks.hub.from_hub."
        )
    source = data.get("source")
    lists = {k: data.get(k, []) for k in ("past_inputs", "present_outputs")}
    for key, value in lists.items():
        if not isinstance(value, list):
            raise InvalidValueError(
                f"{where}: {key!r} must be a list of names. Regenerate the artifacts with "
                "onnxblocks.hub.from_hub."
            )
    record = object.__new__(HubRecord)
    values = {
        "source": Path(source) if isinstance(source, str) and source else source,
        "file": data.get("file"),
        "task": data.get("task"),
        "with_past": data.get("with_past", False),
        "past_inputs": tuple(lists["past_inputs"]),
        "present_outputs": tuple(lists["present_outputs"]),
        "module_paths": data.get("module_paths", {}),
        "base_model": data.get("base_model", ""),
    }
    for key, value in values.items():
        object.__setattr__(record, key, value)
    _check(record, where)
    return record

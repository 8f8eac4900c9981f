"""The way back to the Hub: a trained session written as a folder Transformers.js and transformers
load (docs/hub.md, "The way back").

The folder::

    config.json, generation_config.json, tokenizer files   copied from the hub folder
    onnx/model.onnx              the hub file's own graph and signature (with-past inputs and
                                 ``present.*`` outputs kept), trained weights written in
    onnx/model_quantized.onnx    dynamic int8 (``quantize`` has "q8"; Transformers.js ``q8``)
    onnx/model_q4.onnx           4-bit MatMulNBits (``quantize`` has "q4"; Transformers.js ``q4``)
    model.safetensors            the state dict under Hugging Face's names (``safetensors=True``)
    adapter_model.safetensors, adapter_config.json   LoRA kept apart (``merge_adapters=False``)

Trained weights travel by state-dict name (:mod:`onnxblocks.hub.state_dict_names`), so they can
be written into another export of the same model (``into``: the with-past file for weights trained
on the no-cache one, or the reverse), whose TorchScript names differ.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core.errors import (
    FileConflictError,
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
)
from onnxblocks._core.paths import as_path
from onnxblocks.artifacts.ties import untie
from onnxblocks.hub.quantize import QUANTIZED_FILES, quantize_q4, quantize_q8
from onnxblocks.hub.record import read_record
from onnxblocks.hub.state_dict_names import (
    StateName,
    state_dict_names,
    to_onnx_layout,
    to_state_layout,
)
from onnxblocks.io import save_model
from onnxblocks.ir.serde import from_proto
from onnxblocks.safetensors import read_safetensors, write_safetensors

__all__ = ["HUB_FILES", "INLINE_LIMIT", "export_hub", "hub_onnx_file"]

#: The files of a hub folder copied as they are (those present).
HUB_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "preprocessor_config.json",
)
#: Weights up to this many bytes stay inside ``model.onnx`` (protobuf's 2 GiB, less a margin for
#: the graph); above it they go to ``model.onnx_data``, the name Transformers.js fetches when
#: ``config.json``'s ``transformers.js_config.use_external_data_format`` names the file.
INLINE_LIMIT = 2**31 - 2**26
_STATE_FILE = "model.safetensors"


class _Session(Protocol):
    """What :func:`export_hub` uses of a :class:`~onnxblocks.runtime.TrainingSession`."""

    files: Any

    @property
    def lora(self) -> Any: ...

    def parameter_names(self) -> list[str]: ...

    def export_inference_model(
        self, path: str | os.PathLike, output_names: Sequence[str] | None = None, *,
        use_ema: bool = False, merge_adapters: bool = False,
    ) -> Path: ...  # fmt: skip

    def save_adapters(self, directory: str | os.PathLike) -> Path: ...


def hub_onnx_file(hub_dir: Path, file: str | None = None) -> Path:
    """The ONNX file of a hub folder: ``file`` (relative), else ``onnx/model.onnx``, else
    ``model.onnx``.

    Raises:
        FileMissingError: when none is there.
    """
    names = [file] if file else ["onnx/model.onnx", "model.onnx"]
    for name in names:
        if (hub_dir / name).is_file():
            return hub_dir / name
    raise FileMissingError(
        f"hub folder '{hub_dir}' has no {' or '.join(names)}: pass the folder Optimum or "
        "Transformers.js wrote (onnx/model.onnx inside)."
    )


def _check_quantize(quantize: Iterable[str]) -> tuple[str, ...]:
    if isinstance(quantize, str):
        raise InvalidTypeError(
            f"export_hub: quantize must be a tuple of names, not the str {quantize!r:.40}; "
            f"pass ({quantize!r},)."
        )
    chosen = tuple(quantize)
    unknown = [q for q in chosen if q not in QUANTIZED_FILES]
    if unknown:
        raise InvalidValueError(
            f"export_hub: unknown quantize {unknown!r:.80}; choose among "
            f"{sorted(QUANTIZED_FILES)} (or () for none)."
        )
    return chosen


def _state_shapes(hub_dir: Path) -> dict[str, np.ndarray] | None:
    path = hub_dir / _STATE_FILE
    return read_safetensors(path, widen_bf16=True)[0] if path.is_file() else None


def _graph_names(
    model: onnx.ModelProto, reference: Mapping[str, np.ndarray] | None
) -> dict[str, StateName]:
    shapes = None if reference is None else {k: tuple(v.shape) for k, v in reference.items()}
    return state_dict_names(from_proto(model).graph, shapes)


def _trained_state(
    session: _Session, merge: bool, source: Path, reference: Mapping[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], set[str]]:
    """The trained tensors by state-dict name (state layout), and the names that must be written."""
    info = session.lora
    if info is not None and not merge:
        return {}, set()
    with tempfile.TemporaryDirectory(prefix="onnxblocks-hub-") as tmp:
        # the source's first output (logits) reads every weight; present.* may not be eval outputs
        first = onnx.load(os.fspath(source), load_external_data=False).graph.output[0].name
        path = session.export_inference_model(
            Path(tmp) / "trained.onnx", [first], merge_adapters=merge and info is not None
        )
        model, _ = untie(onnx.load(os.fspath(path)))
    names = _graph_names(model, reference)
    values = {t.name: t for t in model.graph.initializer}
    trained = {
        state.name: to_state_layout(numpy_helper.to_array(values[name]), state)
        for name, state in names.items()
    }
    wanted = (
        [t.weight for t in info.targets.values()] if info is not None else session.parameter_names()
    )
    return trained, {names[w].name for w in wanted if w in names}


def _write_weights(
    model: onnx.ModelProto, trained: Mapping[str, np.ndarray], names: Mapping[str, StateName]
) -> set[str]:
    """Write ``trained`` into ``model``'s initializers (in place); the state names written."""
    written = set()
    for tensor in model.graph.initializer:
        state = names.get(tensor.name)
        if state is None or state.name not in trained:
            continue
        old = numpy_helper.to_array(tensor)
        new = to_onnx_layout(trained[state.name], state)
        if new.shape != old.shape:
            raise InvalidValueError(
                f"export_hub: trained '{state.name}' has shape {new.shape}, but '{tensor.name}' "
                f"of the hub file holds {old.shape}: the hub folder is another model's."
            )
        tensor.CopyFrom(numpy_helper.from_array(new.astype(old.dtype), tensor.name))
        written.add(state.name)
    return written


def _save_onnx(model: onnx.ModelProto, path: Path) -> bool:
    """Save inline when the weights fit, else with ``<name>_data``; True when external."""
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size <= INLINE_LIMIT:
        save_model(model, path, external_data_threshold=2**62)
        return False
    save_model(model, path, external_data_threshold=1024, location=f"{path.name}_data")
    return True


def _copy_hub_files(hub_dir: Path, out: Path, external: bool) -> None:
    for name in HUB_FILES:
        if (hub_dir / name).is_file():
            shutil.copyfile(hub_dir / name, out / name)
    config = out / "config.json"
    if external and config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        section = data.setdefault("transformers.js_config", {})
        section.setdefault("use_external_data_format", {})["model.onnx"] = True
        config.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _state_dict(
    reference: Mapping[str, np.ndarray] | None,
    model: onnx.ModelProto,
    names: Mapping[str, StateName],
) -> dict[str, np.ndarray]:
    values = {t.name: t for t in model.graph.initializer}
    from_model = {
        state.name: to_state_layout(numpy_helper.to_array(values[name]), state)
        for name, state in names.items()
    }
    if reference is None:
        return from_model
    return {
        key: from_model[key].astype(value.dtype) if key in from_model else value
        for key, value in reference.items()
    }


def _staging(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileConflictError(
            f"export_hub: '{out}' exists and is not an empty folder; pass a new folder or "
            "remove it first."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.onnxblocks-hub-", dir=out.parent))


def export_hub(
    session: _Session,
    out_dir: str | os.PathLike,
    *,
    quantize: Iterable[str] = ("q8",),
    safetensors: bool = True,
    merge_adapters: bool = True,
    into: str | os.PathLike | None = None,
    source: str | os.PathLike | None = None,
) -> Path:
    """Write ``session``'s trained model as a hub folder (see the module docstring).

    Args:
        session: The training session.
        out_dir: A new (or empty) folder; written whole or not at all.
        quantize: Quantized files to add: ``"q8"`` and/or ``"q4"``; ``()`` for none.
        safetensors: Write ``model.safetensors`` under Hugging Face's names.
        merge_adapters: LoRA artifacts: fold the adapters into the weights (True), or keep the
            base weights and write the adapters as a PEFT directory beside them (False).
        into: Another hub folder of the same model (the with-past export for weights trained on
            the no-cache one, or the reverse): its graph, signature and files are used.
        source: The hub folder the artifacts were made from; default the one their ``hub.json``
            names.

    Returns:
        ``out_dir``.

    Raises:
        FileMissingError: no hub folder is recorded or given, or it has no ONNX file.
        FileConflictError: ``out_dir`` exists and is not empty.
        InvalidValueError: an unknown ``quantize``, or a trained weight the target's graph does
            not hold (another model's folder).
    """
    chosen = _check_quantize(quantize)
    for flag, value in (("safetensors", safetensors), ("merge_adapters", merge_adapters)):
        if not isinstance(value, bool):
            raise InvalidTypeError(f"export_hub: {flag} must be True or False, not {value!r:.40}.")
    out = as_path(out_dir, "out_dir").absolute()
    if source is not None:
        hub, file = as_path(source, "source"), None
    else:
        record = read_record(session.files.directory)
        hub, file = record.check_source(), record.file
    target = as_path(into, "into") if into is not None else hub
    if out in (hub.absolute(), target.absolute()):
        raise FileConflictError(
            f"export_hub: out_dir '{out}' is the hub folder itself; pass a new folder."
        )
    source_file = hub_onnx_file(hub, file)
    target_file = hub_onnx_file(target, file if into is None else None)
    trained, required = _trained_state(session, merge_adapters, source_file, _state_shapes(hub))
    reference = _state_shapes(target)
    model, _ = untie(onnx.load(os.fspath(target_file)))
    names = _graph_names(model, reference)
    missing = sorted(required - _write_weights(model, trained, names))
    if missing:
        raise InvalidValueError(
            f"export_hub: {len(missing)} trained weight(s) have no place in '{target_file}' (e.g. "
            f"{missing[:3]}); is '{target}' an export of the model of '{source_file}'?"
        )
    staging = _staging(out)
    try:
        (staging / "onnx").mkdir()
        written = staging / "onnx" / "model.onnx"
        external = _save_onnx(model, written)
        _copy_hub_files(target, staging, external)
        if "q8" in chosen:
            quantize_q8(written, staging / "onnx" / QUANTIZED_FILES["q8"], external)
        if "q4" in chosen:
            _save_onnx(quantize_q4(model), staging / "onnx" / QUANTIZED_FILES["q4"])
        if safetensors:
            write_safetensors(
                staging / _STATE_FILE, _state_dict(reference, model, names), {"format": "pt"}
            )
        if session.lora is not None and not merge_adapters:
            session.save_adapters(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out

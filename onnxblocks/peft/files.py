"""PEFT adapter directories: ``adapter_model.safetensors`` and ``adapter_config.json``, without
torch or peft.

``peft.PeftModel.from_pretrained(base_model, directory)`` loads what :func:`write_adapters`
writes, and :func:`read_adapters` reads what ``PeftModel.save_pretrained(directory)`` writes.
The tensors are PEFT's: ``base_model.model.<module>.lora_A.weight`` (``[r, in_features]``) and
``base_model.model.<module>.lora_B.weight`` (``[out_features, r]``) for every adapted module
(PEFT drops the adapter's name, ``default``, when it saves); the config is
:meth:`LoraConfig.to_peft_dict`. Nothing in a file is trusted: the safetensors header is
checked by :func:`onnxblocks.safetensors.read_safetensors`, then every tensor's name, dtype,
shape and values against the model's targets, and the config against the model's
(:func:`check_compatible`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    NotAFolderError,
    did_you_mean,
    preview,
)
from onnxblocks.io import atomic_outputs
from onnxblocks.peft.config import LoraConfig
from onnxblocks.peft.info import LoraInfo
from onnxblocks.safetensors import read_safetensors, write_safetensors

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "check_compatible",
    "peft_key",
    "read_adapters",
    "write_adapters",
]

#: The adapters' file in a PEFT directory.
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: The config's file in a PEFT directory.
ADAPTER_CONFIG_FILE = "adapter_config.json"
#: What PEFT puts before a module path in its saved keys (``PeftModel`` wraps ``LoraModel`` wraps
#: the model).
_KEY_PREFIX = "base_model.model."
#: Dtypes a PEFT file may store adapters in; they are read as float32 (the adapters' dtype in
#: onnxblocks).
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))


def peft_key(module: str, which: str) -> str:
    """The key PEFT saves an adapter under: ``base_model.model.<module>.lora_<which>.weight``.

    Args:
        module: The torch module path (``model.layers.0.self_attn.q_proj``).
        which: ``"A"`` or ``"B"``.

    Returns:
        The key.
    """
    return f"{_KEY_PREFIX}{module}.lora_{which}.weight"


def _keys(info: LoraInfo) -> dict[str, tuple[str, tuple[int, int]]]:
    """PEFT key -> (adapter initializer name, shape) for every adapter of ``info``."""
    r = info.config.r
    out: dict[str, tuple[str, tuple[int, int]]] = {}
    for module, target in info.targets.items():
        out[peft_key(module, "A")] = (target.lora_A, (r, target.in_features))
        out[peft_key(module, "B")] = (target.lora_B, (target.out_features, r))
    return out


def write_adapters(
    directory: str | os.PathLike, info: LoraInfo, adapters: Mapping[str, np.ndarray]
) -> Path:
    """Write a PEFT adapter directory: ``adapter_model.safetensors`` and ``adapter_config.json``.

    Both files are written beside their destinations and renamed into place (the weights first),
    so an interrupted save leaves the directory as it was.

    Args:
        directory: The directory (created if missing, with its parents).
        info: The model's LoRA record (:func:`onnxblocks.peft.lora_info`).
        adapters: The current adapters by initializer name (``info``'s ``lora_A`` / ``lora_B``
        names).

    Returns:
        The directory.

    Raises:
        UnknownNameError: if an adapter of ``info`` is missing from ``adapters``.
        InvalidValueError: for an adapter of the wrong shape, or a path that is a file.
    """
    target = Path(os.fspath(directory))
    if target.exists() and not target.is_dir():
        raise NotAFolderError(
            f"Cannot write PEFT adapters to '{target}': it is a file. Pass a directory."
        )
    tensors: dict[str, np.ndarray] = {}
    for key, (name, shape) in _keys(info).items():
        if name not in adapters:
            raise InvalidValueError(
                f"write_adapters: no value for adapter '{name}' (module key '{key}'); pass every "
                "adapter of the model."
            )
        array = np.ascontiguousarray(adapters[name], dtype=np.float32)
        if array.shape != shape:
            raise InvalidValueError(
                f"adapter '{name}' has shape {list(array.shape)}; the model needs {list(shape)}."
            )
        tensors[key] = array
    config = json.dumps(info.config.to_peft_dict(), indent=2, sort_keys=True) + "\n"
    target.mkdir(parents=True, exist_ok=True)
    with atomic_outputs(target / ADAPTER_WEIGHTS_FILE, target / ADAPTER_CONFIG_FILE) as (
        weights,
        config_file,
    ):
        write_safetensors(
            weights, tensors, metadata={"format": "pt"}
        )  # PEFT's files carry {"format": "pt"}
        config_file.write_text(config, encoding="utf-8")
    return target


def check_compatible(config: LoraConfig, info: LoraInfo, where: str) -> None:
    """Refuse a PEFT config whose adapters do not fit the model's (rank, scale).

    ``target_modules`` may differ in form (a list, a regex): the adapters present in the
    weights file are checked against the model's targets one by one instead.

    Raises:
        InvalidValueError: for another ``r`` or another scale ``lora_alpha / r`` (the message names
        both).
    """
    own = info.config
    if config.r != own.r:
        raise InvalidValueError(
            f"{where}: the adapters have rank r={config.r}, the model's have r={own.r}. Generate "
            "the artifacts "
            f"with LoraConfig(r={config.r}, ...) to use them."
        )
    if not np.isclose(config.scaling, own.scaling, rtol=1e-6, atol=0.0):
        raise InvalidValueError(
            f"{where}: the adapters' scale lora_alpha / r is {config.lora_alpha} / {config.r} = "
            f"{config.scaling:g}, "
            f"the model's {own.lora_alpha} / {own.r} = {own.scaling:g}. Generate the artifacts "
            "with "
            f"LoraConfig(lora_alpha={config.lora_alpha}, ...) to use them."
        )


def read_adapters(directory: str | os.PathLike, info: LoraInfo) -> dict[str, np.ndarray]:
    """Read a PEFT adapter directory for a model with LoRA adapters, checking it against the model.

    Args:
        directory: A directory holding ``adapter_config.json`` and ``adapter_model.safetensors``
            (as ``PeftModel.save_pretrained`` or :func:`write_adapters` write them).
        info: The model's LoRA record.

    Returns:
        The adapters by initializer name (``info``'s ``lora_A`` / ``lora_B`` names), float32.

    Raises:
        FileMissingError: if the directory or one of its two files is missing.
        InvalidValueError: for a config onnxblocks does not support or that does not fit the model,
            a missing, unknown or misshapen tensor, or non-finite values (the message names the file
            and the tensor).
        InvalidTypeError: for a tensor that is not floating point.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise InvalidTypeError(
            f"directory must be a str or os.PathLike, not {type(directory).__name__}."
        )
    folder = Path(os.fspath(directory))
    if not folder.is_dir():
        if folder.exists():
            raise NotAFolderError(
                f"'{folder}' is a file; pass the PEFT adapter directory that holds it."
            )
        raise FileMissingError(
            f"No PEFT adapter directory at '{folder}'. Pass a directory written by save_adapters "
            "or "
            "PeftModel.save_pretrained."
        )
    config_path, weights_path = folder / ADAPTER_CONFIG_FILE, folder / ADAPTER_WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            extra = (
                " (adapter_model.bin, torch's pickle, is not read: save with "
                "safe_serialization=True)"
            )
            raise FileMissingError(
                f"'{folder}' has no {path.name}{extra if path == weights_path else ''}; a PEFT "
                "adapter directory "
                f"holds {ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE}."
            )
    config = LoraConfig.from_json_file(
        config_path
    )  # refuses the options onnxblocks does not support
    check_compatible(config, info, f"'{config_path}'")
    tensors, _ = read_safetensors(
        weights_path, widen_bf16=True
    )  # checks the header, offsets and dtypes
    expected = _keys(info)
    stored = {_without_adapter_name(key): key for key in tensors}
    unknown = [key for key in stored if key not in expected]
    if unknown:
        raise InvalidValueError(
            f"'{weights_path}' holds tensors the model has no adapter for: {preview(unknown)}."
            f"{did_you_mean(unknown[0], list(expected))} The model's adapters are "
            f"{preview(list(expected))}; "
            "train the adapters on the same modules (target_modules) as the artifacts."
        )
    missing = [key for key in expected if key not in stored]
    if missing:
        raise InvalidValueError(
            f"'{weights_path}' lacks the adapters of {len(missing)} module(s) the model adapts: "
            f"{preview(missing)}. "
            "Generate the artifacts with the target_modules the adapters were trained on."
        )
    out: dict[str, np.ndarray] = {}
    for key, (name, shape) in expected.items():
        array = tensors[stored[key]]
        if array.dtype not in _FLOAT_DTYPES:
            raise InvalidTypeError(
                f"'{weights_path}': tensor '{stored[key]}' is {array.dtype}; adapters are "
                "floating point "
                "(F32, F16, BF16 or F64)."
            )
        if array.shape != shape:
            raise InvalidValueError(
                f"'{weights_path}': tensor '{stored[key]}' has shape {list(array.shape)}; the "
                "model's adapter "
                f"'{name}' is {list(shape)} (lora_A is [r, in_features], lora_B [out_features, r])."
            )
        if not np.isfinite(array).all():
            raise InvalidValueError(
                f"'{weights_path}': tensor '{stored[key]}' holds NaN or infinite values."
            )
        out[name] = np.ascontiguousarray(array, dtype=np.float32)
    return out


def _without_adapter_name(key: str) -> str:
    """``...lora_A.default.weight`` (an adapter's name kept in the key) -> ``...lora_A.weight``."""
    for which in ("lora_A", "lora_B"):
        marker = f".{which}."
        at = key.rfind(marker)
        if at >= 0 and key.endswith(".weight") and key.count(".", at + len(marker)) == 1:
            return key[: at + len(marker)] + "weight"
    return key

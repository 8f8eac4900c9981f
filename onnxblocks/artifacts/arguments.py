"""Checking :func:`~onnxblocks.artifacts.generate_artifacts`' arguments by type and value, before
any work.

Each check raises the builtin exception that fits (``TypeError`` for a wrong
kind, ``ValueError`` for a wrong value, ``FileNotFoundError``,
``IsADirectoryError``, ``NotADirectoryError``, ``PermissionError`` for paths)
with a message naming the parameter and what to pass instead. Paths go through
:mod:`onnxblocks._core.paths`, so the artifact directory is known to be
writable before the gradient is built.
"""

from __future__ import annotations

import enum
import os
import stat
import warnings
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxblocks._core import paths as _paths
from onnxblocks._core import weights as _weights
from onnxblocks._core.contracts import ArtifactNames
from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
    NotAFolderError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.ir import wellformed
from onnxblocks.peft.config import LoraConfig
from onnxblocks.peft.info import lora_info
from onnxblocks.peft.transform import apply_lora

if TYPE_CHECKING:
    from onnxblocks.artifacts.ties import Tie
    from onnxblocks.portable.ops import PortableMode

#: Longest file name (bytes) most file systems take.
NAME_MAX = 255
#: Start of the names of the staging directories (a prefix may not start so: they would be taken for
#: one).
RESERVED_PREFIX = ".onnxblocks-artifacts"


def load_model(model: Any, model_path: Any = None) -> tuple[onnx.ModelProto, str | None]:
    """The base model, and the file its external data is relative to.

    A path is loaded without its large weights (they stay in the file, read in chunks when needed).

    Raises:
        TypeError: for a model that is neither a ModelProto nor a path, or a bad ``model_path``.
        FileNotFoundError, IsADirectoryError, NotADirectoryError: for a model path that is no file.
        ValueError: for a file that is not a regular file or not an ONNX model (naming it), or a
            model that defines a value twice or reads one never defined (naming it and the value).
    """
    if model_path is not None:
        model_path = os.fspath(_paths.as_path(model_path, "model_path"))
        if os.path.isdir(model_path):
            raise IsAFolderError(
                f"model_path '{model_path}' is a directory; pass the .onnx file the model was "
                "loaded from."
            )
    if isinstance(model, onnx.ModelProto):
        wellformed.check_model(
            model, model_path
        )  # before any reader: a value defined twice, or never
        return model, model_path
    if isinstance(model, (bytes, bytearray)):
        raise InvalidTypeError(
            "model must be an onnx.ModelProto or the path of an .onnx file, not bytes: parse "
            "serialized bytes "
            "first with onnx.load_from_string(data)."
        )
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidTypeError(
            "model must be an onnx.ModelProto or the path of an .onnx file, not "
            f"{type(model).__name__}."
        )
    path = os.fspath(_paths.as_path(model, "model"))
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileMissingError(f"Model file '{path}' does not exist.") from None
    except NotADirectoryError:
        raise NotAFolderError(
            f"Model file '{path}' cannot exist: a directory on its path is a file."
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise IsAFolderError(f"model '{path}' is a directory; pass the .onnx file inside it.")
    if not stat.S_ISREG(info.st_mode):
        raise InvalidValueError(
            f"model '{path}' is not a regular file (a pipe or device?); pass an .onnx file."
        )
    try:
        loaded = _weights.load_structure(path)
    except (OSError, MemoryError, ValueError):
        raise
    except Exception as exc:  # protobuf's DecodeError and the like, whatever their type
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidValueError(
            f"'{path}' is not a valid ONNX model file ({detail}). Check that the file is complete."
        ) from None
    wellformed.check_model(loaded, path)
    return loaded, path


def names(argument: str, values: Sequence[str] | None) -> list[str]:
    """A list of value names (a str alone is refused: it would be split into characters).

    Raises:
        TypeError: for a str, a non-collection, or an element that is not a str.
        ValueError: for an empty name.
    """
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, (list, tuple, Mapping, Set)):
        raise InvalidTypeError(
            f"{argument} must be a list of names, not {type(values).__name__}: {values!r}. Pass "
            f"e.g. [{values!r}]."
            if isinstance(values, str)
            else f"{argument} must be a list of names, not {type(values).__name__}."
        )
    out = list(values)
    for n in out:
        if not isinstance(n, str):
            raise InvalidTypeError(
                f"{argument} must contain names (str), not {type(n).__name__}: {n!r}."
            )
        if not n:
            raise InvalidValueError(
                f"{argument} contains an empty name; every value of a model has a non-empty name."
            )
    return out


def check_prefix(prefix: Any) -> None:
    """Check that ``prefix`` makes valid file names.

    Raises:
        TypeError: if it is not a str.
        ValueError: for a path separator, a NUL character, a name too long for the file
            system, or the start of onnxblocks' staging directories' names.
    """
    if not isinstance(prefix, str):
        raise InvalidTypeError(f"prefix must be a str, not {type(prefix).__name__}: {prefix!r}.")
    if any(sep and sep in prefix for sep in (os.sep, os.altsep)):
        raise InvalidValueError(
            f"prefix {prefix!r} contains a path separator; put the directory in "
            "artifact_directory instead."
        )
    if "\0" in prefix:
        raise InvalidValueError(
            f"prefix {prefix!r} holds a NUL character, which no file name can; remove it."
        )
    longest = max(len(os.fsencode(n)) for n in ArtifactNames("").owned())
    size = len(os.fsencode(prefix))
    if size + longest > NAME_MAX:
        raise InvalidValueError(
            f"prefix {prefix[:40]!r}... is {size} bytes long; with the longest artifact name it "
            "needs "
            f"({longest} bytes) the file names would exceed {NAME_MAX} bytes. Use a prefix of at "
            "most "
            f"{NAME_MAX - longest} bytes."
        )
    if prefix.startswith(RESERVED_PREFIX):
        raise InvalidValueError(
            f"prefix {prefix!r} starts like the names of onnxblocks' staging directories "
            f"({RESERVED_PREFIX!r}); "
            "choose another prefix."
        )


def flag(argument: str, value: Any) -> bool:
    """A bool argument (numpy's bool too).

    Raises:
        TypeError: for anything else (a string like "false" would count as true).
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidTypeError(
        f"{argument} must be True or False, not {type(value).__name__}: {value!r}."
    )


def library(value: Any) -> list[str]:
    """The custom op library as a list of zero or one path, checked to be an existing file.

    Raises:
        TypeError, ValueError: for a value that is not a path.
        FileNotFoundError, IsADirectoryError: for a path that is not a file.
    """
    if value is None:
        return []
    path = _paths.as_path(value, "custom_op_library")
    if path.is_dir():
        raise IsAFolderError(
            f"custom_op_library '{path}' is a directory; pass the shared library file."
        )
    if not path.is_file():
        raise FileMissingError(
            f"Custom op library '{path}' does not exist. Pass the path of the compiled shared "
            "library "
            "(.so/.dll/.dylib) that registers your custom ops."
        )
    return [os.fspath(path)]


def directory(value: Any) -> Path:
    """The artifact directory (default: the working directory), checked to be creatable and
    writable.

    Raises:
        TypeError, ValueError: for a value that is not a path, or a name too long.
        NotADirectoryError: if it (or a parent) is a file.
        PermissionError: if it (or its nearest existing parent) is not writable.
    """
    if value is None:
        return Path.cwd()
    return _paths.check_output_dir(value, "artifact_directory")


def portable_mode(portable: Any) -> PortableMode:
    """The portable mode ``generate_artifacts(portable=...)`` asks for (``True`` -> ``"standard"``).

    Raises:
        InvalidValueError: for anything but True, ``"standard"`` or ``"onnxruntime"``.
    """
    from onnxblocks.portable.ops import portable_mode as mode  # a lower layer, loaded on first use

    return mode(portable, "portable")


def with_lora(model: onnx.ModelProto, config: Any) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``model`` with the LoRA adapters of ``generate_artifacts(lora=config)``, and its adapters'
    names.

    Without ``config``, the model itself and the adapters it already carries (none for most models).

    Raises:
        TypeError: for a ``config`` that is neither a :class:`~onnxblocks.peft.LoraConfig` nor None.
    """
    if config is not None and not isinstance(config, LoraConfig):
        raise InvalidTypeError(
            f"lora must be an onnxblocks.peft.LoraConfig or None, not {type(config).__name__}: "
            "pass lora=LoraConfig(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'])."
        )
    if config is not None:
        model = apply_lora(model, config)
    info = lora_info(model)
    quantized_ops = {"MatMulNBits", "MatMulInteger", "DequantizeLinear"}
    if info is None and any(n.op_type in quantized_ops for n in model.graph.node):
        # full fine-tuning of a quantized file: its weights cannot train (loaded on first use)
        from onnxblocks.peft.quantized import refuse_full_fine_tuning

        refuse_full_fine_tuning(model)
    return model, info.adapter_names if info is not None else ()


def same_named_enum(value: Any, enum_type: type[enum.Enum]) -> Any:
    """Accept the reference's LossType/OptimType members (same names) as ours."""
    if (
        isinstance(value, enum.Enum)
        and not isinstance(value, enum_type)
        and type(value).__name__ == enum_type.__name__
    ):
        if value.name not in enum_type.__members__:
            raise InvalidValueError(
                f"{enum_type.__name__}.{value.name} is not "
                f"supported.{did_you_mean(value.name, enum_type.__members__)}"
            )
        return enum_type[value.name]
    return value


def exporter_ties(
    model: onnx.ModelProto, untie: Any, requires: list[str], frozen: list[str]
) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """The model and parameter names of ``generate_artifacts(untie=...)`` (see
    :mod:`onnxblocks.artifacts.ties`).

    With ``untie``, a copy of the model in which each module of an exporter's tie reads its own
    copy, the
    copies trained (or frozen) as the initializer they copy. Without it, the model itself, and a
    warning when a parameter that trains is an exporter's tie.

    Raises:
        TypeError: for an ``untie`` that is not a bool.
        UnknownNameError: for a name that is a module's part of an exporter's tie, without
        ``untie``.
    """
    from onnxblocks.artifacts import ties as _ties  # the IR, loaded when a model is generated

    if not flag("untie", untie):
        if requires or frozen:
            _warn_ties([t for t in _ties.find_ties(model) if not t.by_model], requires, frozen)
        return model, requires, frozen
    model, undone = _ties.untie(model)
    for tie in undone:
        for names in (requires, frozen):
            if tie.initializer in names:
                names.extend(c for c in tie.copies if c not in names)
    return model, requires, frozen


def _warn_ties(found: list[Tie], requires: list[str], frozen: list[str]) -> None:
    copies = {copy: tie for tie in found for copy in tie.copies}
    asked = [n for n in [*requires, *frozen] if n in copies]
    if asked:
        tie = copies[asked[0]]
        raise UnknownNameError(
            f"'{asked[0]}' is not an initializer of the model: the exporter merged it into "
            f"'{tie.initializer}', "
            f"which {', '.join(tie.modules)} all read. Pass untie=True (CLI: --untie) to give "
            "each module its own "
            "copy, named after the module."
        )
    trained = [t.describe() for t in found if t.initializer in set(requires)]
    if trained:
        warnings.warn(
            "Trainable parameters that several modules read, because the exporter merged "
            "identical initializers "
            f"(freshly initialized norm weights and biases are equal): {preview(trained, 4)}. "
            "Training ties them: "
            "one value and one gradient for all those modules, where torch trains one per "
            "module. Pass "
            "untie=True (CLI: --untie) to give each module its own copy (docs/training.md, "
            '"Weights the exporter '
            'tied").',
            UserWarning,
            stacklevel=5,
        )

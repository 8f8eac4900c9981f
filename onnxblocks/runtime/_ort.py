"""Lazy access to ONNX Runtime's C bindings for the runtime, and its errors made readable.

Nothing here imports onnxruntime at module import time: ``import onnxblocks``
must stay fast. Only ``onnxruntime.capi._pybind_state`` is used, never
``onnxruntime.training`` (which imports torch). Error messages are read by
:mod:`onnxblocks._core.ort_errors`; :func:`clean_message`, :func:`is_ort_error`
and :func:`is_input_error` are its functions, under the names the runtime and
the command line use.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from onnxblocks._core.errors import InvalidValueError
from onnxblocks._core.ort_errors import (
    INPUT_ERROR_CLASSES,
    clean_message,
    is_input_error,
    is_ort_error,
    run_error,
)

__all__ = [
    "INPUT_ERROR_CLASSES",
    "NO_CONSTANT_FOLDING",
    "NO_PREPACKING",
    "capi",
    "clean_message",
    "has_training_build",
    "is_input_error",
    "is_ort_error",
    "make_device",
    "onnxruntime",
    "providers",
    "require_training_build",
    "run_error",
    "run_options",
    "session_options",
]


def capi() -> ModuleType:
    """Import and return ``onnxruntime.capi._pybind_state`` (done once, on first use)."""
    from onnxblocks._core.ort import capi as _capi

    return _capi()


def onnxruntime() -> ModuleType:
    """Import and return the ``onnxruntime`` package (without its torch probe)."""
    from onnxblocks._core.ort import onnxruntime as _onnxruntime

    return _onnxruntime()


def has_training_build() -> bool:
    """True when the installed onnxruntime is the training build (it has the training API's
    bindings).
    """
    from onnxblocks._core.ort import has_training_build as _has

    return _has()


def require_training_build(what: str) -> ModuleType:
    """The C bindings, or :class:`~onnxblocks.errors.TrainingBuildRequiredError` on stock
    onnxruntime.
    """
    from onnxblocks._core.ort import require_training_build as _require

    return _require(what)


#: Session config entries: no pre-packed copy of constant MatMul weights; no constant folding.
NO_PREPACKING = ("session.disable_prepacking", "1")
NO_CONSTANT_FOLDING = ("optimization.disable_specified_optimizers", "ConstantFolding")


def session_options(runs: bool = False, *, prepack: bool = True, frozen_base: bool = False) -> Any:
    """A ``SessionOptions`` at the log level onnxblocks uses (errors only, unless asked; see
    ``_core.ort``).

    Args:
        runs: The session's own logger also logs its runs (see ``_core.ort.session_options``).
        prepack: False: ONNX Runtime keeps no pre-packed copy of the constant MatMul weights (a
            second copy of the frozen base per session; its memory-mapped bytes are read instead).
        frozen_base: The models read a frozen base (``base_weights.bin``, memory-mapped by ONNX
            Runtime): constant folding is turned off, as it would write a new copy of every base
            weight a node transforms (a ``Transpose`` of a tied embedding, the ``Cast`` of a float16
            base back to float32) into each session, and take seconds to do so. The memory pattern
            is turned off too: with dynamic batch and sequence, stock ONNX Runtime 1.32 planned
            1.9 GiB more for one step of a 30-layer LoRA model with it, and stepped slower
            (``benchmarks/bench_lora.py``, docs/lora.md).
    """
    from onnxblocks._core.ort import session_options as _options

    options = _options(runs)
    if not prepack:
        options.add_session_config_entry(*NO_PREPACKING)
    if frozen_base:
        options.add_session_config_entry(*NO_CONSTANT_FOLDING)
        options.enable_mem_pattern = False
    return options


def run_options() -> Any:
    """A ``RunOptions`` at the log level onnxblocks uses for runs (see ``_core.ort``)."""
    from onnxblocks._core.ort import run_options as _options

    return _options()


def providers(device: str) -> list[str]:
    """The execution providers of an ``InferenceSession`` on ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:N"``).

    Raises:
        ValueError: for a device string that is neither cpu nor cuda[:N].
    """
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise InvalidValueError(f"Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")
    return (
        ["CPUExecutionProvider"]
        if kind == "cpu"
        else ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )


def make_device(device: str) -> Any:
    """Build the ``OrtDevice`` for ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        ValueError: for a device string that is neither cpu nor cuda[:N].
    """
    C = capi()
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise InvalidValueError(f"Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")
    device_type = C.OrtDevice.cpu() if kind == "cpu" else C.OrtDevice.cuda()
    return C.OrtDevice(device_type, C.OrtDevice.default_memory(), int(index or 0))

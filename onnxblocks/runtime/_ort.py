"""Lazy access to ONNX Runtime's C bindings, and turning their errors into readable ones.

Nothing here imports onnxruntime at module import time: ``import onnxblocks``
must stay fast. Only ``onnxruntime.capi._pybind_state`` is used, never
``onnxruntime.training`` (which imports torch).
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

#: Names of ONNX Runtime exception classes that mean "your model or input is wrong".
INPUT_ERROR_CLASSES = frozenset(
    {"InvalidArgument", "NoSuchFile", "NoModel", "InvalidProtobuf", "InvalidGraph", "NotImplemented"}
)

_SOURCE_PREFIX = re.compile(r"^\s*/?[\w./-]*onnxruntime[\w./-]*\.(?:cc|h|cpp):\d+\s+.*?\)\s*")
_STATUS_PREFIX = re.compile(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*")


def capi() -> ModuleType:
    """Import and return ``onnxruntime.capi._pybind_state`` (done once, on first use)."""
    from onnxblocks._core.ort import capi as _capi

    return _capi()


def make_device(device: str) -> Any:
    """Build the ``OrtDevice`` for ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        ValueError: for a device string that is neither cpu nor cuda[:N].
    """
    C = capi()
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(f"Unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")
    device_type = C.OrtDevice.cpu() if kind == "cpu" else C.OrtDevice.cuda()
    return C.OrtDevice(device_type, C.OrtDevice.default_memory(), int(index or 0))


def clean_message(exc: BaseException) -> str:
    """An ONNX Runtime error message without its C++ source location, on one line."""
    text = " ".join(str(exc).split())
    text = _SOURCE_PREFIX.sub("", text)
    text = _STATUS_PREFIX.sub("", text)
    return text.strip()


def is_ort_error(exc: BaseException) -> bool:
    """True when ``exc`` was raised by ONNX Runtime's bindings."""
    return type(exc).__module__.startswith("onnxruntime")


def is_input_error(exc: BaseException) -> bool:
    """True for ONNX Runtime errors that blame the model or the input rather than the runtime."""
    return is_ort_error(exc) and type(exc).__name__ in INPUT_ERROR_CLASSES

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

from onnxblocks._core.ort_errors import INPUT_ERROR_CLASSES, clean_message, is_input_error, is_ort_error

__all__ = ["INPUT_ERROR_CLASSES", "capi", "clean_message", "is_input_error", "is_ort_error", "make_device"]


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

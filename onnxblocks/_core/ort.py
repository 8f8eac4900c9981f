"""The one place onnxblocks imports ONNX Runtime from, lazily.

``import onnxruntime`` (training build) runs a package check that imports
``onnxruntime.training.ortmodule`` and with it torch whenever torch is installed:
1.4-2.8 s and ~200 MB that onnxblocks never uses (it only needs the C bindings).
:func:`onnxruntime` imports the package with that probe answered "not present"
(exactly what the check reports on a machine without torch), then removes the
guard, so a later ``import onnxruntime.training`` by the user still works.
"""

from __future__ import annotations

import sys
from types import ModuleType

_PROBE = "onnxruntime.training.ortmodule"


def onnxruntime() -> ModuleType:
    """Import and return the ``onnxruntime`` package without its torch-importing probe."""
    if "onnxruntime" in sys.modules:
        return sys.modules["onnxruntime"]
    guarded = _PROBE not in sys.modules
    if guarded:
        sys.modules[_PROBE] = None  # type: ignore[assignment]  # None makes the import fail; typeshed allows modules only
    try:
        import onnxruntime as ort
    finally:
        if guarded and sys.modules.get(_PROBE, 0) is None:
            del sys.modules[_PROBE]
    return ort


def capi() -> ModuleType:
    """Import and return ``onnxruntime.capi._pybind_state``, the C bindings onnxblocks drives."""
    onnxruntime()
    from onnxruntime.capi import _pybind_state

    return _pybind_state

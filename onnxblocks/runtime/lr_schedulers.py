"""The import path ``onnxblocks.runtime.lr_schedulers``, kept for one release: the schedules live in
:mod:`onnxblocks.runtime.schedules` (one module per concept), and each name read here warns with a
DeprecationWarning naming that import.
"""

from __future__ import annotations

from onnxblocks._core.moved import moved_names
from onnxblocks.runtime import schedules as _schedules

_NAMES = frozenset(
    (
        "CosineAnnealingLR",
        "ExponentialLR",
        "LambdaLR",
        "LinearLR",
        "MultiStepLR",
        "OneCycleLR",
        "ReduceLROnPlateau",
        "SequentialLR",
        "StepLR",
    )
)


__getattr__ = moved_names(
    __name__,
    _NAMES,
    "onnxblocks.runtime.schedules",
    lambda name: getattr(_schedules, name),
)

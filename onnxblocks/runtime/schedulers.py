"""The import path ``onnxblocks.runtime.schedulers``, kept for one release: the schedules live in
:mod:`onnxblocks.runtime.schedules` (one module per concept), and each name read here warns with a
DeprecationWarning naming that import.
"""

from __future__ import annotations

from onnxblocks._core.moved import moved_names
from onnxblocks.runtime import schedules as _schedules
from onnxblocks.runtime.schedules import warmup as _warmup

_NAMES = frozenset(
    (
        "ConstantSchedule",
        "CosineSchedule",
        "LinearSchedule",
        "SCHEDULES",
        "Schedule",
        "StepSchedule",
        "make_schedule",
        "schedule_from_dict",
    )
)


__getattr__ = moved_names(
    __name__,
    _NAMES,
    "onnxblocks.runtime.schedules",
    lambda name: getattr(_warmup if name in _schedules.WARMUP_ALIASES else _schedules, name),
)

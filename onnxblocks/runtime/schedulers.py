"""The import path ``onnxblocks.runtime.schedulers``, kept for one release: the schedules live in
:mod:`onnxblocks.runtime.schedules` (one module per concept), and each name read here warns with a
DeprecationWarning naming that import.
"""

from __future__ import annotations

import warnings
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} is deprecated: import it from onnxblocks.runtime.schedules.",
        DeprecationWarning,
        stacklevel=2,
    )
    home = _warmup if name in _schedules.WARMUP_ALIASES else _schedules
    return getattr(home, name)

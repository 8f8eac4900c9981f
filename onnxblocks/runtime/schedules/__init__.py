"""Learning-rate schedules with ``torch.optim.lr_scheduler``'s names, arguments and numbers.

A :class:`Schedule` is a pure function of the optimizer steps taken
(:mod:`~onnxblocks.runtime.schedules.schedule`); the torch-named family lives in
:mod:`~onnxblocks.runtime.schedules.decay` and :mod:`~onnxblocks.runtime.schedules.sequence`, and
:class:`ReduceLROnPlateau`, which follows a metric instead, in
:mod:`~onnxblocks.runtime.schedules.plateau`. The warmup family (``ConstantSchedule``,
``LinearSchedule``, ``CosineSchedule``, ``StepSchedule``) resolves here for one release, with a
DeprecationWarning naming its torch-named equivalent (docs/runtime.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from onnxblocks.runtime.schedules import warmup as _warmup
from onnxblocks.runtime.schedules.decay import (
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    StepLR,
)
from onnxblocks.runtime.schedules.plateau import ReduceLROnPlateau
from onnxblocks.runtime.schedules.schedule import SCHEDULES as SCHEDULES
from onnxblocks.runtime.schedules.schedule import Schedule, schedule_from_dict
from onnxblocks.runtime.schedules.sequence import SequentialLR
from onnxblocks.runtime.schedules.warmup import make_schedule

#: The warmup family's names and the torch-named schedule that replaces each.
WARMUP_ALIASES = {
    "ConstantSchedule": "ExponentialLR(base_lr, gamma=1.0) (a warmup: SequentialLR with LinearLR)",
    "LinearSchedule": "LinearLR(base_lr, start_factor=1.0, end_factor=end_lr / base_lr, "
    "total_iters=total_steps)",
    "CosineSchedule": "CosineAnnealingLR(base_lr, T_max=total_steps, eta_min=min_lr)",
    "StepSchedule": "StepLR(base_lr, step_size, gamma), the same schedule",
}


def deprecated_alias(module: str, name: str) -> Any:
    """The warmup-family class ``name``, with a DeprecationWarning naming its replacement."""
    warnings.warn(
        f"{module}.{name} is deprecated: use onnxblocks.runtime.{WARMUP_ALIASES[name]}.",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(_warmup, name)


def __getattr__(name: str) -> Any:
    if name in WARMUP_ALIASES:
        return deprecated_alias(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "Schedule",
    "SequentialLR",
    "StepLR",
    "make_schedule",
    "schedule_from_dict",
]

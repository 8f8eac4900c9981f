"""Torch-free training runtime: sessions, the fit loop, schedules, progress and plots.

A session runs on the training build's training engine (C bindings of
``onnxruntime-training``) or, for portable artifacts, on plain inference
sessions of any onnxruntime (see :mod:`onnxblocks.runtime.backend`); onnxruntime
is imported on first use. Importing this package imports neither onnxruntime nor torch.
"""

from typing import Any

from onnxblocks.runtime.callbacks import Accuracy, Callback, EarlyStopping, SaveCheckpoint
from onnxblocks.runtime.data import ArrayBatches, load_npz
from onnxblocks.runtime.ema import WeightEMA
from onnxblocks.runtime.fit import FitRun, History, evaluate, fit, resume
from onnxblocks.runtime.inputs import InputSpec
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.plot import plot_history, save_line_plot
from onnxblocks.runtime.progress import ProgressBar
from onnxblocks.runtime.schedules import (
    WARMUP_ALIASES,
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    ReduceLROnPlateau,
    Schedule,
    SequentialLR,
    StepLR,
    deprecated_alias,
    make_schedule,
    schedule_from_dict,
)
from onnxblocks.runtime.session import TrainingSession


def __getattr__(name: str) -> Any:
    # the warmup family resolves for one release, warning with its torch-named equivalent
    if name in WARMUP_ALIASES:
        return deprecated_alias(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Accuracy",
    "ArrayBatches",
    "ArtifactFiles",
    "Callback",
    "CosineAnnealingLR",
    "EarlyStopping",
    "ExponentialLR",
    "FitRun",
    "History",
    "InputSpec",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycleLR",
    "ProgressBar",
    "ReduceLROnPlateau",
    "SaveCheckpoint",
    "Schedule",
    "SequentialLR",
    "StepLR",
    "TrainingSession",
    "WeightEMA",
    "evaluate",
    "fit",
    "load_npz",
    "make_schedule",
    "plot_history",
    "resume",
    "save_line_plot",
    "schedule_from_dict",
]

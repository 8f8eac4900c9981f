"""Torch-free training runtime: sessions, the fit loop, schedules, progress and plots.

A session runs on the training build's training engine (C bindings of
``onnxruntime-training``) or, for portable artifacts, on plain inference
sessions of any onnxruntime (see :mod:`onnxblocks.runtime.backend`); onnxruntime
is imported on first use. Importing this package imports neither onnxruntime nor torch.
"""

from onnxblocks.runtime.callbacks import Accuracy, Callback, EarlyStopping, SaveCheckpoint
from onnxblocks.runtime.data import ArrayBatches, load_npz
from onnxblocks.runtime.ema import WeightEMA
from onnxblocks.runtime.fit import FitRun, History, evaluate, fit, resume
from onnxblocks.runtime.inputs import InputSpec
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.lr_schedulers import (
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from onnxblocks.runtime.plot import plot_history, save_line_plot
from onnxblocks.runtime.progress import ProgressBar
from onnxblocks.runtime.schedulers import (
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    Schedule,
    StepSchedule,
    make_schedule,
    schedule_from_dict,
)
from onnxblocks.runtime.session import TrainingSession

__all__ = [
    "Accuracy",
    "ArrayBatches",
    "ArtifactFiles",
    "Callback",
    "ConstantSchedule",
    "CosineAnnealingLR",
    "CosineSchedule",
    "EarlyStopping",
    "ExponentialLR",
    "FitRun",
    "History",
    "InputSpec",
    "LambdaLR",
    "LinearLR",
    "LinearSchedule",
    "MultiStepLR",
    "OneCycleLR",
    "ProgressBar",
    "ReduceLROnPlateau",
    "SaveCheckpoint",
    "Schedule",
    "SequentialLR",
    "StepLR",
    "StepSchedule",
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

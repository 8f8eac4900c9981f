"""The contrib ops the optimizers emit (declared once in :mod:`onnxblocks._core.contrib_ops`)."""

from onnxblocks._core.contrib_ops import (
    ADAMW_OPTIMIZER,
    CONTRIB_OPS,
    IN_PLACE_ACCUMULATOR_V2,
    INPLACE_CLIP_GRAD_NORM,
    SGD_OPTIMIZER_V2,
    Attribute,
    ContribOp,
    Output,
)

__all__ = [
    "ADAMW_OPTIMIZER",
    "CONTRIB_OPS",
    "INPLACE_CLIP_GRAD_NORM",
    "IN_PLACE_ACCUMULATOR_V2",
    "SGD_OPTIMIZER_V2",
    "Attribute",
    "ContribOp",
    "Output",
]

"""The loss library: each loss is a Block that adds its nodes to the model being built.

Every loss compares a model output with a target (or labels) that is either an
existing value or a new graph input with a documented default name (``target``
or ``labels``) and a derived dtype and shape. See docs/losses.md.
"""

from onnxblocks.losses._base import Loss
from onnxblocks.losses.bce_with_logits import BCEWithLogitsLoss
from onnxblocks.losses.cross_entropy import CrossEntropyLoss
from onnxblocks.losses.huber import HuberLoss
from onnxblocks.losses.kl_div import KLDivLoss
from onnxblocks.losses.l1 import L1Loss
from onnxblocks.losses.mse import MSELoss
from onnxblocks.losses.nll import NLLLoss
from onnxblocks.losses.smooth_l1 import SmoothL1Loss

__all__ = [
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "HuberLoss",
    "KLDivLoss",
    "L1Loss",
    "Loss",
    "MSELoss",
    "NLLLoss",
    "SmoothL1Loss",
]

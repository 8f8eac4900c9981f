"""What exporting a torch module for one signature gives: the ONNX model and its map back to the
module (which graph input is which argument leaf, which initializer is which module tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx
import torch


@dataclass(frozen=True)
class BatchNormUpdate:
    """A BatchNorm module whose running statistics the wrapper updates after each training-mode
    forward.

    Attributes:
        path: The module's qualified name.
        value: The graph value normalised (its input), exposed as a graph output.
    """

    path: str
    value: str


@dataclass
class Exported:
    """A module exported for one signature, with the map between graph names and module tensors.

    Attributes:
        model: The ONNX model (parameters and floating-point buffers are its initializers).
        inputs: The graph inputs, ``input_<k>`` for the k-th tensor leaf of ``(args, kwargs)``.
        input_leaves: For each graph input, the index of its tensor leaf.
        weights: Initializers fed from the module (named as the module names them), in order.
        outputs: The graph outputs holding the module's tensor outputs, in order.
        out_spec: The pytree structure of the module's output.
        out_leaves: The output's leaves: an :class:`OutputSlot` where a tensor goes, else the
        constant value.
        graphless: The module returns no tensor it computes (only its inputs and constants): no
        graph to run.
        batch_norms: The running statistics to update (training mode).
        baked: Module buffers baked into the graph as constants, with their version at export.
    """

    model: onnx.ModelProto
    inputs: tuple[str, ...]
    input_leaves: tuple[int, ...]
    weights: tuple[str, ...]
    outputs: tuple[str, ...]
    out_spec: Any
    out_leaves: list[Any]
    batch_norms: list[BatchNormUpdate] = field(default_factory=list)
    baked: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    graphless: bool = False

"""Models exported as users export them, and the initializers that hold torch's parameters there.

``export(model, inputs, how)`` runs ``torch.onnx.export`` the ways the defects came in:

* ``"ts-folded"``: TorchScript with its defaults (``dynamo=False``: constant folding on, eval mode). It merges
  identical initializers, read through ``Identity`` nodes named after the others (fresh norm weights are one);
* ``"ts-unfolded"``: the same with ``do_constant_folding=False`` (identical initializers are merged still);
* ``"dynamo"``: dynamo as the project's families export (``optimize=False``);
* ``"dynamo-optimized"``: dynamo's defaults: its optimizer merges identical initializers, read directly.

``training=True`` exports TorchScript in training mode (batch norms with batch statistics).
``initializers(model, torch_model, wanted)`` maps torch's parameter names to the initializers holding them,
transposed where the folding stored ``W^T`` under a name of its own (``onnx::MatMul_...``).
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from support.sweep import quiet

EXPORTS = ("ts-folded", "ts-unfolded", "dynamo", "dynamo-optimized")


def export(
    model: nn.Module, inputs: dict[str, np.ndarray], how: str, training: bool = False
) -> onnx.ModelProto:
    """``model`` exported the way ``how`` names (a copy is exported: tracing updates batch-norm statistics)."""
    model = copy.deepcopy(model)
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    names = list(inputs)
    with quiet():
        if how.startswith("dynamo"):
            program = torch.onnx.export(
                model,
                args,
                dynamo=True,
                optimize=how == "dynamo-optimized",
                input_names=names,
                output_names=["output"],
            )
            return program.model_proto
        options: dict = {} if how == "ts-folded" else {"do_constant_folding": False}
        if training:
            options["training"] = torch.onnx.TrainingMode.TRAINING
        f = io.BytesIO()
        torch.onnx.export(
            model, args, f, input_names=names, output_names=["output"], dynamo=False, **options
        )
        return onnx.load_from_string(f.getvalue())


def initializers(
    model: onnx.ModelProto,
    torch_model: nn.Module,
    wanted: Callable[[str], bool],
    required: bool = True,
) -> dict[str, tuple[str, bool]]:
    """torch parameter -> (the initializer holding it, transposed?) for the parameters ``wanted`` selects.

    ``required=False`` leaves out a parameter no initializer holds (dynamo's optimizer folds GPT-2's position
    embedding at the fixed positions). A parameter whose value several initializers hold (an exporter's
    merge, or a folded transposed copy) maps to its own name if there is one, else to the first.
    """
    tensors = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = {}
    for name, param in torch_model.named_parameters():
        if not wanted(name):
            continue
        value = param.detach().numpy()
        if name in tensors:
            found[name] = (name, False)
            continue
        hits = [
            (k, False)
            for k, a in tensors.items()
            if a.shape == value.shape and np.array_equal(a, value)
        ]
        if value.ndim == 2:
            hits += [
                (k, True)
                for k, a in tensors.items()
                if a.shape == value.T.shape and np.array_equal(a, value.T)
            ]
        assert hits or not required, f"{name} is in no initializer of the export"
        if hits:
            found[name] = hits[0]
    return found

"""One builder of ONNX exports for the tests' torch models, and the map back to their parameters.

``export_onnx`` runs ``torch.onnx.export`` with every folding and merging optimisation off:
TorchScript (``dynamo=False, do_constant_folding=False``, in training or eval mode) or dynamo
(``dynamo=True, optimize=False``). ``initializer_names`` maps each torch parameter to the
initializer that holds it (a tied weight, or TorchScript's ``onnx::MatMul_...``, may be exported
under another name). ``quiet`` silences the exporters. The sweep cases (``support.sweep``), the
Hugging Face families (``support.hf_families``) and the shared tiny models (``support.models``)
all export through here.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
import torch
from torch import nn

from onnxblocks.torch.torchlib import shared_registry


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' progress lines and warnings (torch's logger, stdout, warnings)."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with (
        warnings.catch_warnings(),
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
    ):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)


def export_onnx(
    model: nn.Module,
    inputs: dict[str, np.ndarray],
    *,
    dynamo: bool,
    opset: int | None,
    outputs: Sequence[str] = ("output",),
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    training: bool = True,
    fold: bool = False,
) -> onnx.ModelProto:
    """``model`` exported on ``inputs`` (by name, in order); ``model`` itself is traced.

    ``opset`` None: the exporter's default. ``dynamic_axes``, ``training`` and ``fold`` (constant
    folding, as Optimum exports) apply to TorchScript (dynamo exports in the module's own mode,
    with static shapes here).
    """
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    names = list(inputs)
    with quiet():
        if not dynamo:
            f = io.BytesIO()
            torch.onnx.export(
                model,
                args,
                f,
                input_names=names,
                output_names=list(outputs),
                dynamo=False,
                do_constant_folding=fold,
                opset_version=opset,
                training=torch.onnx.TrainingMode.TRAINING
                if training
                else torch.onnx.TrainingMode.EVAL,
                dynamic_axes=dynamic_axes,
            )
            return onnx.load_from_string(f.getvalue())
        options = {} if opset is None else {"opset_version": opset}
        with shared_registry():  # torchlib's table built once per process, not per export
            program = torch.onnx.export(
                model,
                args,
                dynamo=True,
                optimize=False,
                input_names=names,
                output_names=list(outputs),
                **options,
            )
        return program.model_proto


def initializer_names(module: nn.Module, model: onnx.ModelProto, strict: bool) -> dict[str, str]:
    """torch parameter name -> the initializer of ``model`` that holds it.

    A parameter exported under another name is found by value (one initializer of its shape with
    equal values). ``strict``: every parameter must be found; else those not kept as an initializer
    (folded into the graph) are left out.
    """
    initializers = {i.name: i for i in model.graph.initializer}
    names = {}
    for name, param in module.named_parameters():
        if name in initializers:
            names[name] = name
            continue
        value = param.detach().numpy()
        same = [
            k
            for k, i in initializers.items()
            if tuple(i.dims) == value.shape and np.array_equal(onnx.numpy_helper.to_array(i), value)
        ]
        if strict:
            assert len(same) == 1, f"no initializer for {name}"
        if len(same) == 1:
            names[name] = same[0]
    return names

"""The reference's namespace, so programs written for ``onnxruntime.training`` run unchanged.

Replace::

    from onnxruntime.training import artifacts, onnxblock

with::

    from onnxblocks.compat import artifacts, onnxblock

``onnxblock`` has ``Block``, ``ForwardBlock``, ``TrainingBlock``, ``base``,
``empty_base``, ``custom_op_library``, ``blocks``, ``loss``, ``optim``,
``save_checkpoint`` and ``load_checkpoint_to_model``; ``artifacts`` has
``generate_artifacts``, ``LossType`` and ``OptimType``. Where onnxblocks' own
defaults differ from the reference's, this namespace keeps the reference's:

* ``onnxblock.optim.AdamW`` and ``OptimType.AdamW`` are Hugging Face AdamW with
  ``eps=1e-6`` and ``weight_decay=0.0`` (``onnxblocks.optim.AdamW`` follows torch);
* ``onnxblock.load_checkpoint_to_model`` fills the given model in place
  (``onnxblocks.checkpoint.load_checkpoint_to_model`` returns a copy).

Differences that remain: builds are context-scoped (two builds may run at once),
``generate_artifacts`` returns an :class:`~onnxblocks.artifacts.Artifacts`
instead of None, and ``requires_grad`` on a graph input gives the output
``<input>_grad`` rather than an accumulation buffer (which ONNX Runtime's
training API cannot feed). Inside a build, ``self.base`` (and ``accessor.model``)
holds initializers of 1 KiB or more as *stubs* (name, dtype and dims, no data),
so code that reads a large initializer's values from the proto must call
``self.accessor.tensor(name)`` instead of ``onnx.numpy_helper.to_array``;
appending nodes, inputs and initializers to the proto works as in the reference.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator, Sequence
from typing import Any

import onnx

from onnxblocks import blocks as _blocks
from onnxblocks import losses as _losses
from onnxblocks import optim as _optim
from onnxblocks._core.errors import StateError
from onnxblocks.artifacts import generate as _artifacts
from onnxblocks.blocks.block import Block, ForwardBlock
from onnxblocks.blocks.opening import base, empty_base
from onnxblocks.blocks.opening import custom_op_library as _custom_op_library
from onnxblocks.blocks.training import TrainingBlock
from onnxblocks.optim._reference import AdamWOptimizer, ReferenceAdamW, ReferenceSGD, SGDOptimizer

__all__ = [
    "AdamWOptimizer",
    "ReferenceAdamW",
    "ReferenceSGD",
    "SGDOptimizer",
    "artifacts",
    "onnxblock",
]


def save_checkpoint(
    parameters: tuple[Sequence[Any], Sequence[Any]],
    path_to_checkpoint: str | os.PathLike,
    nominal_checkpoint: bool = False,
) -> None:
    """Save ``(trainable, frozen)`` parameters as an ONNX Runtime training checkpoint (reference
    signature).

    Raises:
        RuntimeError: if ``parameters`` is None (the reference's error).
    """
    from onnxblocks.checkpoint import save_checkpoint as _save

    if parameters is None:
        raise StateError("No checkpoint parameters provided.")
    _save(parameters, path_to_checkpoint, nominal_checkpoint=nominal_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto) -> None:
    """Fill ``model``'s initializers with the checkpoint's values, in place (reference contract)."""
    from onnxblocks.checkpoint import load_checkpoint_to_model as _load

    model.CopyFrom(_load(path_to_checkpoint, model))


@contextlib.contextmanager
def custom_op_library(custom_op_library_path: str | os.PathLike) -> Iterator[str]:
    """Register a custom op library for the builds inside the with-block (reference signature).

    Raises:
        FileNotFoundError: if the library does not exist.
    """
    with _custom_op_library(custom_op_library_path) as path:
        yield path


def _reference_optimizer(optimizer: _artifacts.OptimType) -> Block:
    return {_artifacts.OptimType.AdamW: ReferenceAdamW, _artifacts.OptimType.SGD: ReferenceSGD}[
        optimizer
    ]()


def generate_artifacts(
    model: onnx.ModelProto | str | os.PathLike,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: _artifacts.LossType | Block | None = None,
    optimizer: _artifacts.OptimType | Block | None = None,
    artifact_directory: str | os.PathLike | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: str | os.PathLike | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
) -> _artifacts.Artifacts:
    """:func:`onnxblocks.artifacts.generate_artifacts` with the reference's optimizer defaults.

    ``OptimType.AdamW`` is the reference's AdamW (Hugging Face mode, ``eps=1e-6``,
    ``weight_decay=0.0``). See :func:`onnxblocks.artifacts.generate_artifacts` for
    the arguments.
    """
    return _artifacts._generate(
        model,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        loss=loss,
        optimizer=optimizer,
        artifact_directory=artifact_directory,
        prefix=prefix,
        ort_format=ort_format,
        custom_op_library_path=custom_op_library,
        additional_output_names=additional_output_names,
        nominal_checkpoint=nominal_checkpoint,
        loss_input_names=loss_input_names,
        optimizer_blocks=_reference_optimizer,
    )


def _namespace(name: str, doc: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    for key, value in {**members, "__all__": sorted(members)}.items():
        setattr(module, key, value)
    return module


loss = _namespace(
    "onnxblocks.compat.onnxblock.loss",
    "Losses under the reference's names.",
    MSELoss=_losses.MSELoss,
    CrossEntropyLoss=_losses.CrossEntropyLoss,
    BCEWithLogitsLoss=_losses.BCEWithLogitsLoss,
    L1Loss=_losses.L1Loss,
    HuberLoss=_losses.HuberLoss,
    SmoothL1Loss=_losses.SmoothL1Loss,
    NLLLoss=_losses.NLLLoss,
    KLDivLoss=_losses.KLDivLoss,
)

optim = _namespace(
    "onnxblocks.compat.onnxblock.optim",
    "Optimizers with the reference's defaults.",
    AdamW=ReferenceAdamW,
    SGD=ReferenceSGD,
    ClipGradNorm=_optim.ClipGradNorm,
    AdamWOptimizer=AdamWOptimizer,
    SGDOptimizer=SGDOptimizer,
)

onnxblock = _namespace(
    "onnxblocks.compat.onnxblock",
    "Drop-in for onnxruntime.training.onnxblock.",
    Block=Block,
    ForwardBlock=ForwardBlock,
    TrainingBlock=TrainingBlock,
    base=base,
    empty_base=empty_base,
    custom_op_library=custom_op_library,
    blocks=_blocks,
    loss=loss,
    optim=optim,
    save_checkpoint=save_checkpoint,
    load_checkpoint_to_model=load_checkpoint_to_model,
)

artifacts = _namespace(
    "onnxblocks.compat.artifacts",
    "Drop-in for onnxruntime.training.artifacts.",
    generate_artifacts=generate_artifacts,
    LossType=_artifacts.LossType,
    OptimType=_artifacts.OptimType,
)

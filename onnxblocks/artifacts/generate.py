"""generate_artifacts: from a forward model to the files ONNX Runtime's training API runs.

The files and their names are listed in :mod:`onnxblocks.artifacts`.

Everything is written into a temporary directory first and moved into place
only when complete, so a failure leaves no half-written artifacts and existing
artifacts are replaced with complete ones (see :mod:`onnxblocks.artifacts.files`).
Weights are never copied in memory: a model given as a path is loaded without its external data,
which is streamed from its file into the checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import (
    EVAL_MODEL,
    OPTIMIZER_MODEL,
    STEP_MODEL,
    TRAINING_MODEL,
    ArtifactNames,
)
from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.artifacts import arguments as _arguments
from onnxblocks.artifacts import base_weights as _base
from onnxblocks.artifacts.choices import (
    LossType,
    OptimType,
    loss_block,
    optimizer_block,
    resolve_loss,
    resolve_optimizer,
)
from onnxblocks.artifacts.files import OWNER_FILE, staging, to_ort_format
from onnxblocks.artifacts.written import Artifacts
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.opening import base, custom_op_library, empty_base
from onnxblocks.blocks.training import TrainingBlock
from onnxblocks.gradient import ort_bridge, worker

if TYPE_CHECKING:
    from onnxblocks.peft.config import LoraConfig

logger = logging.getLogger(__name__)

__all__ = ["Artifacts", "LossType", "OptimType", "generate_artifacts"]


class _ArtifactsBlock(TrainingBlock):
    """The loss (or pass-through) on the base model's outputs, plus additional outputs."""

    def __init__(
        self, loss: Block, loss_input_names: Sequence[str] | None, additional: Sequence[str]
    ) -> None:
        super().__init__()
        self._loss = loss
        self._loss_input_names = list(loss_input_names) if loss_input_names else None
        self._additional = list(additional)

    def build(self, *outputs: str) -> Any:
        inputs = self._loss_input_names or list(outputs)
        loss = self._loss(*inputs)
        if not self._additional:
            return loss
        losses = tuple(loss) if isinstance(loss, (tuple, list)) else (loss,)
        for name in self._additional:
            self.accessor.require(name, role="additional output")
        return (*losses, *self._additional)


def generate_artifacts(
    model: onnx.ModelProto | str | os.PathLike,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | Block | None = None,
    optimizer: OptimType | Block | None = None,
    artifact_directory: str | os.PathLike | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: str | os.PathLike | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
    *,
    model_path: str | os.PathLike | None = None,
    portable: bool | str = False,
    fused_step: bool = True,
    base_dtype: str | None = None,
    quant_block_size: int = 32,
    lora: LoraConfig | None = None,
    untie: bool = False,
    recompute: str | int | Sequence[str] = "none",
) -> Artifacts:
    """Write the training, eval, checkpoint and optimizer artifacts for ONNX Runtime's training API.

    Example:
        >>> artifacts = onnxblocks.generate_artifacts(
        ...     "model.onnx", requires_grad=["fc.weight", "fc.bias"],
        ...     loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
        ...     artifact_directory="artifacts")
        >>> artifacts.training_model
        PosixPath('artifacts/training_model.onnx')

    Args:
        model: The base model, or the path of its ``.onnx`` file (its external data is
            streamed from disk, never loaded whole). The model is not changed.
        requires_grad: Parameters (initializers) to train; a graph input named here
            gets its gradient as the training model's output ``<input>_grad``.
        frozen_params: Parameters fed from the checkpoint without a gradient. Other
            initializers stay constants of the graphs.
        loss: A :class:`LossType`, a Block whose first output is the loss, or None
            (the base model's first output is the loss).
        optimizer: An :class:`OptimType` (AdamW: ``torch.optim.AdamW`` semantics and
            defaults), an optimizer Block, or None for no optimizer model.
        artifact_directory: Where to write; created if missing; default the current directory.
        prefix: Prefix of every file name.
        ort_format: Also write ``.ort`` versions of the models.
        custom_op_library: Shared library registering custom ops the model uses.
        additional_output_names: Values returned by the training and eval models after the loss.
        nominal_checkpoint: Also write a nominal checkpoint (names and types only).
        loss_input_names: The values passed to the loss; default the base model's outputs.
        model_path: For a ModelProto loaded with ``onnx.load(path, load_external_data=False)``:
            the ``.onnx`` file it came from, so its external data files are found (and streamed).
        portable: Write models that train on stock ``onnxruntime`` (docs/portable.md): ``True`` or
            ``"standard"``: standard ONNX ops only, which any ONNX runtime runs; ``"onnxruntime"``:
            also
            the ``com.microsoft`` ops stock onnxruntime runs on CPU (``Gelu``, ``FusedMatMul``...).
        fused_step: With ``portable``, also write ``step_model.onnx`` (forward, backward and update
        in one graph).
        base_dtype: ``"float16"`` or ``"bfloat16"``: store the frozen base (``base_weights.bin``)
        so, cast where read; ``"int8"`` or ``"int4"``: its 2-D weights quantized (docs/lora.md).
        quant_block_size: With an int8/int4 base: elements of a row sharing a scale (32/64/128).
        lora: A :class:`~onnxblocks.peft.LoraConfig`: LoRA adapters added to the model
            (docs/lora.md), which train with what ``requires_grad`` names; the base weights stay
            constants. The adapters of a model from :func:`~onnxblocks.peft.apply_lora` train so
            without ``lora``.
        untie: Give each module of a weight the exporter tied its own copy, named after the module,
        trained (or
            frozen) with it (docs/training.md, "Weights the exporter tied"); without it, training
            one warns.
        recompute: ``"none"``, ``"layers"`` (each repeated block's forward is recomputed in the
            backward, keeping only the blocks' inputs: ``model.layers.N``, ``encoder.layer.N``,
            ``h.N``...), ``"auto"`` or a byte budget (an int: the fewest blocks whose
            recomputation fits the statically estimated activations the backward keeps in it;
            ``"auto"``: a third of the weights' bytes), or a list of module paths, each
            recomputed as one segment (docs/training.md, "Recomputation").

    Returns:
        The :class:`Artifacts`: paths of the files and the parameter names.

    Raises:
        TypeError: for an argument of the wrong kind (a model, loss or optimizer; a number
            where a path is expected; a str where a list of names is expected; a flag that
            is not a bool).
        ValueError: for a bad prefix (a separator, a NUL, too long), a parameter both
            trainable and frozen, a loss that is not a scalar, an optimizer without trainable
            parameters, a model file that is not an ONNX model, or a model without an opset
            import or that cannot be converted to opset 21.
        FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError: for paths
            that are not what they must be (checked before any work: a read-only or file-like
            artifact_directory is found before the gradient is built).
        FileExistsError: when a file would replace another prefix's artifact.
        TimeoutError: when another call writing into the same directory holds it too long.
        onnxblocks.errors.UnknownNameError: for an unknown parameter or output name.
        onnxblocks.errors.GradientError: when ONNX Runtime cannot differentiate the model.
        onnxblocks.errors.PortabilityError: with ``portable``, for an op without a standard-op form.
        onnxblocks.errors.InvalidValueError: for a ``portable`` other than a bool, ``"standard"`` or
        ``"onnxruntime"``.
    """
    return _generate(
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
        model_path=model_path,
        portable=portable,
        fused_step=fused_step,
        base_dtype=base_dtype,
        quant_block_size=quant_block_size,
        lora=lora,
        untie=untie,
        recompute=recompute,
    )


def _generate(
    model: onnx.ModelProto | str | os.PathLike,
    *,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | Block | None = None,
    optimizer: OptimType | Block | None = None,
    artifact_directory: str | os.PathLike | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library_path: str | os.PathLike | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
    model_path: str | os.PathLike | None = None,
    portable: bool | str = False,
    fused_step: bool = True,
    base_dtype: str | None = None,
    quant_block_size: int = 32,
    lora: LoraConfig | None = None,
    untie: bool = False,
    recompute: str | int | Sequence[str] = "none",
    loss_blocks: Callable[[LossType], Block] = loss_block,
    optimizer_blocks: Callable[[OptimType], Block] = optimizer_block,
) -> Artifacts:
    """:func:`generate_artifacts`, keyword-only, with the mapping from enum members to blocks as
    arguments.

    ``loss_blocks`` and ``optimizer_blocks`` turn a :class:`LossType` / :class:`OptimType`
    into a block; :mod:`onnxblocks.compat` passes the reference's optimizer defaults.
    """
    mode = None if portable is False else _arguments.portable_mode(portable)
    stored_as = _base.base_dtype(base_dtype, quant_block_size)  # (dtype, block size)
    base_model, model_path = _arguments.load_model(model, model_path)
    base_model, adapters = _arguments.with_lora(base_model, lora)
    loss_block = resolve_loss(loss, loss_blocks)
    optim_block = resolve_optimizer(optimizer, optimizer_blocks)
    additional = _arguments.names("additional_output_names", additional_output_names)
    loss_inputs = _arguments.names("loss_input_names", loss_input_names)
    requires = _arguments.names("requires_grad", requires_grad)
    frozen = _arguments.names("frozen_params", frozen_params)
    requires = list(
        dict.fromkeys([*adapters, *requires])
    )  # LoRA adapters train, with what requires_grad names
    base_model, requires, frozen = _arguments.exporter_ties(base_model, untie, requires, frozen)
    _arguments.check_prefix(prefix)
    ort_format = _arguments.flag("ort_format", ort_format)
    nominal_checkpoint = _arguments.flag("nominal_checkpoint", nominal_checkpoint)
    libraries = _arguments.library(custom_op_library_path)
    directory = _arguments.directory(
        artifact_directory
    )  # writable: checked before the work, not after

    both = [n for n in requires if n in set(frozen)]
    if both:
        raise InvalidValueError(
            f"{preview(both)} cannot be both trainable (requires_grad) and frozen (frozen_params). "
            "Remove each from one of the two lists."
        )
    block = _ArtifactsBlock(loss_block, loss_inputs, additional)
    block.recompute(recompute)
    for name in requires:
        block.requires_grad(name)
    for name in frozen:
        block.requires_grad(name, False)

    with contextlib.ExitStack() as stack:
        for library in libraries:
            stack.enter_context(custom_op_library(library))
        stack.enter_context(base(base_model, model_path))
        block(*[o.name for o in base_model.graph.output])
    block.check()
    graphs = block.training_graphs()
    store = block.weight_store()
    sources = block.parameter_sources()

    optimizer_model = None
    if optim_block is not None:
        with empty_base(
            opset_version=_limits.onnx_opset(graphs.eval)
        ):  # the base's, converted if it was above 21
            optim_block(sources)
        optimizer_model = optim_block.to_model_proto()  # type: ignore[attr-defined]  # any Block with it, checked by hasattr
    training_model, eval_model, step_model = graphs.training, graphs.eval, None
    if (
        mode is not None
    ):  # the same graphs, rewritten into standard ops (a lower layer, loaded on first use)
        from onnxblocks import portable as _portable
        from onnxblocks.portable.make import portable_eval_model

        # the builder's IR of the training model, given up: lowered in place, not cloned
        source, graphs.training_ir = graphs.training_ir, None
        made = _portable.make_portable(
            source if source is not None else training_model,
            optimizer_model,
            fused_step=fused_step,
            frozen_params=graphs.partition.frozen,
            mode=mode,
            # what the optimizer block built, handed over (a custom block without one: read)
            optimizer_spec=getattr(optim_block, "optimizer_spec", None),
            edit_in_place=True,
        )
        training_model, optimizer_model, step_model = made.training, made.optimizer, made.step
        # ORT's fusions may have written contrib ops there too
        eval_model = portable_eval_model(eval_model, mode)

    cast = _base.cast_base(training_model, eval_model, step_model, store, *stored_as)
    training_model, eval_model, step_model, store, views = cast
    # lower layers, loaded on first use to keep `import onnxblocks.artifacts` light
    from onnxblocks import checkpoint
    from onnxblocks.io import save_model
    from onnxblocks.ir.dequantize_rows import place_views

    names = ArtifactNames(prefix)
    with staging(directory, prefix) as stage:
        shared = _base.store_base(
            stage / names.base_weights, (training_model, eval_model, step_model), store
        )
        shared = place_views(views, shared)
        save_model(training_model, stage / names.training_model, weights=store, references=shared)
        save_model(eval_model, stage / names.eval_model, weights=store, references=shared)
        if step_model is not None:
            save_model(step_model, stage / names.step_model, weights=store, references=shared)
        checkpoint.save_checkpoint(sources, stage / names.checkpoint, nominal_checkpoint=False)
        if nominal_checkpoint:
            checkpoint.save_checkpoint(
                sources, stage / names.nominal_checkpoint, nominal_checkpoint=True
            )
        if optimizer_model is not None:
            save_model(optimizer_model, stage / names.optimizer_model)
        models = [TRAINING_MODEL, EVAL_MODEL] + (
            [OPTIMIZER_MODEL] if optimizer_model is not None else []
        )
        models += [STEP_MODEL] if step_model is not None else []
        if ort_format:
            convert = ort_bridge.to_ort_format_in_worker if worker.uses_worker() else to_ort_format
            for stem in models:
                convert(
                    stage / names.model(stem), stage / names.model(stem, ort_format=True), libraries
                )
        written = sorted(p.name for p in stage.iterdir() if p.name != OWNER_FILE)
    files = tuple(directory / n for n in written)
    logger.info("Wrote training artifacts to %s: %s", directory, ", ".join(written))

    def ort_copy(stem: str) -> Path | None:
        return (
            directory / names.model(stem, ort_format=True)
            if ort_format and stem in models
            else None
        )

    return Artifacts(
        directory=directory,
        training_model=directory / names.training_model,
        eval_model=directory / names.eval_model,
        checkpoint=directory / names.checkpoint,
        optimizer_model=directory / names.optimizer_model if optimizer_model is not None else None,
        nominal_checkpoint=directory / names.nominal_checkpoint if nominal_checkpoint else None,
        training_model_ort=ort_copy(TRAINING_MODEL),
        eval_model_ort=ort_copy(EVAL_MODEL),
        optimizer_model_ort=ort_copy(OPTIMIZER_MODEL),
        requires_grad=graphs.partition.trainable,
        frozen_params=graphs.partition.frozen,
        input_names=graphs.user_inputs,
        output_names=graphs.user_outputs,
        files=files,
        step_model=directory / names.step_model if step_model is not None else None,
        base_weights=directory / names.base_weights if shared else None,
    )

"""Checking, when a session opens, that the files of an artifact set fit the checkpoint and each
other.

An artifact directory whose files come from different generations (a step model
copied from another run, an eval model of a wider layer, an optimizer model of
other parameters) loads without a word: ONNX Runtime fails at the first step
that binds the odd tensor, with a message about dimensions or an ``OrtValue``
it cannot find. :func:`check_artifact_set` reads the graph inputs and outputs of
each model (its structure only, no weights: :func:`onnxblocks._core.weights.load_structure`)
and compares, for every parameter, its name, element type and shape:

* the training model against the checkpoint (parameters; for portable artifacts
  also each gradient buffer ``<p>_grad.accumulation.buffer`` and its new value
  ``<p>_grad.accumulation.out``);
* the eval model against the checkpoint (parameters) and the training model (an
  input that is neither a parameter nor a training input belongs to another model);
* the portable optimizer model: each trainable parameter, its gradient and its
  moments in, their updated values out;
* the portable step model: the training model's user inputs and outputs, then
  each parameter and its moments in, their updated values out, and the frozen parameters.

A mismatch raises :class:`~onnxblocks.errors.CheckpointMismatchError` (a file
against the checkpoint) or :class:`~onnxblocks.errors.InvalidValueError` (two
models against each other) naming the file and the parameter or input.
ORT-format models (``.ort``) cannot be read here and are not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from onnxblocks._core.contracts import (
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    STEP,
    accumulated_name,
    buffer_name,
    gradient_name,
    state_names,
    updated_name,
)
from onnxblocks._core.errors import CheckpointMismatchError, InvalidValueError, preview
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.signature import Signature, Spec, describe, fits, read_signature

#: Reads the signature of a model file (``path``, ``what``), or None without one.
SignatureReader = Callable[[Path | None, str], Signature | None]

_REGENERATE = (
    "The files of an artifact directory must come from one generate_artifacts run: copy the "
    "whole directory, or "
    "regenerate it (`onnxblocks artifacts MODEL.onnx ...`)."
)


class _Checker:
    def __init__(self, params: Mapping[str, Spec], checkpoint: Path) -> None:
        self.params = params
        self.checkpoint = checkpoint

    def against_checkpoint(
        self, sig: Signature, side: dict[str, Spec], name: str, role: str, param: str
    ) -> None:
        """``name`` (``role`` of parameter ``param``) must be in ``side`` and fit the
        checkpoint's ``param``.
        """
        want = self.params[param]
        have = side.get(name)
        direction = "take" if side is sig.inputs else "return"
        if have is None:
            raise CheckpointMismatchError(
                f"{sig.title} does not fit checkpoint '{self.checkpoint}': it does not "
                f"{direction} {role} "
                f"'{name}' of parameter '{param}' ({describe(want)}), which the checkpoint "
                f"trains. {_REGENERATE}"
            )
        if not fits(want, have):
            raise CheckpointMismatchError(
                f"{sig.title} does not fit checkpoint '{self.checkpoint}': parameter '{param}' "
                f"is {describe(want)} in "
                f"the checkpoint, but the model's {role} '{name}' is {describe(have)}. "
                f"{_REGENERATE}"
            )


def check_artifact_set(
    files: ArtifactFiles,
    params: Mapping[str, Spec],
    trainable: Collection[str],
    checkpoint: Path,
    portable: bool,
    read: SignatureReader = read_signature,
) -> None:
    """Check the models of ``files`` against the checkpoint's parameters and against each other.

    Args:
        files: The artifact set.
        params: Every parameter of the checkpoint: name -> (numpy dtype, shape).
        trainable: The trainable ones.
        checkpoint: The checkpoint's path, for messages.
        portable: Portable artifacts (explicit buffers, per-tensor optimizer, step model).
        read: Reads a model's signature (default: from its file; an
            :class:`~onnxblocks.runtime.artifact_set.ArtifactSet` hands those it read).

    Raises:
        CheckpointMismatchError: a model does not take (or return) a parameter, or takes it
            with another element type or shape, naming the file and the parameter.
        InvalidValueError: two models disagree (user inputs or outputs), naming both files.
    """
    check = _Checker(params, checkpoint)
    trained = set(trainable)
    trainable, frozen = [p for p in params if p in trained], [p for p in params if p not in trained]
    training = read(files.training_model, "training model")
    user_inputs: dict[str, Spec] | None = None
    user_outputs: list[str] | None = None
    if training is not None:
        for param in params:
            if param in training.inputs or param in trainable:
                check.against_checkpoint(training, training.inputs, param, "input", param)
        if portable:
            for param in trainable:
                check.against_checkpoint(
                    training, training.inputs, buffer_name(param), "gradient buffer", param
                )
                check.against_checkpoint(
                    training, training.outputs, accumulated_name(param), "gradient output", param
                )
        special = {*params, *map(buffer_name, trainable), LAZY_RESET_GRAD}
        user_inputs = {n: s for n, s in training.inputs.items() if n not in special}
        accumulated = set(map(accumulated_name, trainable))
        user_outputs = [n for n in training.outputs if n not in accumulated]
    _check_eval(check, read(files.eval_model, "eval model"), training, user_inputs)
    if not portable:
        return
    optimizer = read(files.optimizer_model, "optimizer model")
    if optimizer is not None and any(s[0] is None for s in optimizer.inputs.values()):
        optimizer = (
            None  # the sequence form of the first portable layout: the backend refuses it by name
        )
    if optimizer is not None:
        _check_updates(check, optimizer, trainable, gradients=True)
    step = read(files.step_model, "step model")
    if step is not None:
        _check_updates(check, step, trainable, gradients=False)
        first = trainable[0] if trainable else None
        if (
            optimizer is not None
            and first is not None
            and _updated(optimizer, first) != _updated(step, first)
        ):
            raise InvalidValueError(
                f"{step.title} updates the optimizer moments {preview(_updated(step, first))} of "
                "parameter "
                f"'{first}', but {optimizer.label} updates "
                f"{preview(_updated(optimizer, first))}: they "
                f"update with different optimizers. {_REGENERATE}"
            )
        for param in frozen:
            if param in step.inputs:
                check.against_checkpoint(step, step.inputs, param, "input", param)
        if training is not None and user_inputs is not None and user_outputs is not None:
            _check_step_user_values(step, training, user_inputs, user_outputs, set(params))


def _check_eval(
    check: _Checker,
    sig: Signature | None,
    training: Signature | None,
    user_inputs: dict[str, Spec] | None,
) -> None:
    if sig is None:
        return
    for name, spec in sig.inputs.items():
        if name in check.params:
            check.against_checkpoint(sig, sig.inputs, name, "input", name)
        elif user_inputs is not None and training is not None:
            want = user_inputs.get(name)
            if want is None:
                raise InvalidValueError(
                    f"{sig.title} takes input '{name}' ({describe(spec)}), which is neither a "
                    "parameter of checkpoint "
                    f"'{check.checkpoint}' nor an input of {training.label} "
                    f"({preview(list(user_inputs))}): it "
                    f"belongs to another model. {_REGENERATE}"
                )
            if not fits(want, spec):
                raise InvalidValueError(
                    f"{sig.title} takes input '{name}' as {describe(spec)}, but "
                    f"{training.label} takes it as "
                    f"{describe(want)}. {_REGENERATE}"
                )


def _moments(sig: Signature, param: str) -> list[str]:
    """The state inputs ``sig`` takes for ``param`` (``<p>.exp_avg``, ``<p>.exp_avg_sq``,
    ``<p>.state<k>``).

    None for SGD's step.
    """
    return [m for m in state_names(param) if m in sig.inputs]


def _updated(sig: Signature, param: str) -> list[str]:
    """The moments of ``param`` that ``sig`` returns updated (two for AdamW, none for SGD, which
    keeps its moment).
    """
    return [m for m in state_names(param) if updated_name(m) in sig.outputs]


def _check_updates(check: _Checker, sig: Signature, trainable: list[str], gradients: bool) -> None:
    """Each trainable parameter (and gradient) and its moments in, their updated values out."""
    first = trainable[0] if trainable else None
    suffixes = [m[len(first) :] for m in _moments(sig, first)] if first is not None else []
    for param in trainable:
        check.against_checkpoint(sig, sig.inputs, param, "input", param)
        check.against_checkpoint(sig, sig.outputs, updated_name(param), "updated value", param)
        if gradients:
            check.against_checkpoint(sig, sig.inputs, gradient_name(param), "gradient", param)
        for suffix in suffixes:
            moment = param + suffix
            check.against_checkpoint(sig, sig.inputs, moment, "optimizer moment", param)
            if updated_name(moment) in sig.outputs:
                check.against_checkpoint(
                    sig, sig.outputs, updated_name(moment), "updated moment", param
                )


def _check_step_user_values(
    step: Signature,
    training: Signature,
    user_inputs: dict[str, Spec],
    user_outputs: list[str],
    params: set[str],
) -> None:
    """The step model takes the training model's user inputs (same order, types) and returns its
    user outputs first.
    """
    contract = {LEARNING_RATE, STEP, *params, *(m for p in params for m in state_names(p))}
    step_inputs = {n: s for n, s in step.inputs.items() if n not in contract}
    if list(step_inputs) != list(user_inputs):
        raise InvalidValueError(
            f"{step.title} takes the user inputs {preview(list(step_inputs))}, but "
            f"{training.label} takes "
            f"{preview(list(user_inputs))}: the two come from different models. {_REGENERATE}"
        )
    for name, spec in step_inputs.items():
        if not fits(user_inputs[name], spec):
            raise InvalidValueError(
                f"{step.title} takes input '{name}' as {describe(spec)}, but {training.label} "
                "takes it as "
                f"{describe(user_inputs[name])}. {_REGENERATE}"
            )
    if list(step.outputs)[: len(user_outputs)] != user_outputs:
        raise InvalidValueError(
            f"{step.title} returns {preview(list(step.outputs)[: len(user_outputs)])} first, but "
            f"{training.label} "
            f"returns {preview(user_outputs)}: the two come from different models. {_REGENERATE}"
        )

"""Guards in front of ONNX Runtime: data it would crash on, or silently compute garbage from,
refused first.

ONNX Runtime's CPU kernels trust their inputs. A checkpoint that does not fit the training model, an
empty
batch (a division by the batch size: SIGFPE), a class label past the number of classes
(``SoftmaxCrossEntropyLoss``
reads outside the scores: SIGSEGV, or a garbage loss for ``5`` of 5 classes and ``-1``) kill the
process or give
wrong numbers without a word. The session calls these guards before each ONNX Runtime call that
takes such data:

* :class:`BatchGuard` before each ``train_step`` / ``eval_step``: an input with a
  zero-size dimension the model does not declare is refused always (about 0.5 µs
  a step); index inputs (class labels, token ids) are checked against their range
  when ``check_inputs`` is on (the default), because that reads every element. The
  session checks all once per batch signature, then only the values
  (:meth:`BatchGuard.check_checked`: one ``max`` of the values viewed as unsigned
  for a ``[0, high)`` input, else a ``min`` and a ``max``; ``bench_guards.py``).

Which inputs are indices, and their ranges, is read from the model
(:mod:`onnxblocks.runtime.index_rules`). The checkpoint is checked when the artifact
set is read (:class:`~onnxblocks.runtime.artifact_set.ArtifactSet`), before ONNX
Runtime loads it (also by ``load_checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks._core.paths import as_path, check_output_file
from onnxblocks.checkpoint.storage import replacing
from onnxblocks.io import load_model
from onnxblocks.runtime.artifact_set import ArtifactSet
from onnxblocks.runtime.index_rules import IndexRule
from onnxblocks.runtime.inputs import InputSpec
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.rules_cache import cached_index_rules

__all__ = ["BatchGuard", "IndexRule", "checkpoint_output", "session_guards"]


def check_session_arguments(
    artifact_dir: object, prefix: object, checkpoint: object, device: object, check_inputs: object
) -> None:
    """The types of ``TrainingSession``'s arguments, each error naming the parameter.

    Raises:
        TypeError: for a number where a path is expected, a non-str prefix or device, a non-bool
        flag.
        ValueError: for an empty path or one holding a NUL byte.
    """
    as_path(artifact_dir, "artifact_dir")
    if checkpoint is not None:
        as_path(checkpoint, "checkpoint")
    for name, value in (("prefix", prefix), ("device", device)):
        if not isinstance(value, str):
            raise InvalidTypeError(
                f"{name} must be a str, not {type(value).__name__} {value!r:.60}."
            )
    if not isinstance(check_inputs, (bool, np.bool_)):
        raise InvalidTypeError(
            f"check_inputs must be True or False, not {type(check_inputs).__name__} "
            f"{check_inputs!r:.60}."
        )


@contextlib.contextmanager
def checkpoint_output(path: object) -> Iterator[Path]:
    """Stage a checkpoint for ``path`` and replace the old one (with its ``.data`` file)
    all-or-nothing.

    Yields the temporary header path for ONNX Runtime's (or onnxblocks') writer,
    which may write ``<temp>.data`` beside it. Missing directories are created.

    Raises:
        TypeError, ValueError: for a path argument of the wrong kind.
        IsADirectoryError, NotADirectoryError, PermissionError: for a path that cannot be written.
    """
    target = check_output_file(path, "path", create_parents=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with replacing(target) as staged:
        yield staged.header


def session_guards(
    artifacts: ArtifactSet | ArtifactFiles,
    train_specs: Sequence[InputSpec],
    eval_specs: Sequence[InputSpec],
) -> dict[str, BatchGuard]:
    """The batch guards of a session: ``{"train_step": ..., "eval_step": ...}``.

    An :class:`~onnxblocks.runtime.artifact_set.ArtifactSet` hands the models it read; with
    :class:`~onnxblocks.runtime.layout.ArtifactFiles` the models are read from their files.
    """
    if isinstance(artifacts, ArtifactSet):
        train = artifacts.training.model
        evaluation = artifacts.eval.model if artifacts.eval is not None else None
        return {
            "train_step": BatchGuard(train, train_specs),
            "eval_step": BatchGuard(evaluation, eval_specs),
        }
    return {
        "train_step": BatchGuard(artifacts.training_model, train_specs),
        "eval_step": BatchGuard(artifacts.eval_model, eval_specs),
    }


class BatchGuard:
    """The checks a batch of one model gets before ONNX Runtime runs it (see the module docstring).

    Args:
        model: The model, or its file (``.onnx``; an ``.ort`` model has no index rules).
        specs: The specs of its user inputs, in call order.
    """

    def __init__(
        self, model: onnx.ModelProto | str | os.PathLike | None, specs: Sequence[InputSpec]
    ) -> None:
        self.specs = list(specs)
        self.rules: dict[int, list[IndexRule]] = {}
        if model is not None and not isinstance(model, onnx.ModelProto):
            path = Path(os.fspath(model))
            # a truncated file: an error naming it
            model = load_model(path) if path.suffix == ".onnx" else None
        if model is not None:
            names = [s.name for s in self.specs]
            for rule in cached_index_rules(model, names):
                self.rules.setdefault(names.index(rule.input), []).append(rule)
        self._fast: dict[
            int, tuple[int, np.dtype]
        ] = {}  # [0, high) inputs, no ignore_index: (high, unsigned)
        for index, rules in self.rules.items():
            unsigned = _UNSIGNED.get(self.specs[index].dtype)
            if unsigned is not None and all(
                r.low == 0 and r.high is not None and not r.allowed for r in rules
            ):
                self._fast[index] = (min(int(r.high or 0) for r in rules), unsigned)

    def check(self, arrays: Sequence[Any], what: str, values: bool = True) -> None:
        """Refuse an empty batch, and (``values``) index values out of range.

        Args:
            arrays: The batch, one array per input (anything else is left to the dtype checks).
            what: ``"train_step"`` or ``"eval_step"``, for messages.
            values: Also check index inputs' values (reads every element).

        Raises:
            ValueError: naming the input, the offending value and its position, and the valid range.
        """
        shapes: list[tuple[InputSpec, tuple[int, ...]]] = []
        for spec, array in zip(self.specs, arrays, strict=False):
            shape = getattr(array, "shape", None)
            if shape is None:
                try:
                    shape = np.shape(array)  # a list: as ONNX Runtime will see it
                except ValueError:
                    continue  # ragged: the dtype and shape check says what is wrong
            shapes.append((spec, tuple(shape)))
        # an empty KV cache (past length 0) beside inputs with rows is a batch, not an empty one
        rows = any(0 not in shape for _, shape in shapes)
        for spec, shape in shapes:
            if 0 in shape:
                _refuse_empty(spec, shape, what, rows)
        for index, rules in self.rules.items() if values else ():
            if index < len(arrays):
                _check_values(rules, arrays[index], what)

    def check_checked(self, arrays: Sequence[np.ndarray], what: str) -> None:
        """The value checks of a batch whose signature passed :meth:`check`: ``[0, high)`` costs
        one max.
        """
        for index, rules in self.rules.items():
            fast = self._fast.get(index)
            array = arrays[index]
            if fast is None or (
                array.size and int(_MAXIMUM(array.view(fast[1]), axis=None)) >= fast[0]
            ):
                _check_values(rules, array, what)


def _check_values(rules: Sequence[IndexRule], array: Any, what: str) -> None:
    """Refuse values of ``array`` out of the ``rules``' range (a ``min`` and a ``max``)."""
    if type(array) is not np.ndarray:
        try:
            array = np.asarray(array)
        except ValueError:
            return
    if array.dtype.kind not in "iu" or array.size == 0:
        return
    low, top = int(array.min()), int(array.max())
    for rule in rules:
        if (rule.low is not None and low < rule.low) or (
            rule.high is not None and top >= rule.high
        ):
            _refuse_indices(rule, array, what)


_UNSIGNED: dict[np.dtype | None, np.dtype] = {
    np.dtype(f"int{b}"): np.dtype(f"uint{b}") for b in (8, 16, 32, 64)
}
_UNSIGNED |= {np.dtype(f"uint{b}"): np.dtype(f"uint{b}") for b in (8, 16, 32, 64)}
_MAXIMUM = np.maximum.reduce


def _refuse_empty(spec: InputSpec, shape: tuple[int, ...], what: str, rows: bool) -> None:
    """Refuse a zero dimension, unless declared 0, or (when another input has rows) a symbolic
    dimension after the first: a past key-value input's ``past_sequence_length`` starts at 0.
    """
    declared = spec.shape if spec.shape is not None and len(spec.shape) == len(shape) else None
    for axis, size in enumerate(shape):
        symbolic = declared is None or not isinstance(declared[axis], int)
        if rows and axis > 0 and symbolic:
            continue
        if size == 0 and not (declared is not None and declared[axis] == 0):
            name = (
                f" ('{declared[axis]}')"
                if declared is not None and isinstance(declared[axis], str)
                else ""
            )
            raise InvalidValueError(
                f"{what} got an empty batch: input '{spec.name}' has shape {shape}, dimension "
                f"{axis}{name} is 0. "
                "ONNX Runtime cannot train or evaluate on zero rows (it would crash); skip empty "
                "batches."
            )


def _refuse_indices(rule: IndexRule, array: np.ndarray, what: str) -> None:
    bad = array < rule.low if rule.low is not None else np.zeros(array.shape, bool)
    if rule.high is not None:
        bad |= array >= rule.high
    if rule.allowed:
        bad &= ~np.isin(array, list(rule.allowed))
    positions = np.argwhere(bad)
    if not len(positions):
        return
    where = tuple(int(i) for i in positions[0])
    value = int(array[where])
    valid = f"[{rule.low}, {rule.high})" if rule.high is not None else f">= {rule.low}"
    extra = f" or {sorted(rule.allowed)} (ignore_index)" if rule.allowed else ""
    hint = (
        " Labels are class indices: check the labels, or the number of classes of the model."
        if "classes" in rule.what
        else " Check the data."
    )
    raise InvalidValueError(
        f"{what}: input '{rule.input}' holds {value} at position {where} ({int(bad.sum())} "
        "value(s) out of range); "
        f"it indexes {rule.what}, so its values must be in {valid}{extra}. ONNX Runtime does not "
        "check this: it "
        f"would crash or compute a wrong loss.{hint}"
    )

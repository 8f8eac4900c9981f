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

* :func:`check_checkpoint_for` before a checkpoint is loaded (also by
  ``load_checkpoint``): the whole file, then its names, element types and shapes
  against the training model (:func:`onnxblocks.checkpoint.check_checkpoint`);
* :class:`BatchGuard` before each ``train_step`` / ``eval_step``: an input with a
  zero-size dimension the model does not declare is refused always (about 0.5 µs
  a step); index inputs (class labels, token ids) are checked against their range
  when ``check_inputs`` is on (the default), because that reads every element. The
  session checks all once per batch signature, then only the values
  (:meth:`BatchGuard.check_checked`: one ``max`` of the values viewed as unsigned
  for a ``[0, high)`` input, else a ``min`` and a ``max``; ``bench_guards.py``).

Which inputs are indices, and their ranges, is read from the model: an integer
graph input that reaches, through reshapes, casts and ``Where``, the label input
of ``SoftmaxCrossEntropyLoss`` / ``NegativeLogLikelihoodLoss`` (classes: axis 1
of the scores) or the indices of ``GatherElements`` (valid: ``[0, size)``, as
``torch.gather``) or ``Gather`` (valid: ``[-size, size)``, as ONNX). A loss's
``ignore_index`` (the attribute of the fused losses, or the ``Where(Equal(labels,
c))`` masking of the composed ones) is allowed besides.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks._core.paths import as_path, check_output_file
from onnxblocks.checkpoint import check_checkpoint
from onnxblocks.checkpoint.storage import replacing
from onnxblocks.io import load_model
from onnxblocks.runtime.inputs import InputSpec
from onnxblocks.runtime.layout import ArtifactFiles

#: Ops an index passes through unchanged in value (the input positions it may come in at).
_PASS_THROUGH = {
    "Identity": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Expand": (0,),
    "Transpose": (0,),
    "Slice": (0,),
    "Tile": (0,),
    "Cast": (0,),
    "Where": (1, 2),
}
_INTEGER_TYPES = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
}
_LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")


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
    files: ArtifactFiles, train_specs: Sequence[InputSpec], eval_specs: Sequence[InputSpec]
) -> dict[str, BatchGuard]:
    """The batch guards of a session: ``{"train_step": ..., "eval_step": ...}``."""
    return {
        "train_step": BatchGuard(files.training_model, train_specs),
        "eval_step": BatchGuard(files.eval_model, eval_specs),
    }


def check_checkpoint_for(files: ArtifactFiles, checkpoint: str | os.PathLike) -> None:
    """Check ``checkpoint`` completely, and against the training model of ``files``, before ONNX
    Runtime loads it.

    An ORT-format training model (``.ort`` only) cannot be read here: the file is
    then checked on its own.

    Raises:
        FileNotFoundError: if the checkpoint or its ``.data`` file is missing.
        onnxblocks.errors.CheckpointFormatError: for a file that is not a valid checkpoint.
        onnxblocks.errors.CheckpointMismatchError: for a checkpoint of another model.
    """
    model = files.training_model if files.training_model.suffix == ".onnx" else None
    check_checkpoint(checkpoint, model)


# --------------------------------------------------------------------------- index inputs
@dataclass(frozen=True)
class IndexRule:
    """The values an index input may hold.

    Attributes:
        input: The graph input.
        low: Smallest valid value, or None (any negative value is valid: the size is unknown).
        high: One past the largest valid value, or None when the size is unknown.
        allowed: Values valid besides (a loss's ``ignore_index``).
        what: What the values index, for messages (``"the 3 classes of 'logits' (axis 1)
            in SoftmaxCrossEntropyLoss node 'loss'"``).
    """

    input: str
    low: int | None
    high: int | None
    allowed: frozenset[int]
    what: str


class _Shapes:
    """Element types and shapes of a model's values, from its declarations, then from shape
    inference if needed.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self._known = self._read(model)
        self._inferred = False

    @staticmethod
    def _read(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | None, ...] | None]]:
        known: dict[str, tuple[int, tuple[int | None, ...] | None]] = {}
        for init in model.graph.initializer:
            known[init.name] = (init.data_type, tuple(init.dims))
        for vi in (*model.graph.value_info, *model.graph.output, *model.graph.input):
            tensor = vi.type.tensor_type
            dims = None
            if tensor.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim
                )
            known[vi.name] = (tensor.elem_type, dims)
        return known

    def dims(self, name: str) -> tuple[int | None, ...] | None:
        found = self._known.get(name)
        if (found is None or found[1] is None) and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            except Exception:  # a model onnx cannot infer: sizes stay unknown
                return None
            self._known = {**self._read(inferred), **self._known}
            found = self._known.get(name)
        return None if found is None else found[1]

    def elem_type(self, name: str) -> int:
        found = self._known.get(name)
        return 0 if found is None else found[0]


def _constant_int(model_constants: dict[str, np.ndarray], name: str) -> int | None:
    value = model_constants.get(name)
    if value is None or value.size != 1 or value.dtype.kind not in "iu":
        return None
    return int(value.reshape(()))


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.dims in ([], [1])
    }
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.attribute:
            attr = node.attribute[0]
            if (
                attr.name == "value"
                and attr.t.data_type in _INTEGER_TYPES
                and len(attr.t.dims) <= 1
            ):
                out[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr.name in ("value_int", "value_ints"):
                out[node.output[0]] = np.asarray(helper.get_attribute_value(attr), dtype=np.int64)
    return out


def _masked_value(
    producers: dict[str, onnx.NodeProto],
    constants: dict[str, np.ndarray],
    node: onnx.NodeProto,
    position: int,
    traced: set[str],
) -> int | None:
    """For ``Where(cond, a, b)`` reached at ``position``: the value ``c`` that ``cond`` replaces
    (``labels == c``).
    """
    cond, negated = node.input[0], False
    while cond in producers and producers[cond].op_type == "Not":
        cond, negated = producers[cond].input[0], not negated
    equal = producers.get(cond)
    if equal is None or equal.op_type != "Equal" or len(equal.input) != 2:
        return None
    a, b = equal.input
    value = (
        _constant_int(constants, b)
        if a in traced
        else _constant_int(constants, a)
        if b in traced
        else None
    )
    # Where keeps input 1 where cond holds: the masked value is replaced when it selects input 2
    # there.
    replaced = (position == 1 and negated) or (position == 2 and not negated)
    return value if replaced else None


def index_rules(model: onnx.ModelProto, inputs: Sequence[str]) -> list[IndexRule]:
    """The index rules of the integer graph inputs ``inputs`` of ``model`` (see the module
    docstring).
    """
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    producers: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, position))
        for name in node.output:
            producers[name] = node
    shapes = _Shapes(model)
    constants: dict[str, np.ndarray] | None = None
    rules: list[IndexRule] = []
    for graph_input in inputs:
        if shapes.elem_type(graph_input) not in _INTEGER_TYPES:
            continue
        traced = {graph_input}
        stack: list[tuple[str, frozenset[int]]] = [(graph_input, frozenset())]
        seen: set[tuple[str, frozenset[int]]] = set()
        while stack:
            value, allowed = stack.pop()
            if (value, allowed) in seen:
                continue
            seen.add((value, allowed))
            for node, position in consumers.get(value, []):
                if node.domain not in ("", "ai.onnx"):
                    continue
                rule = _rule_of(node, position, graph_input, allowed, shapes)
                if rule is not None:
                    rules.append(rule)
                    continue
                if position not in _PASS_THROUGH.get(node.op_type, ()):
                    continue
                if (
                    node.op_type == "Cast"
                    and helper.get_node_attr_value(node, "to") not in _INTEGER_TYPES
                ):
                    continue
                more = allowed
                if node.op_type == "Where":
                    constants = _constants(model) if constants is None else constants
                    masked = _masked_value(producers, constants, node, position, traced)
                    more = allowed | {masked} if masked is not None else allowed
                traced.update(node.output[:1])
                stack.append((node.output[0], more))
    return rules


def _rule_of(
    node: onnx.NodeProto, position: int, graph_input: str, allowed: frozenset[int], shapes: _Shapes
) -> IndexRule | None:
    """The rule a consumer sets on the index reaching it at ``position``, or None when it is not
    an indexer.
    """
    label = node.name or node.output[0]
    if node.op_type in _LOSSES and position == 1:
        axis, data, signed = 1, node.input[0], False
        ignore = next((a.i for a in node.attribute if a.name == "ignore_index"), None)
        if ignore is not None:
            allowed = allowed | {ignore}
        noun = "classes"
    elif node.op_type in ("GatherElements", "Gather") and position == 1:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        data, signed, noun = node.input[0], node.op_type == "Gather", "entries"
    else:
        return None
    dims = shapes.dims(data)
    size = None
    if dims is not None and -len(dims) <= axis < len(dims):
        size = dims[axis % len(dims)] or None
        axis %= len(dims)
    count = f"the {size} {noun}" if size is not None else f"the {noun}"
    what = f"{count} of '{data}' (axis {axis}) in {node.op_type} node '{label}'"
    low = (-size if size is not None else None) if signed else 0
    return IndexRule(graph_input, low, size, allowed, what)


class BatchGuard:
    """The checks a batch of one model gets before ONNX Runtime runs it (see the module docstring).

    Args:
        model_path: The model (``.onnx``; an ``.ort`` model has no index rules).
        specs: The specs of its user inputs, in call order.
    """

    def __init__(self, model_path: str | os.PathLike | None, specs: Sequence[InputSpec]) -> None:
        self.specs = list(specs)
        self.rules: dict[int, list[IndexRule]] = {}
        path = None if model_path is None else Path(os.fspath(model_path))
        if path is not None and path.suffix == ".onnx":
            model = load_model(path)  # a truncated file: an error naming it
            names = [s.name for s in self.specs]
            for rule in index_rules(model, names):
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
        for spec, array in zip(self.specs, arrays, strict=False):
            shape = getattr(array, "shape", None)
            if shape is None:
                try:
                    shape = np.shape(array)  # a list: as ONNX Runtime will see it
                except ValueError:
                    continue  # ragged: the dtype and shape check says what is wrong
            if 0 in shape:
                _refuse_empty(spec, tuple(shape), what)
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


def _refuse_empty(spec: InputSpec, shape: tuple[int, ...], what: str) -> None:
    declared = spec.shape if spec.shape is not None and len(spec.shape) == len(shape) else None
    for axis, size in enumerate(shape):
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

"""What a model expects of each input, and checking batches against it before ONNX Runtime sees
them.

ONNX Runtime's own messages for a wrong dtype or shape name neither the input nor
the fix. :func:`check_batch` raises first, with a message such as::

    input 'x' expects float32 with shape [batch, 2]; got float64 with shape (32, 2).
    Convert it with array.astype(np.float32).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

Dim = int | str | None


@dataclass(frozen=True)
class InputSpec:
    """Name, element type and shape of one model input.

    Attributes:
        name: The input's name.
        dtype: The numpy dtype it takes, or None when unknown.
        shape: One entry per dimension: an int (fixed), a str (symbolic, e.g.
            ``"batch"``) or None (unknown); the whole shape is None when the rank
            is unknown.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None

    def describe(self) -> str:
        """``float32 with shape [batch, 2]``."""
        dtype = str(self.dtype) if self.dtype is not None else "any dtype"
        if self.shape is None:
            return f"{dtype} of any shape"
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype} with shape [{dims}]"


def specs_from_value_infos(value_infos: Sequence[Any]) -> dict[str, InputSpec]:
    """Build :class:`InputSpec` objects from ONNX ``ValueInfoProto`` entries."""
    from onnx import helper

    specs = {}
    for vi in value_infos:
        t = vi.type
        if t.WhichOneof("value") != "tensor_type":
            specs[vi.name] = InputSpec(vi.name, None, None)
            continue
        elem = t.tensor_type.elem_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else None
        shape: tuple[Dim, ...] | None = None
        if t.tensor_type.HasField("shape"):
            dims: list[Dim] = []
            for d in t.tensor_type.shape.dim:
                kind = d.WhichOneof("value")
                dims.append(
                    d.dim_value
                    if kind == "dim_value"
                    else d.dim_param
                    if kind == "dim_param"
                    else None
                )
            shape = tuple(dims)
        specs[vi.name] = InputSpec(vi.name, dtype, shape)
    return specs


def read_input_specs(model_path: str | os.PathLike, names: Sequence[str]) -> list[InputSpec]:
    """The specs of the graph inputs ``names`` of an ONNX model file.

    ORT-format models (``.ort``) cannot be read by onnx; their inputs get specs
    with unknown dtype and shape (so nothing is checked before ONNX Runtime).
    """
    path = os.fspath(model_path)
    if path.endswith(".ort"):
        return [InputSpec(n, None, None) for n in names]
    from onnxblocks.io import load_model

    model = load_model(path)
    specs = specs_from_value_infos(model.graph.input)
    return [specs.get(n, InputSpec(n, None, None)) for n in names]


def check_batch(
    specs: Sequence[InputSpec], arrays: Sequence[Any], what: str = "train_step"
) -> list[np.ndarray]:
    """Check ``arrays`` against ``specs`` and return them as contiguous numpy arrays.

    Symbolic dimensions with the same name (``batch`` in both ``x`` and ``labels``)
    must have the same size in every array of the batch.

    Raises:
        TypeError: if the number of arrays does not match the number of inputs.
        ValueError: naming the input, what it expects and what it got, when a
            dtype, rank or dimension does not fit.
    """
    if len(arrays) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InvalidTypeError(
            f"{what} takes {len(specs)} input(s) ({names}) but got {len(arrays)}. "
            "Pass one array per model input, in this order."
        )
    out: list[np.ndarray] = []
    bound: dict[str, tuple[int, str]] = {}
    for spec, raw in zip(specs, arrays, strict=False):
        array = (
            raw if type(raw) is np.ndarray and raw.flags.c_contiguous else np.ascontiguousarray(raw)
        )
        if (spec.dtype is None or array.dtype == spec.dtype) and _fits(
            spec.shape, array.shape, bound, spec.name
        ):
            out.append(array)
            continue
        got = f"got {array.dtype} with shape {tuple(array.shape)}"
        if spec.dtype is not None and array.dtype != spec.dtype:
            raise InvalidValueError(
                f"input '{spec.name}' expects {spec.describe()}; {got}. "
                f"Convert it with array.astype(np.{spec.dtype.name})."
            )
        if spec.shape is not None:
            if array.ndim != len(spec.shape):
                raise InvalidValueError(
                    f"input '{spec.name}' expects {spec.describe()} (rank {len(spec.shape)}); "
                    f"{got}. "
                    "Reshape the array to the model's rank."
                )
            for axis, (want, have) in enumerate(zip(spec.shape, array.shape, strict=False)):
                if isinstance(want, int) and want > 0 and want != have:
                    raise InvalidValueError(
                        f"input '{spec.name}' expects {spec.describe()}; {got}: dimension {axis} "
                        f"must be {want}."
                    )
                if isinstance(want, str) and want:
                    first = bound.setdefault(want, (have, spec.name))
                    if first[0] != have:
                        raise InvalidValueError(
                            f"input '{spec.name}' expects {spec.describe()}; {got}: dimension "
                            f"{axis} ('{want}') "
                            f"is {have} but input '{first[1]}' has {want}={first[0]}. Batch the "
                            "inputs together."
                        )
        out.append(array)
    return out


def _fits(
    want: tuple[Dim, ...] | None,
    have: tuple[int, ...],
    bound: dict[str, tuple[int, str]],
    name: str,
) -> bool:
    """Fast check of a shape; records symbolic dims in ``bound`` only when everything fits."""
    if want is None:
        return True
    if len(want) != len(have):
        return False
    new: dict[str, tuple[int, str]] = {}
    for w, h in zip(want, have, strict=True):
        if isinstance(w, int):
            if w > 0 and w != h:
                return False
        elif isinstance(w, str) and w:
            seen = bound.get(w) or new.get(w)
            if seen is not None and seen[0] != h:
                return False
            new[w] = (h, name)
    for k, v in new.items():
        bound.setdefault(k, v)
    return True

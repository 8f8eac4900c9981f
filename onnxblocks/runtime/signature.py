"""The signature of a model file: its graph inputs and outputs, with element types and dims.

The artifact checks (:mod:`onnxblocks.runtime.consistency`) compare signatures of the
models of one artifact set with each other and with the checkpoint. A signature is read
from a model's structure only (:func:`onnxblocks._core.weights.load_structure`: no
weights), and reading one checks the model's external-data references first
(:func:`check_external_data`), as ONNX Runtime would follow them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core.errors import FileMissingError, InvalidValueError
from onnxblocks._core.weights import external_info, external_source, load_structure

Dims = tuple[int | str | None, ...]
#: Element type (numpy) and dims of a tensor; either is None when unknown.
Spec = tuple[np.dtype | None, Dims | None]

#: Initializers of at least this many bytes are not read: only names, types and shapes matter here.
SKIP_BYTES = 256


@dataclass(frozen=True)
class Signature:
    """The graph inputs and outputs of one model file, in order.

    Attributes:
        path: The model file.
        what: ``"training model"``, ``"eval model"``...: for messages.
        inputs: Name -> (numpy dtype, dims) of each graph input.
        outputs: Name -> (numpy dtype, dims) of each graph output.
    """

    path: Path
    what: str
    inputs: dict[str, Spec]
    outputs: dict[str, Spec]

    @property
    def label(self) -> str:
        """``the training model '<path>'``."""
        return f"the {self.what} '{self.path}'"

    @property
    def title(self) -> str:
        """``The training model '<path>'``, to start a sentence."""
        return f"The {self.what} '{self.path}'"


def read_signature(path: Path | None, what: str) -> Signature | None:
    """The inputs and outputs of an ``.onnx`` file (its weights are not read); None for none or
    an ``.ort`` file.
    """
    if path is None or path.suffix != ".onnx":
        return None
    graph = load_structure(path, SKIP_BYTES).graph
    check_external_data(path, graph, what)
    return signature_of(path, what, graph)


def signature_of(path: Path, what: str, graph: onnx.GraphProto) -> Signature:
    """The signature of ``graph``, the graph of the model file ``path``."""
    return Signature(path, what, _specs(graph.input), _specs(graph.output))


def check_external_data(path: Path, graph: onnx.GraphProto, what: str) -> None:
    """Check every external-data reference of ``graph`` (the model ``path``) before ONNX Runtime
    reads it.

    The frozen base weights an artifact set shares (``base_weights.bin``) and each
    model's own ``.data`` file are found relative to the model's directory; each
    reference must stay inside it and its offset and length must lie inside the
    file and match the tensor's dims. Only file sizes are read, never the bytes.

    Raises:
        InvalidValueError: for a location outside the directory, an offset or length
            past the end of the file or other than the dims need, naming the model,
            the tensor and the data file.
        FileMissingError: for a data file that does not exist.
    """
    for init in graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if external_info(init).get("location") == path.name:
            # a large inline tensor of the model file itself (load_structure's reference), already
            # bounded
            continue
        try:
            external_source(init, path.parent)
        except (InvalidValueError, FileMissingError) as exc:
            where = external_info(init).get("location", "")
            raise type(exc)(
                f"The {what} '{path}' cannot be loaded (its tensor '{init.name}' in {where!r}): "
                f"{exc}"
            ) from None


def _specs(value_infos: object) -> dict[str, Spec]:
    out: dict[str, Spec] = {}
    for vi in value_infos:  # type: ignore[attr-defined]
        if vi.type.WhichOneof("value") != "tensor_type":
            out[vi.name] = (None, None)
            continue
        tensor = vi.type.tensor_type
        dtype = (
            np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            if tensor.elem_type
            else None
        )
        dims: Dims | None = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            )
        out[vi.name] = (dtype, dims)
    return out


def describe(spec: Spec) -> str:
    """``float32 [4, ?]``, ``any dtype of any shape``: a spec for messages."""
    dtype, dims = spec
    kind = str(dtype) if dtype is not None else "any dtype"
    if dims is None:
        return f"{kind} of any shape"
    return f"{kind} [{', '.join('?' if d is None else str(d) for d in dims)}]"


def fits(want: Spec, have: Spec) -> bool:
    """False only when two specs certainly differ: element type, rank, or two static dims."""
    (want_dtype, want_dims), (have_dtype, have_dims) = want, have
    if want_dtype is not None and have_dtype is not None and want_dtype != have_dtype:
        return False
    if want_dims is None or have_dims is None:
        return True
    if len(want_dims) != len(have_dims):
        return False
    pairs = zip(want_dims, have_dims, strict=True)
    return not any(
        isinstance(w, int) and isinstance(h, int) and w and h and w != h for w, h in pairs
    )

"""The checkpoint layout as data: constants, element types, and field positions from the generated
accessors.

ONNX Runtime's published schema (``ort_training_checkpoint.fbs``, which includes
``ort.fbs``) is stored in ``_generated/schema`` and compiled by ``flatc --python``
into :mod:`onnxblocks.checkpoint._generated.ort_training_checkpoint_generated`
(``_generated/README.md`` has the exact command). Every table, field slot,
default and enum is the generated module's; this package spells none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flatbuffers import number_types

from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as _fbs

#: File identifier at bytes 4..8 of every checkpoint (the schema's ``file_identifier``).
FILE_IDENTIFIER = b"ODTC"
#: The checkpoint version onnxruntime-training 1.19.2 writes (and reads).
CHECKPOINT_VERSION = 2
#: Versions this reader understands.
READABLE_VERSIONS = (1, 2)
#: Suffix of the side file holding external tensor data.
EXTERNAL_DATA_SUFFIX = ".data"

_T = _fbs.TensorDataType
#: ONNX element types ONNX Runtime 1.19.2 can load from a checkpoint, with their numpy dtypes.
LOADABLE_DTYPES: dict[int, np.dtype] = {
    _T.FLOAT: np.dtype("<f4"),
    _T.UINT8: np.dtype("u1"),
    _T.INT8: np.dtype("i1"),
    _T.UINT16: np.dtype("<u2"),
    _T.INT16: np.dtype("<i2"),
    _T.INT32: np.dtype("<i4"),
    _T.INT64: np.dtype("<i8"),
    _T.BOOL: np.dtype("?"),
    _T.DOUBLE: np.dtype("<f8"),
    _T.UINT32: np.dtype("<u4"),
    _T.UINT64: np.dtype("<u8"),
}
#: Every element type the schema's ``TensorDataType`` enum names.
_SCHEMA_DTYPES = {
    v: k for k, v in vars(_T).items() if k.isupper() and isinstance(v, int) and v != _T.UNDEFINED
}

#: A flatbuffer cannot exceed 2 GiB, so no offset in a valid one reaches past this.
_MAX_FLATBUFFER_BYTES = 2**31 - 1
_U16 = number_types.VOffsetTFlags
_U32 = number_types.UOffsetTFlags
_I32 = number_types.SOffsetTFlags


def _field_voffset(add_field: Callable[[Any, Any], None]) -> int:
    """The vtable offset of the field a generated ``<Table>Add<Field>`` function writes.

    The generated module states each field's slot only inside its builder
    functions (``builder.Prepend...Slot(slot, value, default)``), so ask one.
    """

    class _Probe:
        slot = -1

        def __getattr__(self, name: str) -> Callable[..., None]:
            def prepend(slot: int, *_: Any) -> None:
                self.slot = slot

            return prepend

    probe = _Probe()
    add_field(probe, 0)
    if probe.slot < 0:
        raise AssertionError(f"{add_field.__name__} wrote no slot")
    # A vtable is [vtable size:u16][object size:u16] then one u16 per slot.
    return 2 * _U16.bytewidth + _U16.bytewidth * probe.slot


#: Where a Tensor's vtable says ``raw_data`` is (needed for the position of the inline bytes).
_RAW_DATA_VOFFSET = _field_voffset(_fbs.TensorAddRawData)

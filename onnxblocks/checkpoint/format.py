"""ONNX Runtime's on-device-training checkpoint format ("ODTC"): generated accessors plus bounds
checks.

A checkpoint is one FlatBuffers file (file identifier ``ODTC``) whose root
table is::

    table Checkpoint   { version:int32; module_state:ModuleState;
                         optimizer_groups:[OptimizerGroup]; property_bag:PropertyBag; }
    table ModuleState  { requires_grad_params:[Tensor]; frozen_params:[Tensor];
                         is_nominal_state:bool; has_external_data:bool; }
    table Tensor       { name:string; doc_string:string; dims:[int64]; data_type:int32;
                         raw_data:[uint8]; string_data:[string]; external_data_offset:int64 = -1; }
    table OptimizerGroup          { group_name:string; step:int64; initial_learning_rate:float;
                                    optimizer_states:[ParameterOptimizerState]; }
    table ParameterOptimizerState { param_name:string; momentums:[Tensor]; }
    table PropertyBag  { ints:[IntProperty]; floats:[FloatProperty]; strings:[StringProperty]; }

A tensor keeps its little-endian bytes either inline in ``raw_data`` or, when
the module state ``has_external_data``, at ``external_data_offset`` in the side
file ``<checkpoint>.data``, with the length implied by dims and data type. A
*nominal* checkpoint stores names and element types only: empty dims and empty
``raw_data``, as ONNX Runtime's own writer does.

The package's modules: :mod:`~onnxblocks.checkpoint.schema` (the layout as
data, from the flatc-generated accessors), :mod:`~onnxblocks.checkpoint.encode`
(the writer), :mod:`~onnxblocks.checkpoint.decode` (the reader) and
:mod:`~onnxblocks.checkpoint.checked_table` (the reader's bounds-checked
accessors). This module gathers their public names.
"""

from onnxblocks._core.errors import CheckpointFormatError
from onnxblocks.checkpoint.decode import (
    OptimizerGroupEntry,
    ParsedCheckpoint,
    TensorEntry,
    decode_checkpoint,
    dtype_of,
)
from onnxblocks.checkpoint.encode import (
    OptimizerGroupRecord,
    PropertyValue,
    TensorRecord,
    check_property,
    encode_checkpoint,
)
from onnxblocks.checkpoint.schema import (
    CHECKPOINT_VERSION,
    EXTERNAL_DATA_SUFFIX,
    FILE_IDENTIFIER,
    LOADABLE_DTYPES,
    READABLE_VERSIONS,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "EXTERNAL_DATA_SUFFIX",
    "FILE_IDENTIFIER",
    "LOADABLE_DTYPES",
    "READABLE_VERSIONS",
    "CheckpointFormatError",
    "OptimizerGroupEntry",
    "OptimizerGroupRecord",
    "ParsedCheckpoint",
    "PropertyValue",
    "TensorEntry",
    "TensorRecord",
    "check_property",
    "decode_checkpoint",
    "dtype_of",
    "encode_checkpoint",
]

"""Reading values of a protobuf model: types, shapes and attributes (no edits, no onnxruntime here).

Graph edits go through :mod:`onnxblocks.ir`; these read-only helpers serve the
signature and hand-off code that works on the ``ModelProto`` ONNX Runtime's
builder takes and returns.
"""

from __future__ import annotations

import onnx

# re-exported: the passes read values through `_graph`
from onnxblocks.gradient._values import attribute as attribute
from onnxblocks.gradient._values import elem_type as elem_type
from onnxblocks.gradient._values import float_attribute as float_attribute
from onnxblocks.gradient._values import floats_attribute as floats_attribute
from onnxblocks.gradient._values import infer_types as infer_types
from onnxblocks.gradient._values import int_attribute as int_attribute
from onnxblocks.gradient._values import ints_attribute as ints_attribute
from onnxblocks.gradient._values import set_attribute as set_attribute
from onnxblocks.gradient._values import shape_of as shape_of
from onnxblocks.gradient._values import static_dims as static_dims
from onnxblocks.gradient._values import string_attribute as string_attribute
from onnxblocks.gradient._values import strings_attribute as strings_attribute


def is_default_domain(node: onnx.NodeProto) -> bool:
    """True for a node of the ai.onnx domain."""
    return node.domain in ("", "ai.onnx")

"""The import path ``onnxblocks.optim.contrib``, kept for one release: the declarations live in
:mod:`onnxblocks.optim.contrib_ops`, and each name read here warns with a DeprecationWarning naming
that import.
"""

from __future__ import annotations

from onnxblocks._core.moved import moved_names
from onnxblocks.optim import contrib_ops as _contrib_ops

__getattr__ = moved_names(
    __name__,
    _contrib_ops.__all__,
    "onnxblocks.optim.contrib_ops",
    lambda name: getattr(_contrib_ops, name),
)

"""The import path ``onnxblocks.optim.contrib``, kept for one release: the declarations live in
:mod:`onnxblocks.optim.contrib_ops`, and each name read here warns with a DeprecationWarning naming
that import.
"""

from __future__ import annotations

import warnings
from typing import Any

from onnxblocks.optim import contrib_ops as _contrib_ops

_NAMES = frozenset(_contrib_ops.__all__)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} is deprecated: import it from onnxblocks.optim.contrib_ops.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_contrib_ops, name)

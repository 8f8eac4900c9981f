"""Deprecated: the reference's optimizer classes live in :mod:`onnxblocks.compat`.

Import ``ReferenceAdamW``, ``ReferenceSGD``, ``AdamWOptimizer`` and ``SGDOptimizer``
from ``onnxblocks.compat`` instead. This module goes away in the next release.
"""

from __future__ import annotations

import warnings

from onnxblocks.optim._reference import AdamWOptimizer, ReferenceAdamW, ReferenceSGD, SGDOptimizer

warnings.warn(
    "onnxblocks.optim.compat is deprecated: import ReferenceAdamW, ReferenceSGD, AdamWOptimizer "
    "and SGDOptimizer "
    "from onnxblocks.compat.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["AdamWOptimizer", "ReferenceAdamW", "ReferenceSGD", "SGDOptimizer"]

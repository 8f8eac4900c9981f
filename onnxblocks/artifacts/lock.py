"""The lock file of an artifact directory (defined in :mod:`onnxblocks._core.dirlock`, which readers
import too).

``DEFAULT_TIMEOUT_S`` here is the writers' default wait (``generate_artifacts``); tests may change
it.
"""

from __future__ import annotations

from onnxblocks._core.dirlock import DEFAULT_TIMEOUT_S, LOCK_NAME, directory_lock

__all__ = ["DEFAULT_TIMEOUT_S", "LOCK_NAME", "directory_lock"]

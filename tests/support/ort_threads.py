"""The intra-op thread count of every ONNX Runtime session the tests open, from one place.

One variable sets it: ``ONNXBLOCKS_ORT_THREADS=N``, the library's own
(:data:`onnxblocks._core.ort.THREADS_ENV`). Where it is read:

* the sessions onnxblocks opens (``TrainingSession`` on both backends, the optimizer driver) and the
  training-API sessions of ``support.reference`` / ``support.models`` / ``support.optim_oracle`` take
  their options from :func:`onnxblocks._core.ort.session_options`, which reads it;
* every ``onnxruntime.InferenceSession`` a test opens itself, with options or without, gets it from
  :func:`install` (``tests/conftest.py`` calls it): options that leave the count at ONNX Runtime's default
  get the asked one; options that set their own keep it;
* subprocess workers (portable, loss grid, gradient, DDP) inherit the variable and open their sessions
  through the library; the Node runner ``node_train_runs.mjs`` reads it too (1 when unset).

Unset, nothing is changed: every session keeps ONNX Runtime's default (one thread per physical core).
"""

from __future__ import annotations

import functools
from typing import Any

from onnxblocks._core.ort import intra_op_threads, onnxruntime


def install() -> int:
    """Give :func:`intra_op_threads` threads to every ``InferenceSession`` opened from now on; the count (0: none).

    Idempotent; does nothing when the variable is unset.
    """
    threads = intra_op_threads()
    if not threads:
        return 0
    ort = onnxruntime()
    cls = ort.InferenceSession
    if getattr(cls.__init__, "_onnxblocks_threads", None) == threads:
        return threads
    original = getattr(cls.__init__, "__wrapped__", cls.__init__)

    @functools.wraps(original)
    def __init__(
        self: Any, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        if sess_options is None:
            sess_options = ort.SessionOptions()
        if (
            sess_options.intra_op_num_threads == 0
        ):  # ONNX Runtime's default: the test did not choose
            sess_options.intra_op_num_threads = threads
        original(self, path_or_bytes, sess_options, *args, **kwargs)

    __init__._onnxblocks_threads = threads  # type: ignore[attr-defined]
    cls.__init__ = __init__
    return threads

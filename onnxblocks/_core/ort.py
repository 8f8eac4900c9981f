"""The one place onnxblocks imports ONNX Runtime from, lazily.

``import onnxruntime`` (training build) runs a package check that imports
``onnxruntime.training.ortmodule`` and with it torch whenever torch is installed:
1.4-2.8 s and ~200 MB that onnxblocks never uses (it only needs the C bindings).
:func:`onnxruntime` imports the package with that probe answered "not present"
(exactly what the check reports on a machine without torch), then removes the
guard, so a later ``import onnxruntime.training`` by the user still works.

Two builds install the module ``onnxruntime``: the training build
(``onnxruntime-training``, Python <= 3.12, with the gradient builder and the
training API) and the stock one (any Python, inference kernels only).
:func:`has_training_build` tells them apart by the C bindings alone, without
importing ``onnxruntime.training`` (and so torch).
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import Any

from onnxblocks._core.errors import InvalidValueError, TrainingBuildRequiredError

_PROBE = "onnxruntime.training.ortmodule"

#: Environment variable: ONNX Runtime's log severity for the sessions onnxblocks opens
#: (0 verbose, 1 info, 2 warning, 3 error, 4 fatal).
LOG_LEVEL_ENV = "ONNXBLOCKS_ORT_LOG_LEVEL"
#: The severity by default: errors only, so ONNX Runtime's warnings (an unused initializer removed,
#: ...)
#: stay out of the output. A failed run is reported once, by the exception, not logged besides.
DEFAULT_LOG_LEVEL = 3
#: Environment variable: the intra-op thread count of the sessions onnxblocks opens (a positive
#: integer;
#: unset or 0: ONNX Runtime's own choice, one thread per physical core).
THREADS_ENV = "ONNXBLOCKS_ORT_THREADS"
_asked: int | None = None  # set by the command line's --verbose
_imported: ModuleType | None = None  # the package, once its import has finished
_import_lock = threading.Lock()  # one guarded import at a time: the probe guard is process-wide


def set_log_level(level: int | None) -> None:
    """Ask for ONNX Runtime's log ``level`` (0-4) in the sessions opened from now on (None: the
    default).
    """
    global _asked
    _asked = level


def log_level() -> tuple[int, bool]:
    """``(severity, asked)``: :data:`LOG_LEVEL_ENV` if set to 0-4, else :func:`set_log_level`'s,
    else the default.
    """
    text = os.environ.get(LOG_LEVEL_ENV, "").strip()
    if text in ("0", "1", "2", "3", "4"):
        return int(text), True
    if _asked is not None:
        return _asked, True
    return DEFAULT_LOG_LEVEL, False


def run_log_level() -> int:
    """The severity for runs: :func:`log_level`'s if asked for, else fatal only (a failed run
    raises, once).
    """
    level, asked = log_level()
    return level if asked else 4


def intra_op_threads() -> int:
    """The intra-op thread count :data:`THREADS_ENV` asks for (0 when unset: ONNX Runtime's own
    choice).

    Raises:
        InvalidValueError: when it is set to anything but a non-negative integer.
    """
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise InvalidValueError(
            f"{THREADS_ENV}={text!r} is not a thread count: set it to a positive integer (1: one "
            "thread per "
            "session), or unset it for ONNX Runtime's default (one thread per physical core)."
        )
    return int(text)


def session_options(runs: bool = False) -> Any:
    """A new ``SessionOptions`` at :func:`log_level`'s severity, with :func:`intra_op_threads`
    threads.

    ONNX Runtime's default logger is set to that severity too.

    Args:
        runs: The session's own logger also logs its runs (the training build's ``Module``, which
            takes no run options): use :func:`run_log_level`.
    """
    ort = onnxruntime()
    level, _ = log_level()
    ort.set_default_logger_severity(level)
    options = ort.SessionOptions()
    options.log_severity_level = run_log_level() if runs else level
    options.intra_op_num_threads = intra_op_threads()
    return options


def run_options() -> Any:
    """A new ``RunOptions`` at :func:`run_log_level`'s severity."""
    options = capi().RunOptions()
    options.log_severity_level = run_log_level()
    return options


def onnxruntime() -> ModuleType:
    """Import and return the ``onnxruntime`` package without its torch-importing probe.

    Thread-safe: a thread never sees the package half imported by another (``sys.modules``
    holds it from the start of its import, before ``InferenceSession`` is defined).
    """
    global _imported
    if _imported is not None:
        return _imported
    with _import_lock:
        if _imported is None:
            guarded = _PROBE not in sys.modules
            if guarded:
                sys.modules[_PROBE] = None  # type: ignore[assignment]  # None fails the import; typeshed wants a module
            try:
                # waits for an import another thread (the user's) has under way
                import onnxruntime as ort
            finally:
                if guarded and sys.modules.get(_PROBE, 0) is None:
                    del sys.modules[_PROBE]
            _imported = ort
    return _imported


def capi() -> ModuleType:
    """Import and return ``onnxruntime.capi._pybind_state``, the C bindings onnxblocks drives."""
    onnxruntime()
    from onnxruntime.capi import _pybind_state

    return _pybind_state


def quantization() -> ModuleType:
    """Import and return ``onnxruntime.quantization`` (``quantize_dynamic``: a hub's int8 file)."""
    onnxruntime()
    import onnxruntime.quantization as quantization

    return quantization


#: The C bindings only the training build has: gradient builder, training module, optimizer,
#: checkpoints.
_TRAINING_BINDINGS = ("GradientGraphBuilder", "Module", "Optimizer", "load_checkpoint")


def has_training_build() -> bool:
    """True when the installed onnxruntime is the training build (onnxruntime-training)."""
    C = capi()
    return all(hasattr(C, name) for name in _TRAINING_BINDINGS)


def require_training_build(what: str) -> ModuleType:
    """Return the C bindings, or raise :class:`TrainingBuildRequiredError` on the stock build.

    Args:
        what: What needs the training build, for the message (``"generate_artifacts"``).

    Raises:
        TrainingBuildRequiredError: on stock onnxruntime, saying what to install and
            that portable artifacts train on stock onnxruntime.
    """
    C = capi()
    if all(hasattr(C, name) for name in _TRAINING_BINDINGS):
        return C
    version = getattr(onnxruntime(), "__version__", "?")
    raise TrainingBuildRequiredError(
        f"{what} needs onnxruntime-training (ONNX Runtime's training build, Python <= 3.12), but "
        "the installed "
        f"onnxruntime {version} (Python {sys.version_info.major}.{sys.version_info.minor}) is "
        "the stock build, "
        "which has no gradient builder or training kernels. Generate the artifacts on Python "
        "3.10-3.12 with "
        "`pip install onnxblocks` (it installs onnxruntime-training-cpu==1.19.2) and portable=True "
        "(`onnxblocks artifacts MODEL.onnx --portable`): the artifacts it writes then train on "
        "stock onnxruntime, "
        "on any Python, with onnxblocks.runtime.TrainingSession. See docs/portable.md."
    )

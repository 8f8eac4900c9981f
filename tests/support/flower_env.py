"""A cached Python 3.13 environment with stock onnxruntime and Flower, for SuperNodes of another kind.

It is :mod:`support.portable_env`'s environment plus ``flwr`` at the version ``pyproject.toml``
pins in the ``flower`` extra, built once per ``pyproject.toml`` under ``~/.cache/onnxblocks-test/``
(``py313-flower-<hash>``), in a temporary directory renamed into place. onnxblocks is not installed
there: a SuperNode started with it imports the checkout (``PYTHONPATH``). Without a 3.13
interpreter, :func:`ensure_python313_flower` raises a ``PortableEnvError`` that says how to get
one (the tests fail with it; they never skip).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import tomllib

from support.portable_env import PYPROJECT, ROOT, PortableEnvError, _run, cache_dir, find_python313, requirements


def flower_requirement() -> str:
    """The ``flwr`` requirement of the ``flower`` extra, without Ray's simulation extra (a SuperNode needs none)."""
    with open(PYPROJECT, "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["flower"]
    pins = [r for r in extra if r.replace(" ", "").startswith("flwr")]
    if not pins:
        raise PortableEnvError("pyproject.toml's 'flower' extra pins no flwr version.")
    return pins[0].replace("[simulation]", "")


def ensure_python313_flower() -> Path:
    """The Python of the cached 3.13 environment with stock onnxruntime and Flower, built on first use.

    Raises:
        PortableEnvError: when the interpreter is missing or the environment cannot be built.
    """
    interpreter = find_python313()
    key = hashlib.sha256(PYPROJECT.read_bytes() + os.fspath(interpreter).encode() + b"flower").hexdigest()[:16]
    venv = cache_dir() / f"py313-flower-{key}"
    python = venv / "bin" / "python"
    if (venv / "ready").exists() and python.exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    staging = cache_dir() / f".building-flower-{key}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    wanted = [*requirements(), flower_requirement()]
    try:
        _run([os.fspath(interpreter), "-m", "venv", os.fspath(staging)], "Creating the Python 3.13 Flower venv")
        pip = [os.fspath(staging / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, *wanted], "Installing onnxblocks' dependencies and Flower into the 3.13 venv", timeout=1800)
        probe = (
            "import flwr; from onnxruntime.capi import _pybind_state as C; "
            "assert not hasattr(C, 'Module'), 'training build'"
        )
        _run([os.fspath(staging / "bin" / "python"), "-c", probe], "Checking the 3.13 Flower venv")
        (staging / "ready").write_text(json.dumps({"interpreter": os.fspath(interpreter), "requirements": wanted}))
        try:
            staging.rename(venv)
        except OSError:  # another session finished first: use its environment
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # the venv's console scripts name the staging path: onnxblocks.federated.deployment starts Flower's
    # commands through the interpreter (python -c), never through those scripts
    return python


def checkout_pythonpath() -> str:
    """``PYTHONPATH`` that makes this checkout's onnxblocks importable in the 3.13 environment."""
    return os.fspath(ROOT)


if __name__ == "__main__":
    print(ensure_python313_flower())
    sys.exit(0)

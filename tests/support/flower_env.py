"""A cached Python 3.13 environment with stock onnxruntime and Flower, for SuperNodes of another kind.

It is :mod:`support.portable_env`'s environment plus ``flwr`` at the version ``pyproject.toml``
pins in the ``flower`` extra, built once per list of dependencies under ``~/.cache/onnxblocks-test/``
(``py313-flower-<hash>``), in a temporary directory renamed into place. onnxblocks is not installed
there: a SuperNode started with it imports the checkout (``PYTHONPATH``). Without a 3.13
interpreter, :func:`ensure_python313_flower` raises a ``PortableEnvError`` that says how to get
one (the tests fail with it; they never skip).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tomllib

from support.portable_env import PYPROJECT, ROOT, PortableEnvError, cached_venv, requirements


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

    Flower's commands are started through this interpreter (``python -c``) by
    :mod:`onnxblocks.federated.deployment`, never through the venv's console scripts.

    Raises:
        PortableEnvError: when the interpreter is missing or the environment cannot be built.
    """
    probe = (
        "import flwr; from onnxruntime.capi import _pybind_state as C; "
        "assert not hasattr(C, 'Module'), 'training build'"
    )
    wanted = [*requirements(), flower_requirement()]
    return cached_venv(
        "py313-flower", b"flower", wanted, probe, "onnxblocks' dependencies and Flower"
    )


def checkout_pythonpath() -> str:
    """``PYTHONPATH`` that makes this checkout's onnxblocks importable in the 3.13 environment."""
    return os.fspath(ROOT)


if __name__ == "__main__":
    print(ensure_python313_flower())
    sys.exit(0)

"""A cached Python 3.13 environment with stock onnxruntime, and worker scripts run in it (JSON in, JSON out).

The environment is what ``pip install onnxblocks`` gives on Python 3.13: the
project's dependencies, read from ``pyproject.toml`` with their environment
markers, so stock ``onnxruntime`` comes in instead of onnxruntime-training. The
package itself is not installed: the worker imports it from this checkout
(``PYTHONPATH``), so the environment stays valid while the code changes.

It is built once per list of dependencies (their hash is in the directory name) under
``~/.cache/onnxblocks-test/`` (``$XDG_CACHE_HOME`` respected), in a temporary
directory renamed into place, so concurrent test sessions never see half an
environment. The interpreter comes from ``$ONNXBLOCKS_PYTHON313``, pyenv
(``~/.pyenv/versions/3.13*``, ``pyenv which python3.13``) or ``python3.13`` on the PATH;
without one, :func:`ensure_python313` raises a :class:`PortableEnvError` that says how
to get it (the tests fail with it; they never skip).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

from support import venvs
from support.cache_lock import cache_dir
from support.json_child import json_answer

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
PYPROJECT = ROOT / "pyproject.toml"
WANTED = (3, 13)


class PortableEnvError(RuntimeError):
    """The Python 3.13 environment with stock onnxruntime cannot be had."""


#: Why each rejected candidate was rejected, for the error of :func:`find_python313`.
_REJECTED: dict[str, str] = {}


def _version(python: str | os.PathLike) -> tuple[int, int] | None:
    try:
        done = subprocess.run(
            [os.fspath(python), "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        out = done.stdout.split()
        if done.returncode != 0 or len(out) != 2:
            _REJECTED[os.fspath(python)] = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
            return None
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        _REJECTED[os.fspath(python)] = f"{type(exc).__name__}: {exc}"
        return None


def find_python313() -> Path:
    """A CPython 3.13 interpreter.

    Raises:
        PortableEnvError: when none is found, with how to install one.
    """
    # found and probed by the pytest-xdist controller before the workers started (tests/conftest.py)
    handed = os.environ.get("ONNXBLOCKS_PYTHON313_PROBED")
    if handed and handed == os.environ.get("ONNXBLOCKS_PYTHON313") and Path(handed).exists():
        return Path(handed)
    candidates: list[Path] = []
    if os.environ.get("ONNXBLOCKS_PYTHON313"):
        candidates.append(Path(os.environ["ONNXBLOCKS_PYTHON313"]))
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates += sorted((pyenv_root / "versions").glob("3.13*/bin/python3.13"))
    pyenv = shutil.which("pyenv") or (pyenv_root / "bin" / "pyenv")
    try:
        found = subprocess.run(
            [os.fspath(pyenv), "which", "python3.13"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.strip()
        if found:
            candidates.append(Path(found))
    except OSError:
        pass
    if shutil.which("python3.13"):
        candidates.append(Path(shutil.which("python3.13")))  # type: ignore[arg-type]
    # two rounds: a probe can fail for a moment on a machine short of memory or processes
    for attempt in range(2):
        for candidate in candidates:
            if candidate.exists() and _version(candidate) == WANTED:
                return candidate
        if attempt == 0:
            time.sleep(2)
    tried = "; ".join(f"{path}: {why}" for path, why in _REJECTED.items()) or "none"
    raise PortableEnvError(
        f"(candidates {[os.fspath(c) for c in candidates]}, rejected: {tried}; "
        f"PATH={os.environ.get('PATH')!r}, HOME={os.environ.get('HOME')!r}) "
        "The portable-runtime tests need CPython 3.13 (stock onnxruntime, no onnxruntime-training wheel), and none "
        f"was found (looked at $ONNXBLOCKS_PYTHON313, {pyenv_root}/versions/3.13*, `pyenv which python3.13`, "
        "python3.13 on PATH). Install one with `pyenv install 3.13.0`, or point $ONNXBLOCKS_PYTHON313 at it."
    )


def requirements() -> list[str]:
    """The project's dependencies with their environment markers, as ``pyproject.toml`` lists them."""
    with open(PYPROJECT, "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def ensure_python313() -> Path:
    """The Python of the cached 3.13 environment with stock onnxruntime, built on first use.

    Raises:
        PortableEnvError: when the interpreter is missing or the environment cannot be built.
    """
    probe = "from onnxruntime.capi import _pybind_state as C; assert not hasattr(C, 'Module'), 'training build'"
    return cached_venv(
        "py313-stock-ort",
        b"",
        requirements(),
        probe,
        "onnxblocks' dependencies (stock onnxruntime)",
    )


def cached_venv(prefix: str, salt: bytes, wanted: list[str], probe: str, what: str) -> Path:
    """The Python of a cached 3.13 venv with ``wanted`` installed, built on first use.

    The venv is ``<cache>/<prefix>-<hash>``, the hash of ``wanted``, the interpreter and ``salt``,
    built once and checked with ``probe`` (Python code) by :func:`support.venvs.cached_venv`.

    Raises:
        PortableEnvError: when the interpreter is missing or the environment cannot be built.
    """
    interpreter = find_python313()
    # what is installed decides the key, so edits elsewhere in pyproject.toml keep the cache
    key = hashlib.sha256(
        json.dumps(wanted).encode() + os.fspath(interpreter).encode() + salt
    ).hexdigest()[:16]
    return venvs.cached_venv(
        cache_dir() / f"{prefix}-{key}",
        interpreter,
        wanted,
        probe,
        what=what,
        error=PortableEnvError,
        marker={"interpreter": os.fspath(interpreter), "requirements": wanted},
    )


def run_worker(python: Path, payload: dict, timeout: int = 900) -> dict:
    """Run ``tests/support/portable_worker.py`` with ``payload`` (JSON on stdin) in ``python``; return its JSON answer.

    Raises:
        AssertionError: when the worker fails, with its error output.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.fspath(ROOT), os.fspath(TESTS)])}
    env.pop("PYTHONHOME", None)
    worker = [os.fspath(python), os.fspath(SUPPORT / "portable_worker.py")]
    return json_answer(
        worker, "the Python 3.13 worker", stdin=json.dumps(payload), env=env, timeout=timeout
    )


if __name__ == "__main__":
    print(ensure_python313())
    sys.exit(0)

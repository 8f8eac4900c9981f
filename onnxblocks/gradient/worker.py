"""ONNX Runtime's gradient builder from another Python, for a Python without onnxruntime-training
(3.13+).

onnxruntime-training (the build with ``GradientGraphBuilder`` and the training
kernels) has wheels for Python 3.10-3.12 only. On a newer Python,
``generate_artifacts`` still builds everything in-process (Blocks, losses,
lowering, checkpoint) and sends only ONNX Runtime's calls, bytes in and bytes out,
to :mod:`onnxblocks.gradient.worker_main` run by a worker Python:

* ``$ONNXBLOCKS_TRAINING_PYTHON`` when set: used as is when it has
  onnxruntime-training 1.19.2, else the base of the worker environment (it must be
  Python 3.10-3.12);
* else the newest Python 3.12, 3.11 or 3.10 found through pyenv
  (``$PYENV_ROOT/versions``), uv (``uv python find``) or the PATH, as the base of a
  cached environment ``<cache>/gradient-worker-<version>-<hash>`` with
  :data:`TRAINING_PACKAGE`, created on first use (with progress on stderr, once).

The cache is ``$ONNXBLOCKS_CACHE``, else ``$XDG_CACHE_HOME/onnxblocks``, else
``~/.cache/onnxblocks``. ``$ONNXBLOCKS_GRADIENT_BUILDER`` (``in-process`` or
``worker``) overrides the choice :func:`uses_worker` makes from the installed
onnxruntime.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import GradientError, InvalidValueError, TrainingBuildRequiredError
from onnxblocks.gradient.worker_process import Channel, exchange_once

#: What the worker environment installs.
TRAINING_PACKAGE = "onnxruntime-training-cpu==1.19.2"
#: The onnxruntime-training version the worker must have.
TRAINING_VERSION = "1.19.2"
#: The Pythons onnxruntime-training 1.19.2 has wheels for, newest first.
TRAINING_PYTHONS = ((3, 12), (3, 11), (3, 10))
#: Seconds one worker call may take (the gradient builder on a large skeleton graph).
CALL_TIMEOUT_S = 1800.0


def cache_root() -> Path:
    """The onnxblocks cache: ``$ONNXBLOCKS_CACHE``, ``$XDG_CACHE_HOME/onnxblocks`` or
    ``~/.cache/onnxblocks``.
    """
    if os.environ.get("ONNXBLOCKS_CACHE"):
        return Path(os.environ["ONNXBLOCKS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnxblocks"


def uses_worker() -> bool:
    """True when ONNX Runtime's gradient builder runs in a worker Python rather than in this
    process.

    Raises:
        InvalidValueError: for an unknown ``$ONNXBLOCKS_GRADIENT_BUILDER``.
    """
    choice = os.environ.get("ONNXBLOCKS_GRADIENT_BUILDER", "").strip().lower()
    if choice in ("worker", "in-process"):
        return choice == "worker"
    if choice:
        raise InvalidValueError(
            f"$ONNXBLOCKS_GRADIENT_BUILDER is {choice!r}: set it to 'in-process' or 'worker', or "
            "unset it."
        )
    from onnxblocks._core.ort import has_training_build

    return not has_training_build()


def python_version(python: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(major, minor)`` of an interpreter, or None when it does not run."""
    try:
        out = subprocess.run(
            [os.fspath(python), "-I", "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def candidate_pythons(
    versions: Sequence[tuple[int, int]] = TRAINING_PYTHONS,
) -> list[tuple[Path, str]]:
    """Interpreters of ``versions`` on this machine, ``(path, where found)``, in the order they are
    tried.

    pyenv's versions first, then uv's, then the PATH; the newest version first within each.
    """
    found: list[tuple[Path, str]] = []
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    uv = shutil.which("uv")
    for major, minor in versions:
        name = f"python{major}.{minor}"
        for path in sorted(
            (pyenv_root / "versions").glob(f"{major}.{minor}.*/bin/{name}"), reverse=True
        ):
            found.append((path, "pyenv"))
        if uv is not None:
            try:
                done = subprocess.run(
                    [uv, "python", "find", f"{major}.{minor}"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                if done.returncode == 0 and done.stdout.strip():
                    found.append((Path(done.stdout.strip()), "uv"))
            except (OSError, subprocess.SubprocessError):
                pass
        on_path = shutil.which(name)
        if on_path is not None and ".pyenv/shims" not in on_path:
            found.append((Path(on_path), "PATH"))
    unique: dict[Path, tuple[Path, str]] = {}
    for path, where in found:
        unique.setdefault(path, (path, where))
    return list(unique.values())


def _install_hint() -> str:
    return (
        "Install one of Python 3.12, 3.11 or 3.10 (`uv python install 3.12`, `pyenv install "
        "3.12`, or your system's "
        "python3.12 package) or point $ONNXBLOCKS_TRAINING_PYTHON at one; onnxblocks then "
        "creates an environment "
        f"with {TRAINING_PACKAGE} for the gradient builder on first use. Or generate on Python "
        "3.10-3.12, where "
        "`pip install onnxblocks` brings onnxruntime-training."
    )


def find_base_python() -> tuple[Path, tuple[int, int], str]:
    """The interpreter the worker runs on or is created from: ``(path, version, where found)``.

    Raises:
        TrainingBuildRequiredError: when none is found, saying what to install.
    """
    chosen = os.environ.get("ONNXBLOCKS_TRAINING_PYTHON")
    if chosen:
        version = python_version(chosen)
        if version is None:
            raise TrainingBuildRequiredError(
                f"$ONNXBLOCKS_TRAINING_PYTHON is {chosen!r}, which does not run as a Python "
                "interpreter. " + _install_hint()
            )
        if version not in TRAINING_PYTHONS:
            raise TrainingBuildRequiredError(
                f"$ONNXBLOCKS_TRAINING_PYTHON ({chosen}) is Python {version[0]}.{version[1]}; "
                f"onnxruntime-training {TRAINING_VERSION} needs Python 3.10-3.12. "
                + _install_hint()
            )
        return Path(chosen), version, "$ONNXBLOCKS_TRAINING_PYTHON"
    for path, where in candidate_pythons():
        version = python_version(path)
        if version in TRAINING_PYTHONS:
            assert version is not None
            return path, version, where
    raise TrainingBuildRequiredError(
        f"ONNX Runtime's gradient builder needs onnxruntime-training {TRAINING_VERSION}, which "
        "has no wheel for "
        f"Python {sys.version_info.major}.{sys.version_info.minor}, and no Python 3.10-3.12 to "
        "run it was found "
        "($ONNXBLOCKS_TRAINING_PYTHON, pyenv, uv, python3.12/3.11/3.10 on the PATH). "
        + _install_hint()
    )


def probe(python: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What onnxruntime ``python`` has (``{"python", "onnxruntime", "training_build"}``), or None
    without one.
    """
    try:
        header, _ = exchange_once(Path(python), {"task": "probe"}, [], timeout=120)
    except GradientError:
        return None
    return header


def _progress(message: str) -> None:
    print(f"onnxblocks: {message}", file=sys.stderr, flush=True)


def _run_logged(argv: list[str], what: str) -> None:
    """Run ``argv``, echoing its output to stderr as progress; raise TrainingBuildRequiredError
    when it fails.
    """
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
    except OSError as exc:
        raise TrainingBuildRequiredError(
            f"{what} could not start ({exc}). " + _install_hint()
        ) from None
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        if line.strip():
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    if process.wait() != 0:
        tail = "\n".join(lines[-20:])
        raise TrainingBuildRequiredError(
            f"{what} failed (exit {process.returncode}): {' '.join(argv)}\n{tail}\n"
            f"It needs a package index with {TRAINING_PACKAGE} (pip's configuration is used). "
            + _install_hint()
        )


def _create_environment(base: Path, version: tuple[int, int], target: Path) -> None:
    staging = target.parent / f".{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _progress(
        "ONNX Runtime's gradient builder needs onnxruntime-training, which has no wheel for "
        "Python "
        f"{sys.version_info.major}.{sys.version_info.minor}: creating a Python "
        f"{version[0]}.{version[1]} environment "
        f"with {TRAINING_PACKAGE} in {target} (once; it takes a minute or two)."
    )
    try:
        _progress(f"[1/3] creating the virtual environment from {base}")
        _run_logged(
            [os.fspath(base), "-m", "venv", os.fspath(staging)], "Creating the worker environment"
        )
        python = staging / "bin" / "python"
        _progress(f"[2/3] installing {TRAINING_PACKAGE}")
        _run_logged(
            [
                os.fspath(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                TRAINING_PACKAGE,
            ],
            f"Installing {TRAINING_PACKAGE}",
        )
        _progress("[3/3] checking the gradient builder")
        found = probe(python)
        if (
            not found
            or not found.get("training_build")
            or found.get("onnxruntime") != TRAINING_VERSION
        ):
            raise TrainingBuildRequiredError(
                f"The worker environment {staging} does not have onnxruntime-training "
                f"{TRAINING_VERSION} "
                f"(it has {found}). " + _install_hint()
            )
        (staging / "ready").write_text(
            json.dumps({"base": os.fspath(base), "package": TRAINING_PACKAGE}) + "\n"
        )
        try:
            staging.rename(target)
        except OSError:  # another process finished first: use its environment
            if not (target / "ready").exists():
                raise
        _progress(f"the gradient-builder environment is ready: {target}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def has_training_build(python: str | os.PathLike[str]) -> bool:
    """True when ``python`` imports onnxruntime-training :data:`TRAINING_VERSION`."""
    found = probe(python)
    return bool(
        found and found.get("training_build") and found.get("onnxruntime") == TRAINING_VERSION
    )


def environment_dir(
    base: Path, version: tuple[int, int], cache: str | os.PathLike[str] | None = None
) -> Path:
    """The cached worker environment created from ``base`` (it may not exist yet)."""
    key = hashlib.sha256(f"{os.path.realpath(base)}\0{TRAINING_PACKAGE}".encode()).hexdigest()[:12]
    return (
        Path(cache if cache is not None else cache_root())
        / f"gradient-worker-{version[0]}.{version[1]}-{key}"
    )


def environment_ready(target: Path) -> bool:
    """True when the worker environment ``target`` was created completely."""
    return (target / "ready").exists() and (target / "bin" / "python").exists()


@functools.lru_cache(maxsize=8)
def _worker_python(chosen: str | None, cache: str) -> Path:
    base, version, _ = find_base_python()
    if chosen and has_training_build(base):
        return base
    target = environment_dir(base, version, cache)
    python = target / "bin" / "python"
    if not environment_ready(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        _create_environment(base, version, target)
    return python


def worker_python() -> Path:
    """The worker's interpreter (it has onnxruntime-training), its environment created on first use.

    Raises:
        TrainingBuildRequiredError: when no Python 3.10-3.12 is found or the environment cannot be
        created.
    """
    return _worker_python(
        os.environ.get("ONNXBLOCKS_TRAINING_PYTHON") or None, os.fspath(cache_root())
    )


@functools.lru_cache(maxsize=8)
def _channel(python: Path) -> Channel:
    channel = Channel(
        python, f"Delete its environment (under {cache_root()}) to have it created again."
    )
    atexit.register(channel.close)
    return channel


def call(
    task: str, fields: dict[str, Any], blobs: Sequence[bytes] = ()
) -> tuple[dict[str, Any], list[bytes]]:
    """Run ``task`` in the worker; return its answer header (``error`` and ``stage`` on failure) and
    bytes.

    Raises:
        TrainingBuildRequiredError: when the worker Python cannot be had.
        GradientError: when the worker crashes or does not answer.
    """
    return _channel(worker_python()).exchange({"task": task, **fields}, blobs, CALL_TIMEOUT_S)

"""The shape every cache the tests build shares: a folder under ``~/.cache/onnxblocks-test`` that is
complete once it holds a ``ready`` marker.

:func:`cached_dir` builds such a folder once, across processes: under
:func:`support.cache_lock.cache_lock` it fills ``.building-<name>-<pid>`` beside the target, writes
the marker and renames the folder into place, so a concurrent session or pytest-xdist worker never
sees half a cache nor builds a second one. :func:`cached_venv` is that for a venv (create, pip
install, probe); :func:`run` runs a build command and raises the caller's error class with the
command to reproduce a failure. Each caller keeps its own cache key, so the folders' names and
contents do not depend on this module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from support.cache_lock import cache_lock
from support.json_child import finished

READY = "ready"
PIP_INSTALL = ("-m", "pip", "install", "-q", "--disable-pip-version-check")


def run(
    cmd: list[str],
    what: str,
    error: type[Exception],
    *,
    stdin: str | None = None,
    cwd: Path | None = None,
    timeout: int = 900,
    env: Mapping[str, str] | None = None,
) -> str:
    """``cmd``'s standard output; ``error`` naming ``what`` and the command when it fails.

    The child runs without this process's ``PYTHONPATH`` and ``PYTHONHOME`` (another interpreter's
    stdlib on them breaks its imports), with ``env`` added.
    """
    child = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    child.update(env or {})
    try:
        done = finished(cmd, stdin=stdin, cwd=cwd, env=child, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise error(f"{what} did not finish in {timeout} s: {' '.join(cmd)}") from None
    if done.returncode != 0:
        raise error(
            f"{what} failed (exit {done.returncode}). Reproduce with:\n  {' '.join(cmd)}"
            + (f"  <<< '{stdin}'" if stdin else "")
            + f"\n{done.stderr[-4000:]}"
        )
    return done.stdout


def cached_dir(
    target: Path,
    build: Callable[[Path], str],
    *,
    lock: str | None = None,
    needs: tuple[str, ...] = (),
) -> Path:
    """``target``, built on first use: ``build(staging)`` fills an empty staging folder and returns
    the ``ready`` marker's text.

    ``target`` counts as built when it holds the marker and every path in ``needs``. One process
    builds while the others wait on the lock ``lock`` (``target``'s name by default).
    """

    def complete() -> bool:
        return all((target / p).exists() for p in (READY, *needs))

    if complete():
        return target
    with cache_lock(lock or target.name):
        if complete():
            return target
        staging = target.parent / f".building-{target.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            marker = build(staging)
            (staging / READY).write_text(marker)
            shutil.rmtree(target, ignore_errors=True)  # an unfinished folder is never kept
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def cached_venv(
    venv: Path,
    interpreter: str | os.PathLike[str],
    wanted: list[str],
    probe: str,
    *,
    what: str,
    error: type[Exception],
    marker: dict,
) -> Path:
    """The Python of the venv ``venv`` made by ``interpreter`` with ``wanted`` installed, built on
    first use and checked with ``probe`` (Python code) before it is marked ready with ``marker``.

    Raises:
        error: when the venv cannot be built, with the command that failed.
    """
    python = Path("bin") / "python"

    def build(staging: Path) -> str:
        run(
            [os.fspath(interpreter), "-m", "venv", os.fspath(staging)],
            f"Creating {venv.name}",
            error,
        )
        pip_install(staging / python, wanted, f"Installing {what} into {venv.name}", error)
        run([os.fspath(staging / python), "-c", probe], f"Checking {venv.name}", error)
        return json.dumps(marker)

    # a venv's scripts name its staging path; python -m works from anywhere, so only the
    # interpreter is used
    return cached_dir(venv, build, needs=(os.fspath(python),)) / python


def pip_install(python: Path, wanted: list[str], what: str, error: type[Exception]) -> None:
    """``python -m pip install`` of ``wanted`` (pip's own configuration and cache)."""
    run([os.fspath(python), *PIP_INSTALL, *wanted], what, error, timeout=1800)

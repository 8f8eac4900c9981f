"""The wheel a user installs: built from this checkout, installed into a fresh venv outside it.

:func:`build_wheel` copies the files git knows (tracked, and untracked but not ignored)
into a temporary source tree and runs ``pip wheel`` there (no build isolation: the
test venv's setuptools), so the checkout is never written to and nothing but its
files goes in. :func:`fresh_venv` creates a venv with this interpreter and installs
the wheel with its dependencies (pip's configuration and cache are used), so the
package is imported from ``site-packages``, never from the checkout.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from support import venvs

ROOT = Path(__file__).resolve().parents[2]


class WheelEnvError(RuntimeError):
    """The wheel cannot be built or installed."""


def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: int = 900) -> str:
    return venvs.run(cmd, what, WheelEnvError, cwd=cwd, timeout=timeout)


def source_files() -> list[str]:
    """The checkout's files as git lists them (tracked, and untracked but not ignored)."""
    out = _run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        "git ls-files",
        cwd=ROOT,
    )
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


def build_wheel(directory: Path) -> Path:
    """Build the onnxblocks wheel from a copy of the checkout into ``directory``; return its path."""
    source = directory / "source"
    for name in source_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    dist = directory / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        "Building the wheel",
    )
    wheels = sorted(dist.glob("onnxblocks-*.whl"))
    if len(wheels) != 1:
        raise WheelEnvError(
            f"pip wheel wrote {[w.name for w in wheels]} into {dist}, expected one onnxblocks wheel"
        )
    return wheels[0]


def fresh_venv(directory: Path, wheel: Path) -> Path:
    """A new venv in ``directory`` with ``wheel`` and its dependencies installed; its Python."""
    _run([sys.executable, "-m", "venv", str(directory)], "Creating the venv")
    python = directory / "bin" / "python"
    venvs.pip_install(python, [str(wheel)], "pip install wheel", WheelEnvError)
    return python

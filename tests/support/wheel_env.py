"""The wheel a user installs: built from this checkout, installed into a fresh venv outside it.

:func:`build_wheel` copies the files git knows (tracked, and untracked but not ignored)
into a temporary source tree and runs ``pip wheel`` there (no build isolation: the
test venv's setuptools), so the checkout is never written to and nothing but its
files goes in. :func:`fresh_venv` creates a venv with this interpreter and installs
the wheel into it with pip (pip's configuration and cache are used), so the package
is imported from ``site-packages``, never from the checkout.

The wheel's dependencies are not unpacked again (that was 30 s of CPU, most of the
test's setup): the distributions its metadata requires, and theirs, are linked from
this venv into a folder the fresh venv reads through a ``.pth`` file. Only what the
wheel declares is there, so a missing or wrongly pinned dependency still fails pip's
check or the import, as a fresh install would.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

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


def _requires(lines: list[str]) -> list[str]:
    """The names of the distributions ``Requires-Dist`` lines ask for on this interpreter (no
    extras)."""
    wanted = (Requirement(line) for line in lines)
    return [r.name for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})]


def wheel_requires(wheel: Path) -> list[str]:
    """The distributions ``wheel`` requires on this interpreter, with theirs (names as written)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    pending = _requires([v for k, _, v in (line.partition(": ") for line in metadata.splitlines())
                         if k == "Requires-Dist"])  # fmt: skip
    seen: dict[str, str] = {}
    while pending:
        name = pending.pop()
        key = name.lower().replace("_", "-").replace(".", "-")
        if key not in seen:
            seen[key] = name
            pending += _requires(importlib.metadata.distribution(name).requires or [])
    return sorted(seen.values())


def link_requires(wheel: Path, into: Path) -> None:
    """Link each distribution ``wheel`` requires (:func:`wheel_requires`) from this venv into
    ``into``: its top-level packages, modules and ``.dist-info`` (never its scripts)."""
    into.mkdir(parents=True)
    for name in wheel_requires(wheel):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise WheelEnvError(
                f"The wheel requires {name}, which this venv lacks: install the project's "
                "dependencies (pip install -e .[test])."
            ) from exc
        site = Path(dist.locate_file(""))
        tops = {p.parts[0] for p in dist.files or () if p.parts and p.parts[0] != ".."}
        for top in sorted(tops - {"__pycache__"}):
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)


def fresh_venv(directory: Path, wheel: Path) -> Path:
    """A new venv in ``directory`` with ``wheel`` installed by pip, its dependencies linked from this
    venv (module docstring); its Python."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(directory)], "Creating the venv")
    python = directory / "bin" / "python"
    link_requires(wheel, directory / "requires")
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                "Locating the venv's site-packages").strip()  # fmt: skip
    Path(site, "requires.pth").write_text(f"{directory / 'requires'}\n")
    # this venv's pip installs into the fresh one (pip >= 22.3), so no pip is installed there
    _run([sys.executable, "-m", "pip", "--python", str(python), *venvs.PIP_INSTALL[2:],
          str(wheel)], "pip install wheel")  # fmt: skip
    return python

"""System tools the tests need, installed from Debian's packages when missing.

A test that needs ``flatc`` or Chromium calls :func:`debian_tool`: it returns the
tool's path, running ``apt-get install`` first when the tool is missing and the
user is root. Anywhere else it raises :class:`SystemToolError` with the command to
run, which the tests turn into a failure (never a skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from support.cache_lock import cache_lock

_LOCK = threading.Lock()


class SystemToolError(RuntimeError):
    """A system tool is missing and cannot be installed here."""


def debian_tool(package: str, candidates: Sequence[str], why: str) -> Path:
    """The first of ``candidates`` (names on the PATH or absolute paths) that exists, installing ``package`` if none.

    Args:
        package: The Debian package that provides the tool.
        candidates: Names (looked up on the PATH) or absolute paths of the tool.
        why: What the tool is for, for the error message.

    Raises:
        SystemToolError: if the tool is missing and apt-get cannot install it (not root, no apt-get, or it failed).
    """

    def find() -> Path | None:
        for candidate in candidates:
            found = (
                candidate
                if os.path.isabs(candidate) and os.path.exists(candidate)
                else shutil.which(candidate)
            )
            if found:
                return Path(found)
        return None

    with _LOCK, cache_lock("apt-get"):  # apt-get in two processes at once fails on dpkg's lock
        if (found := find()) is not None:
            return found
        command = f"apt-get install -y {package}"
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise SystemToolError(
                f"{candidates[0]} is not installed ({why}). Install Debian's package: `{command}`."
            )
        for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
            done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                raise SystemToolError(
                    f"{candidates[0]} is missing ({why}) and `{' '.join(step)}` failed (exit {done.returncode}):\n"
                    f"{done.stderr[-2000:]}"
                )
        if (found := find()) is None:
            raise SystemToolError(
                f"apt-get installed {package} but {candidates[0]} is still not there."
            )
        return found

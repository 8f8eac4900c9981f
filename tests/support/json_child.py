"""Child processes of the tests: :func:`finished` runs one to its end with its output captured;
:func:`json_answer` runs one that answers with a JSON line (the workers in other venvs, Node
scripts) and returns the last line of its output that starts with ``{``, or fails the test with
its exit status and the end of its output.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path


def finished(
    cmd: list[str],
    *,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``cmd`` run to its end (in ``env``, default this process's), its output captured as text.

    Raises:
        subprocess.TimeoutExpired: when it runs past ``timeout`` seconds.
    """
    return subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else dict(env),
        check=False,
    )


def json_answer(
    cmd: list[str],
    what: str,
    *,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> dict:
    """The JSON answer ``cmd`` prints (in ``env``, default this process's).

    Raises:
        AssertionError: when it fails or prints no JSON line, naming ``what``, with its output.
    """
    done = finished(cmd, stdin=stdin, cwd=cwd, env=env, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(
            f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(
            f"{what} printed no JSON answer:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])

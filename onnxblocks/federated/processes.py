"""The processes of a local deployment: free ports, process trees, and stopping them all.

Flower's SuperLink and SuperNodes start helpers (SuperExec, ``flwr-serverapp``, ``flwr-clientapp``)
in sessions of their own, which a signal to the parent's process group does not reach. So a tree
is stopped by walking it: :func:`descendants` (Linux ``/proc``, else psutil when installed) and
:func:`terminate_tree` (SIGTERM to every process of the trees, helpers started meanwhile included,
then SIGKILL to what still runs after a grace period).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from onnxblocks._core.errors import StateError

#: Seconds a process gets between SIGTERM and SIGKILL.
GRACE_S = 5.0


class DeploymentError(StateError):
    """The deployment engine could not start, or a run on it did not finish."""


def free_port(taken: Iterable[int] = ()) -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now, and not one of ``taken``."""
    avoid = set(taken)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    raise DeploymentError("No free TCP port was found on 127.0.0.1 in 100 tries.")


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _children_table() -> dict[int, list[int]]:
    """``{ppid: [pid, ...]}`` of every process (Linux ``/proc``; psutil elsewhere, else empty)."""
    table: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) >= 2 and fields[0] != "Z":
                table.setdefault(int(fields[1]), []).append(int(entry.name))
        return table
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        return table
    for p in psutil.process_iter(["pid", "ppid"]):
        table.setdefault(int(p.info["ppid"]), []).append(int(p.info["pid"]))
    return table


def descendants(pid: int) -> list[int]:
    """The pids of every living descendant of ``pid`` (children first level by level)."""
    table = _children_table()
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = table.get(todo.pop(0), [])
        found += [k for k in kids if k not in found]
        todo += kids
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            text = stat.read_text()
        except OSError:
            return False
        return text[text.rfind(")") + 2 :].split()[:1] != ["Z"]
    return True


def send_signal(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_tree(pids: Sequence[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM ``pids`` and all their descendants; SIGKILL whatever still runs after ``grace_s`` seconds."""
    everyone: list[int] = []
    for pid in pids:
        for p in [pid, *descendants(pid)]:
            if p not in everyone:
                everyone.append(p)
    send_signal(everyone, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        # helpers started after the first sweep (a SuperExec launching a ClientApp) are caught too
        late = [d for pid in pids for d in descendants(pid) if d not in everyone]
        send_signal(late, signal.SIGTERM)
        everyone += late
        if not any(alive(p) for p in everyone):
            return
        time.sleep(0.1)
    send_signal([p for p in everyone if alive(p)], signal.SIGKILL)


class Process:
    """One process a deployment started, with its output going to a log file."""

    def __init__(self, name: str, command: list[str], log: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.log = log
        self._log_file: IO[bytes] = open(log, "ab")  # closed in close()
        self._log_file.write(f"$ {shlex.join(command)}\n".encode())
        self._log_file.flush()
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,  # Ctrl-C at a terminal reaches onnxblocks, which stops everything in order
        )

    @property
    def pid(self) -> int:
        return int(self.popen.pid)

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self.popen.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._log_file.close()


#: Flower's console scripts the shims stand in for.
COMMANDS = ("flower-superlink", "flower-supernode", "flower-superexec", "flwr-serverapp", "flwr-clientapp", "flwr")

_SHIM = """#!/bin/sh
exec {python} -c 'import sys
from importlib.metadata import entry_points
(ep,) = entry_points(group="console_scripts", name="{name}")
sys.argv[0] = "{name}"
sys.exit(ep.load()())' "$@"
"""


def write_shims(folder: Path, interpreter: str) -> Path:
    """``folder`` with one script per Flower command that runs it under ``interpreter`` (written once).

    Flower's SuperLink and SuperNodes start SuperExec, ``flwr-serverapp`` and ``flwr-clientapp`` by name
    from the PATH; with this folder first on it they run under ``interpreter``, whatever its venv's
    console scripts say (a venv built elsewhere and moved has scripts naming its old path).
    """
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for name in COMMANDS:
            script = folder / name
            script.write_text(_SHIM.format(python=shlex.quote(interpreter), name=name), encoding="utf-8")
            script.chmod(0o755)
    return folder


def command_line(pid: int) -> str:
    """The command line of process ``pid`` (empty when it is gone or unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""

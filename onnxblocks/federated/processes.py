"""The processes of a local deployment: free ports, process trees, and stopping them all.

Flower's SuperLink and SuperNodes start helpers (SuperExec, ``flwr-serverapp``, ``flwr-clientapp``)
in sessions of their own, which a signal to the parent's process group does not reach. So a tree
is stopped by walking it: :func:`descendants` (Linux ``/proc``, else psutil when installed) and
:func:`terminate_tree` (SIGTERM to every process of the trees, helpers started meanwhile included,
then SIGKILL to what still runs after a grace period). :func:`environment_pids` finds the processes
a
deployment started that no tree holds any more (one whose parent was interrupted while starting it).
Waits here end early on a stop signal (:mod:`onnxblocks._core.interrupts`).
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
from onnxblocks._core.interrupts import deferred, raise_if_stopping, shielded

#: Seconds a process gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
#: Flower's setting of the seconds between a SuperExec's looks for an app to start (1 s by
#: default), and the value deployments and simulations give it unless the environment sets it.
SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_S = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.25"


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
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its
            # last ')'
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


def _trees(pids: Iterable[int], table: Mapping[int, list[int]]) -> list[int]:
    """``pids`` and every descendant of them in ``table``, each once (level by level)."""
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop(0)
        if pid not in found:
            found.append(pid)
            todo += table.get(pid, [])
    return found


def descendants(pid: int) -> list[int]:
    """The pids of every living descendant of ``pid`` (children first level by level)."""
    return _trees([pid], _children_table())[1:]


def environment_pids(name: str, value: str) -> list[int]:
    """The pids of the living processes whose environment sets ``name`` to ``value`` (Linux
    ``/proc``; else none).
    """
    entry = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (
                entry in (proc / "environ").read_bytes().split(b"\0")
                and int(proc.name) != os.getpid()
            ):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return [pid for pid in found if alive(pid)]


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
    """SIGTERM ``pids`` and all their descendants; SIGKILL whatever still runs after ``grace_s``
    seconds.

    Returns once they are gone (a SIGKILL takes effect when the process is next scheduled; 2 s at
    most).
    """
    # one reading of /proc per sweep, not one per process: on a loaded machine a reading takes 0.1 s
    # or more
    everyone = _trees(pids, _children_table())
    send_signal(everyone, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        # helpers started after the first sweep (a SuperExec launching a ClientApp) are caught too
        late = [p for p in _trees(everyone, _children_table()) if p not in everyone]
        send_signal(late, signal.SIGTERM)
        everyone += late
        if not any(alive(p) for p in everyone):
            return
        time.sleep(0.1)
    send_signal([p for p in everyone if alive(p)], signal.SIGKILL)
    killed = (
        time.monotonic() + 2.0
    )  # a killed process dies when next scheduled: gone when this returns
    while time.monotonic() < killed and any(alive(p) for p in everyone):
        time.sleep(0.02)


def run_captured(
    command: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end and capture its output; stop it on a stop signal or after
    ``timeout`` seconds.

    Raises:
        subprocess.TimeoutExpired: when it runs longer than ``timeout`` (it is killed).
        KeyboardInterrupt: on a stop signal (it is killed).
    """
    deadline = time.monotonic() + timeout
    child: subprocess.Popen[str] | None = None
    try:
        with deferred():
            child = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(env),
            )
        while True:
            # short waits, so that a stop signal whose exception was swallowed is seen at once
            try:
                out, err = child.communicate(
                    timeout=min(0.5, max(deadline - time.monotonic(), 0.01))
                )
                break
            except subprocess.TimeoutExpired:
                raise_if_stopping()
                if time.monotonic() > deadline:
                    raise
    except BaseException:
        if child is not None:
            with shielded():  # a second Ctrl-C must not leave it running
                child.kill()
                child.wait()
        raise
    finally:
        if child is not None:
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


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
            # Ctrl-C at a terminal reaches onnxblocks, which stops everything in order
            start_new_session=True,
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
COMMANDS = (
    "flower-superlink",
    "flower-supernode",
    "flower-superexec",
    "flwr-serverapp",
    "flwr-clientapp",
    "flwr",
)

#: Seconds a SuperNode waits before it asks the SuperLink for a message again after finding none.
SUPERNODE_POLL_S = 0.5

#: Flower's SuperNode sleeps 3 s after each pull that finds no message, so every message of a
#: round waits up to 3 s before its ClientApp starts; the SuperNode's shim caps the sleeps of its
#: pull loop at SUPERNODE_POLL_S (a Flower without that module is left as it is).
_SUPERNODE_PRELUDE = f"""
try:
    import time
    import flwr.supernode.start_client_internal as node_loop
except ImportError:
    node_loop = None
class CappedSleep:
    def __getattr__(self, attr):
        return getattr(time, attr)
    def sleep(self, seconds):
        time.sleep(min(seconds, {SUPERNODE_POLL_S}))
if getattr(node_loop, "time", None) is time:
    node_loop.time = CappedSleep()"""

_SHIM = """#!/bin/sh
exec {python} -c 'import sys{prelude}
from importlib.metadata import entry_points
(ep,) = entry_points(group="console_scripts", name="{name}")
sys.argv[0] = "{name}"
sys.exit(ep.load()())' "$@"
"""


def write_shims(folder: Path, interpreter: str) -> Path:
    """``folder`` with one script per Flower command that runs it under ``interpreter`` (written
    once).

    Flower's SuperLink and SuperNodes start SuperExec, ``flwr-serverapp`` and ``flwr-clientapp`` by
    name
    from the PATH; with this folder first on it they run under ``interpreter``, whatever its venv's
    console scripts say (a venv built elsewhere and moved has scripts naming its old path).
    """
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for name in COMMANDS:
            script = folder / name
            script.write_text(
                _SHIM.format(
                    python=shlex.quote(interpreter),
                    name=name,
                    prelude=_SUPERNODE_PRELUDE if name == "flower-supernode" else "",
                ),
                encoding="utf-8",
            )
            script.chmod(0o755)
    return folder


def command_line(pid: int) -> str:
    """The command line of process ``pid`` (empty when it is gone or unreadable)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""

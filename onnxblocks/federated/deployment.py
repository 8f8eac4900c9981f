"""Flower's deployment engine on localhost: a SuperLink and SuperNodes started with Flower's own
commands.

:class:`LocalDeployment` starts ``flower-superlink --insecure`` and one ``flower-supernode
--insecure``
per :class:`NodeSpec` (its ``--node-config``, e.g. ``data-path="a.npz"``), all on free ports of
127.0.0.1, then submits a Flower app with ``flwr run`` and follows it to the end
(:meth:`LocalDeployment.run`). Every process logs to a file of the run directory
(``logs/superlink.log``, ``logs/supernode-<i>.log``, ``logs/run.log``), and ``flwr`` reads its
connection from a ``config.toml`` there (``FLWR_HOME``), so nothing in ``~/.flwr`` is touched.

Stopping is the point of the class: :meth:`LocalDeployment.stop` (on leaving the ``with`` block, on
success, error and ``KeyboardInterrupt``) stops every process tree it started, helpers that Flower
starts in sessions of their own included (:mod:`onnxblocks.federated.processes`), and every process
whose ``FLWR_HOME`` is its own (one started as the interrupt came). Its waits end within half a
second
of a stop signal inside :func:`onnxblocks._core.interrupts.stop_on_signals`.

A SuperNode may run under another interpreter (``NodeSpec.python``, e.g. a Python 3.13 venv with
stock onnxruntime): Flower's commands start through ``python -c`` shims, so its SuperExec and
ClientApp run under that interpreter too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, StateError
from onnxblocks._core.interrupts import raise_if_stopping, shielded
from onnxblocks.federated.flower_runs import CONNECTION, FlowerRuns
from onnxblocks.federated.processes import (
    SUPEREXEC_POLL_ENV,
    SUPEREXEC_POLL_S,
    DeploymentError,
    Process,
    alive,
    command_line,
    descendants,
    environment_pids,
    free_port,
    listening,
    terminate_tree,
    write_shims,
)
from onnxblocks.federated.project import ConfigValue, config_arg

logger = logging.getLogger("onnxblocks.federated")


@dataclass(frozen=True)
class NodeSpec:
    """One SuperNode.

    Attributes:
        node_config: Its ``--node-config`` (e.g. ``{"data-path": "a.npz"}``): what its ClientApp
        reads
            from ``context.node_config``.
        python: The interpreter it runs under (None: this one). flwr and onnxblocks must be
        importable there.
        env: Extra environment variables of the node and its ClientApp (e.g. ``PYTHONPATH``).
    """

    node_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    python: str | os.PathLike | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class LocalDeployment(FlowerRuns):
    """A SuperLink and SuperNodes on 127.0.0.1, started with Flower's own commands, stopped with
    everything they start.

    Use it as a context manager::

        with LocalDeployment([NodeSpec({"data-path": "a.npz"}), NodeSpec({"data-path": "b.npz"})],
        "run") as fed:
            outcome = fed.run(app_dir, timeout=600)

    Args:
        nodes: One :class:`NodeSpec` per SuperNode.
        run_dir: Where the logs, Flower's config and state go (created).
        startup_timeout: Seconds each process gets to listen on its port.
        env: Extra environment variables of every process.

    Raises:
        InvalidValueError: when ``nodes`` is empty.
        InvalidTypeError: when a node is not a :class:`NodeSpec`.
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        run_dir: str | os.PathLike,
        *,
        startup_timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        nodes = list(nodes)
        if not nodes:
            raise InvalidValueError(
                "LocalDeployment needs at least one NodeSpec (one SuperNode per client)."
            )
        for i, node in enumerate(nodes):
            if not isinstance(node, NodeSpec):
                raise InvalidTypeError(
                    f"LocalDeployment: nodes[{i}] is a {type(node).__name__}, not a NodeSpec."
                )
        self.nodes = nodes
        self.run_dir = Path(run_dir).resolve()
        self.logs = self.run_dir / "logs"
        self.home = self.run_dir / "flwr-home"
        self.startup_timeout = float(startup_timeout)
        self._env = dict(env or {})
        self.superlink: Process | None = None
        self.supernodes: list[Process] = []
        self._started: list[
            Process
        ] = []  # every process started, recorded as it starts: stop() stops them all
        self.port: int | None = None
        self._ports: list[int] = []
        self._runs = 0

    # ------------------------------------------------------------------ start

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the SuperLink and the SuperNodes, and wait until each listens on its port.

        Raises:
            DeploymentError: when a process exits or does not listen within ``startup_timeout``
                (the message holds the end of its log).
        """
        if self.superlink is not None:
            raise StateError("This LocalDeployment is started already; stop() it first.")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self._ports = []
        self.superlink = self._launch(
            "superlink", self._superlink_command, self.logs / "superlink.log", None, {}
        )
        self.port = self._ports[0]
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n',
            encoding="utf-8",
        )
        # the SuperNodes start side by side; each is then waited for (and moved if its port was
        # taken meanwhile)
        ports = []
        for i, node in enumerate(self.nodes):
            port = free_port(self._ports)
            self._ports.append(port)
            ports.append(port)
            env = self._environment(node.python, node.env)
            log = self.logs / f"supernode-{i}.log"
            self.supernodes.append(
                self._spawn(f"supernode-{i}", self._supernode_argv(node, port), log, env)
            )
        for i, (node, port) in enumerate(zip(self.nodes, ports, strict=True)):
            self.supernodes[i] = self._launch(
                f"supernode-{i}",
                lambda p, node=node: self._supernode_argv(node, p),  # type: ignore[misc]
                self.logs / f"supernode-{i}.log",
                node.python,
                node.env,
                started=(self.supernodes[i], port),
            )

    def _superlink_command(self, port: int) -> list[str]:
        return [
            self._command(None, "flower-superlink"),
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # the apps are installed; nothing is fetched
            "--disable-runtime-dependency-installation",
        ]

    def _supernode_argv(self, node: NodeSpec, port: int) -> list[str]:
        cmd = [
            self._command(node.python, "flower-supernode"),
            "--insecure",
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if node.node_config:
            cmd += ["--node-config", config_arg(node.node_config)]
        return cmd

    def _launch(
        self,
        name: str,
        command: Callable[[int], list[str]],
        log: Path,
        python: str | os.PathLike | None,
        extra_env: Mapping[str, str],
        started: tuple[Process, int] | None = None,
    ) -> Process:
        """Start ``name`` on a free port (or take the ``started`` one) and wait until it listens.

        A process whose port was taken between choosing and binding it starts again on another one.
        """
        for attempt in range(3):
            if started is not None and attempt == 0:
                process, port = started
            else:
                port = free_port(self._ports)
                self._ports.append(port)
                process = self._spawn(
                    name, command(port), log, self._environment(python, extra_env)
                )
            try:
                self._wait_until_listening(process, port)
            except DeploymentError:
                taken = "address already in use" in process.tail(4000).lower()
                terminate_tree([process.pid])
                process.close()
                if not taken or attempt == 2:
                    raise
                continue
            return process
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _spawn(self, name: str, command: list[str], log: Path, env: Mapping[str, str]) -> Process:
        process = Process(name, command, log, env)
        self._started.append(process)
        return process

    def _shims(self, python: str | os.PathLike | None) -> Path:
        """A folder of ``python -c`` scripts named like Flower's commands, for ``python``."""
        interpreter = os.fspath(python) if python is not None else sys.executable
        digest = hashlib.sha256(os.path.abspath(interpreter).encode()).hexdigest()[:12]
        return write_shims(
            self.run_dir / "bin" / ("default" if python is None else f"py-{digest}"), interpreter
        )

    def _command(self, python: str | os.PathLike | None, name: str) -> str:
        return os.fspath(self._shims(python) / name)

    def _environment(
        self, python: str | os.PathLike | None, extra: Mapping[str, str]
    ) -> dict[str, str]:
        env = {**os.environ, **self._env, **extra}
        # the SuperLink and SuperNodes find SuperExec, flwr-serverapp and flwr-clientapp on the PATH
        env["PATH"] = os.pathsep.join([os.fspath(self._shims(python)), env.get("PATH", "")])
        env["FLWR_HOME"] = os.fspath(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        # each SuperExec looks for a ServerApp or ClientApp to start every second by default: a
        # quarter of that starts each round's apps sooner, for a few cheap local requests more
        env.setdefault(SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_S)
        env.pop("PYTHONHOME", None)
        return env

    def _wait_until_listening(self, process: Process, port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            raise_if_stopping()
            if not process.running():
                raise DeploymentError(
                    f"Flower's {process.name} exited with code {process.popen.returncode} while "
                    "starting "
                    f"(log {process.log}):\n{process.tail()}"
                )
            if listening(port):
                return
            time.sleep(0.2)
        raise DeploymentError(
            f"Flower's {process.name} did not listen on 127.0.0.1:{port} within "
            f"{self.startup_timeout:.0f} s "
            f"(log {process.log}):\n{process.tail()}"
        )

    # ------------------------------------------------------------------ processes

    def client_app_pids(self, node: int) -> list[int]:
        """The pids of the ``flwr-clientapp`` processes SuperNode ``node`` runs now."""
        return [
            pid
            for pid in descendants(self.supernodes[node].pid)
            if "flwr-clientapp" in command_line(pid)
        ]

    def pids(self) -> list[int]:
        """Every living process this deployment started, and their descendants."""
        roots = [p.pid for p in [*self.supernodes, *([self.superlink] if self.superlink else [])]]
        out = []
        for pid in roots:
            out += [p for p in [pid, *descendants(pid)] if alive(p)]
        return out

    def stop(self) -> None:
        """Stop every process this deployment started, and everything they started (SIGTERM, then
        SIGKILL).

        Safe to call twice, and after a failed start. SIGINT and SIGTERM are ignored while it stops
        (in the
        main thread), so that an impatient second Ctrl-C cannot leave processes behind.
        """
        with shielded():
            # a process whose parent was interrupted while starting it is in no tree, but has our
            # FLWR_HOME
            strays = environment_pids("FLWR_HOME", os.fspath(self.home))
            # a reaped process's pid may belong to another process by now: only unreaped ones are
            # signalled
            terminate_tree([*(p.pid for p in self._started if p.running()), *strays])
            for process in self._started:
                process.close()
        self._started = []
        self.supernodes = []
        self.superlink = None

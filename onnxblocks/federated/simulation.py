"""A federation on Flower's simulation runtime, started with Flower's own commands (``flwr run``).

:func:`simulate` writes a Flower app (a ``pyproject.toml`` whose components are
:mod:`onnxblocks.federated.app`'s ``server_app`` and ``client_app``, and whose run config holds the
artifacts, the clients' ``.npz`` files as ``data-path-<partition-id>`` and the server's settings),
starts ``flower-superlink --simulation`` on a free port of 127.0.0.1 with its own ``FLWR_HOME``,
submits
the app with ``flwr run APP local --federation-config num-supernodes=N --stream`` (the simulation
runtime runs each ClientApp in Ray), waits for the run to end, stops the SuperLink and returns the
:class:`~onnxblocks.federated.history.FederatedHistory` the ServerApp wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import (
    FileMissingError,
    InvalidValueError,
    StateError,
    UnknownNameError,
)
from onnxblocks.federated.history import FederatedHistory
from onnxblocks.federated.processes import SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_S, free_port
from onnxblocks.federated.server import ServerSettings

#: Seconds to wait for the SuperLink's health endpoint.
STARTUP_TIMEOUT = 60.0


def simulate(
    artifacts: str | os.PathLike,
    data: Sequence[str | os.PathLike],
    *,
    client_eval_data: Sequence[str | os.PathLike] | None = None,
    workdir: str | os.PathLike | None = None,
    num_cpus: int = 2,
    cpus_per_client: float = 1.0,
    timeout: float = 900.0,
    **settings: Any,
) -> FederatedHistory:
    """Run a federation of ``len(data)`` simulated clients with ``flwr run`` and return its history.

    Args:
        artifacts: The artifacts directory (its checkpoint is the initial global model).
        data: One ``.npz`` per client (``onnxblocks train``'s format); client ``i`` is partition
        ``i``.
        client_eval_data: One ``.npz`` per client to evaluate on; None: each client's training data.
        workdir: Where the Flower app, ``FLWR_HOME``, logs and (by default) the history go; None: a
            temporary directory, removed afterwards.
        num_cpus: CPUs Ray may use.
        cpus_per_client: CPUs each simulated client reserves.
        timeout: Seconds the whole run may take.
        **settings: :class:`~onnxblocks.federated.server.ServerSettings` fields (``rounds``,
        ``strategy``,
            ``local_epochs``, ``lr``, ``save``, ``export``, ``history``, ``plot``, ``eval_data``
            ...);
            ``min_nodes`` defaults to the number of clients.

    Returns:
        The :class:`~onnxblocks.federated.history.FederatedHistory`.

    Raises:
        FileMissingError: for a missing artifacts directory or data file.
        UnknownNameError: for a setting that is not a ServerSettings field.
        StateError: when the SuperLink does not start or the run ends without a history (the message
            holds the end of Flower's log).
    """
    if not data:
        raise InvalidValueError("simulate needs at least one client's data file.")
    if client_eval_data is not None and len(client_eval_data) != len(data):
        raise InvalidValueError(
            f"simulate: {len(client_eval_data)} client_eval_data files for {len(data)} clients."
        )
    paths = [Path(p).resolve() for p in (*data, *(client_eval_data or ()))]
    for path in [Path(artifacts), *paths]:
        if not path.exists():
            raise FileMissingError(f"simulate: '{path}' does not exist.")
    known = {f.name for f in fields(ServerSettings)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UnknownNameError(
            f"simulate: {unknown} are not ServerSettings fields; known: {sorted(known)}."
        )
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="onnxblocks-flower-") as temp:
            return _simulate(
                Path(temp),
                artifacts,
                data,
                client_eval_data,
                num_cpus,
                cpus_per_client,
                timeout,
                settings,
            )
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    return _simulate(
        root, artifacts, data, client_eval_data, num_cpus, cpus_per_client, timeout, settings
    )


def _simulate(
    root: Path,
    artifacts: str | os.PathLike,
    data: Sequence[str | os.PathLike],
    eval_data: Sequence[str | os.PathLike] | None,
    num_cpus: int,
    cpus_per_client: float,
    timeout: float,
    settings: dict[str, Any],
) -> FederatedHistory:
    history = Path(settings.get("history") or root / "history.json").resolve()
    if history.exists():
        history.unlink()  # a stale history must not pass for this run's
    config: dict[str, Any] = {"artifacts": str(Path(artifacts).resolve()), "min-nodes": len(data)}
    for name, value in settings.items():
        if value is not None:
            key = "num-server-rounds" if name == "rounds" else name.replace("_", "-")
            config[key] = str(Path(value).resolve()) if name in _PATHS else value
    config["history"] = str(history)
    for i, path in enumerate(data):
        config[f"data-path-{i}"] = str(Path(path).resolve())
    for i, path in enumerate(eval_data or ()):
        config[f"eval-data-path-{i}"] = str(Path(path).resolve())
    app = write_flower_app(root / "app", config)
    home = root / "flwr-home"
    port = free_port()
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = '
        f'"127.0.0.1:{port}"\ninsecure = true\n',
        encoding="utf-8",
    )
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1"}
    env.setdefault(SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_S)  # the apps start sooner
    # the SuperLink starts flower-superexec and flwr-serverapp by name: those beside this Python
    # come first,
    # so a venv that is not activated (python -m, a notebook kernel) still finds its own
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    superlink_log = root / "superlink.log"
    run_log = root / "run.log"
    command = [_tool("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess"]
    command += ["--disable-runtime-dependency-installation"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--database", str(root / "state.db")]
    with open(superlink_log, "wb") as log:
        superlink = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_healthy(port, superlink, superlink_log)
        per_client = (
            int(cpus_per_client) if float(cpus_per_client).is_integer() else float(cpus_per_client)
        )
        federation = f"num-supernodes={len(data)} client-resources-num-cpus={per_client} "
        federation += f"init-args-num-cpus={int(num_cpus)}"
        with open(run_log, "wb") as log:
            done = subprocess.run(
                [
                    _tool("flwr"),
                    "run",
                    str(app),
                    "local",
                    "--federation-config",
                    federation,
                    "--stream",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise StateError(f"The simulation ran over {timeout:.0f} s.\n{_tail(run_log)}") from None
    finally:
        _stop(superlink)
    if not history.exists():
        raise StateError(
            f"The simulation ended (flwr run exit code {done.returncode}) without writing its "
            "history.\n"
            f"{_tail(run_log)}\n{_tail(superlink_log)}"
        )
    return FederatedHistory.load(history)


#: ServerSettings fields that are paths (made absolute: the ServerApp runs in another directory).
_PATHS = ("eval_data", "save", "export", "history", "plot")


def write_flower_app(directory: str | os.PathLike, run_config: Mapping[str, Any]) -> Path:
    """Write a Flower app whose components are :mod:`onnxblocks.federated.app`'s, with
    ``run_config``.

    Returns:
        The app directory (``flwr run`` takes it).

    Raises:
        InvalidValueError: for a run config value TOML cannot hold here (not a str, int, float or
        bool).
    """
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "onnxblocks-federation"',
        'version = "1.0.0"',
        'description = "A federation of onnxblocks artifacts (written by onnxblocks.federated)"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "onnxblocks"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "onnxblocks.federated.app:server_app"',
        'clientapp = "onnxblocks.federated.app:client_app"',
        "",
        "[tool.flwr.app.config]",
    ]
    for key, value in run_config.items():
        lines.append(f'"{key}" = {_toml(key, value)}')
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _toml(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, int) or value == value else "nan"
    if isinstance(value, (str, os.PathLike)):
        return json.dumps(os.fspath(value))  # a TOML basic string: JSON's escapes are TOML's
    raise InvalidValueError(
        f"Run config '{key}' is a {type(value).__name__}; use a str, int, float or bool."
    )


def _tool(name: str) -> str:
    """Flower's command ``name`` beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise FileMissingError(
            f"Flower's '{name}' command is missing; pip install \"onnxblocks[flower]\"."
        )
    return found


def _wait_healthy(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StateError(
                f"flower-superlink exited with code {process.returncode}.\n{_tail(log)}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise StateError(
        f"flower-superlink did not answer on 127.0.0.1:{port} in {STARTUP_TIMEOUT:.0f} "
        f"s.\n{_tail(log)}"
    )


def _stop(process: subprocess.Popen) -> None:
    """Stop the SuperLink and what it started (its process group: the simulation runtime, Ray)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _tail(path: Path, lines: int = 25) -> str:
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return f"--- {path.name} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

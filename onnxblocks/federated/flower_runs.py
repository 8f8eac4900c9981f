"""Runs on a local deployment: ``flwr run`` submitted to its SuperLink and followed to the end.

:class:`FlowerRuns` is the part of :class:`~onnxblocks.federated.deployment.LocalDeployment` that
talks to a started SuperLink through Flower's ``flwr`` command (submit, stop); starting and
stopping the processes stays in the deployment module. A run's status and its log are read in this
process, through the SuperLink's Control API (what ``flwr ls`` and ``flwr log`` ask): a ``flwr``
command is a Python start-up of about 1.7 s of CPU, which polling every half second would pay again
and again.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import StateError
from onnxblocks._core.interrupts import raise_if_stopping
from onnxblocks.federated.processes import DeploymentError, Process, run_captured
from onnxblocks.federated.project import ConfigValue, config_arg

#: The name of the SuperLink connection in the run directory's Flower config.
CONNECTION = "onnxblocks"
#: Seconds between two polls of a run's status.
POLL_S = 0.2
#: Seconds a Control API request may take (short: a stop signal is looked at between requests).
CONTROL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RunOutcome:
    """How a run on the deployment engine ended.

    Attributes:
        run_id: Flower's run id.
        status: Flower's status, e.g. ``finished:completed`` or ``finished:failed``.
        details: Flower's status details (the ServerApp's error when it failed).
        seconds: Wall time from ``flwr run`` to the end of the run.
        log: The run's log (``flwr run --stream``: the ServerApp's output).
    """

    run_id: str
    status: str
    details: str
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status == "finished:completed"


class FlowerRuns:
    """Submitting Flower apps to a running SuperLink and following them (``flwr`` commands)."""

    superlink: Process | None
    supernodes: list[Process]
    port: int | None
    #: The Control API client of the run being followed (one connection for its polls).
    _client: Any = None
    logs: Path
    _runs: int

    def _command(self, python: str | os.PathLike | None, name: str) -> str:
        raise NotImplementedError

    def _environment(
        self, python: str | os.PathLike | None, extra: Mapping[str, str]
    ) -> dict[str, str]:
        raise NotImplementedError

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run Flower's ``flwr`` command against this SuperLink (its output captured)."""
        try:
            return run_captured(
                [self._command(None, "flwr"), *args], self._environment(None, {}), timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise DeploymentError(
                f"'flwr {' '.join(args)}' did not answer within {timeout:.0f} s."
            ) from exc

    def run(
        self,
        app_dir: str | os.PathLike,
        *,
        run_config: Mapping[str, ConfigValue] | None = None,
        timeout: float = 3600.0,
    ) -> RunOutcome:
        """Submit the Flower app in ``app_dir`` with ``flwr run`` and wait until the run finishes.

        Args:
            app_dir: A Flower app directory (see :func:`~onnxblocks.federated.project.write_app`).
            run_config: Overrides of its ``[tool.flwr.app.config]`` (``flwr run --run-config``).
            timeout: Seconds the run may take; past them it is stopped (``flwr stop``).

        Returns:
            How the run ended (its status is Flower's: check :attr:`RunOutcome.ok`).

        Raises:
            StateError: when the deployment is not started.
            DeploymentError: when ``flwr run`` fails, or the run outlasts ``timeout``.
        """
        if self.superlink is None or not self.superlink.running():
            raise StateError(
                "The SuperLink is not running: use LocalDeployment as a context manager, or "
                "start()."
            )
        self._runs += 1
        log = self.logs / ("run.log" if self._runs == 1 else f"run-{self._runs}.log")
        args = ["run", os.fspath(Path(app_dir).resolve()), CONNECTION, "--format", "json"]
        if run_config:
            args += ["--run-config", config_arg(run_config)]
        started = time.monotonic()
        submitted = self.flwr(*args)
        log.write_text(submitted.stdout + submitted.stderr, encoding="utf-8")
        run_id = _run_id(submitted.stdout)
        if submitted.returncode != 0 or run_id is None:
            raise DeploymentError(
                f"'flwr run' failed (exit {submitted.returncode}; log {log}):\n"
                f"{(submitted.stdout + submitted.stderr)[-3000:]}"
            )
        deadline = started + timeout
        self._client = self._control()
        try:
            status, details = self._follow(run_id, deadline, timeout)
            seconds = time.monotonic() - started
            server_log = self._server_log(run_id)
        finally:
            self._client.close()
            self._client = None
        with log.open("a", encoding="utf-8") as f:
            f.write(server_log)
        return RunOutcome(run_id=run_id, status=status, details=details, seconds=seconds, log=log)

    def _follow(self, run_id: str, deadline: float, timeout: float) -> tuple[str, str]:
        """Poll run ``run_id`` until it finished: its ``(status, details)``."""
        assert self.superlink is not None
        while True:
            raise_if_stopping()
            status, details = self.status(run_id)
            if status.startswith("finished"):
                return status, details
            if time.monotonic() > deadline:
                self.flwr("stop", run_id, CONNECTION, timeout=60)
                raise DeploymentError(
                    f"Run {run_id} did not finish within {timeout:.0f} s (status {status}); it "
                    "was stopped. "
                    f"See the logs in {self.logs}."
                )
            for process in [self.superlink, *self.supernodes]:
                if process is self.superlink and not process.running():
                    raise DeploymentError(
                        f"The SuperLink exited (code {process.popen.returncode}) during run "
                        f"{run_id}:\n{process.tail()}"
                    )
            time.sleep(POLL_S)

    def _server_log(self, run_id: str) -> str:
        """The run's log as ``flwr log --show`` prints it (the ServerApp's output)."""
        from flwr.proto.control_pb2 import StreamLogsRequest

        request = StreamLogsRequest(run_id=int(run_id), after_timestamp=0.0)
        try:
            for answer in self._client.StreamLogs(request):
                return f"{answer.log_output}\n"  # the first answer holds the whole log
        except Exception:  # Flower raises its own and httpx's errors: the command says why
            pass
        shown = self.flwr("log", run_id, CONNECTION, "--show", timeout=60)
        return shown.stdout + shown.stderr

    def _control(self) -> Any:
        """A client of the SuperLink's Control API (what the ``flwr`` command talks to)."""
        from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
        from flwr.supercore.control import ControlHttpClient
        from flwr.supercore.interceptors.http.runtime_version import (
            RuntimeVersionHttpInterceptor,
        )

        return ControlHttpClient(
            f"http://127.0.0.1:{self.port}",
            interceptors=[
                CliClientHttpInterceptor(),
                RuntimeVersionHttpInterceptor(component_name="flwr CLI"),
            ],
            timeout=CONTROL_TIMEOUT_S,
        )

    def status(self, run_id: str) -> tuple[str, str]:
        """Flower's ``(status, details)`` of run ``run_id``, as ``flwr ls --run-id`` shows."""
        from flwr.proto.control_pb2 import ListRunsRequest

        client = self._client or self._control()
        try:
            runs = client.ListRuns(ListRunsRequest(run_id=int(run_id))).run_dict
        except Exception as exc:  # Flower raises its own and httpx's errors
            raise DeploymentError(
                f"The SuperLink gave no status of run {run_id} ({type(exc).__name__}: {exc})."
            ) from exc
        finally:
            if client is not self._client:
                client.close()
        row = next((r for r in runs.values() if str(r.run_id) == str(run_id)), None)
        if row is None:
            raise DeploymentError(f"The SuperLink lists no run {run_id}.")
        status = row.status.status
        if row.status.sub_status:
            status = f"{status}:{row.status.sub_status}"
        return status, str(row.status.details)


def _run_id(stdout: str) -> str | None:
    """The run id ``flwr run --format json`` printed (its JSON holds ``"run-id": "<digits>"``)."""
    found = re.findall(r'"run-id"\s*:\s*"?(\d+)', stdout)
    return found[-1] if found else None

"""The HTTP routes of the relay (:mod:`onnxblocks.federated.relay`): who asks what, and the answers.

JavaScript clients:

* ``GET /files/<name>``: an artifact file (``step_model.onnx``, ``eval_model.onnx``,
  ``params.safetensors``);
* ``POST /claim`` (JSON ``{"kind": "browser"}``): ``{"slot": k}``, a free slot of that kind, or 409;
* ``GET /slots/<k>/task``: waits up to 5 s; ``{"status": "task", "id", "phase", "round",
  "config"}``,
  ``{"status": "wait"}`` (poll again) or ``{"status": "done"}`` (the federation is over);
* ``GET /slots/<k>/tasks/<id>/state``: the task's state file;
* ``POST /slots/<k>/tasks/<id>/result``: the trained state file (empty for ``evaluate``), headers
  ``X-Metrics`` and ``X-Client`` (JSON); answers ``{"accepted": bool, "reason"}``;
* ``POST /slots/<k>/tasks/<id>/error``: the client could not do the task (JSON ``{"reason"}``);
* ``POST /slots/<k>/alive``: a beat, while training.

The bridge ClientApp: ``POST /slots/<k>/run`` with the global parameters as ``.npz`` and headers
``X-Phase``, ``X-Round``, ``X-Config``, ``X-Timeout``; answers when the client is done: 200 with the
trained arrays as ``.npz`` and headers ``X-Metrics``, ``X-Client``, or 422 ``{"reason"}``.
"""

from __future__ import annotations

import json
import mimetypes
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.federated.records import arrays_to_npz, npz_to_arrays


class Routes(Protocol):
    """What the routes ask of the relay (:class:`onnxblocks.federated.relay.Relay` provides it;
    the relay module imports this one, so the routes name a protocol, not the class).
    """

    slots: Any
    files: dict[str, Path]
    site: Path | None
    finished: bool

    def beat(self, k: int) -> Any: ...
    def claim(self, kind: str) -> int | None: ...
    def next_task(self, k: int, wait: float) -> Any: ...
    def run(self, k: int, phase: str, round_: int, config: Any, arrays: Any) -> Any: ...
    def wait(self, k: int, task: Any, timeout: float) -> Any: ...
    def result(
        self, k: int, task_id: int, body: bytes, metrics: Any, client: Any
    ) -> str | None: ...


#: The largest body a request may carry (a state file of 1 GiB).
MAX_BODY = 1 << 30
_SLOT = re.compile(r"^/slots/(\d+)(/.*)?$")
_TASK = re.compile(r"^/tasks/(\d+)/(state|result|error)$")


class RelayHandler(BaseHTTPRequestHandler):
    """Routes requests to the :class:`~onnxblocks.federated.relay.Relay` the server holds."""

    protocol_version = "HTTP/1.1"

    @property
    def relay(self) -> Routes:
        return self.server.relay  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the CLI prints what matters
        pass

    # ------------------------------------------------------------------ replies

    def _send(
        self, code: int, body: bytes, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, value: Any) -> None:
        self._send(code, json.dumps(value).encode(), "application/json")

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_BODY:
            raise InvalidValueError(
                f"A request body of {length} bytes: the relay takes 0 to {MAX_BODY} bytes; send a "
                "smaller state file (adapters only for LoRA)."
            )
        return self.rfile.read(length) if length else b""

    def _header_json(self, name: str) -> Any:
        try:
            return json.loads(self.headers.get(name) or "{}")
        except ValueError:
            return None

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.startswith("/files/"):
            return self._file(path[len("/files/") :])
        slot = self._slot(path)
        if slot is not None:
            k, rest = slot
            if rest == "/task":
                return self._task(k)
            found = _TASK.match(rest)
            task = self.relay.slots[k].task
            if found and found.group(2) == "state" and task and task.id == int(found.group(1)):
                return self._send(200, task.state, "application/octet-stream")
            return self._json(404, {"reason": f"no such task: {rest}"})
        return self._static(path)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
        except ValueError as exc:
            return self._json(413, {"reason": str(exc)})
        if path == "/claim":
            return self._claim(body)
        slot = self._slot(path)
        if slot is None:
            return self._json(404, {"reason": f"no route {path}"})
        k, rest = slot
        if rest == "/alive":
            self.relay.beat(k)
            return self._json(200, {"finished": self.relay.finished})
        if rest == "/run":
            return self._run(k, body)
        found = _TASK.match(rest)
        if found is None or found.group(2) == "state":
            return self._json(404, {"reason": f"no route {path}"})
        self.relay.beat(k)
        task_id = int(found.group(1))
        if found.group(2) == "error":
            task = self.relay.slots[k].task
            if task is not None and task.id == task_id:
                said = _loads(body).get("reason", "")
                task.fail(f"its client failed: {str(said)[:300]}")
            return self._json(200, {"accepted": False})
        reason = self.relay.result(
            k, task_id, body, self._header_json("X-Metrics"), self._header_json("X-Client")
        )
        return self._json(200, {"accepted": reason is None, "reason": reason})

    def _slot(self, path: str) -> tuple[int, str] | None:
        found = _SLOT.match(path)
        if found is None or int(found.group(1)) >= len(self.relay.slots):
            return None
        return int(found.group(1)), found.group(2) or ""

    def _file(self, name: str) -> None:
        path = self.relay.files.get(name)
        if path is None:
            return self._json(
                404, {"reason": f"no file {name!r}; the relay serves {sorted(self.relay.files)}"}
            )
        return self._send(200, path.read_bytes(), "application/octet-stream")

    def _static(self, path: str) -> None:
        site = self.relay.site
        if site is None:
            return self._json(404, {"reason": "this relay serves no page"})
        relative = "index.html" if path in ("", "/") else path.lstrip("/")
        target = (site / relative).resolve()
        if site.resolve() not in target.parents or not target.is_file():
            return self._json(404, {"reason": f"no page {path}"})
        kind = {
            ".mjs": "text/javascript",
            ".js": "text/javascript",
            ".wasm": "application/wasm",
        }.get(target.suffix, mimetypes.guess_type(target.name)[0] or "application/octet-stream")
        return self._send(200, Path(target).read_bytes(), kind)

    def _claim(self, body: bytes) -> None:
        kind = str(_loads(body).get("kind", "browser"))
        k = self.relay.claim(kind)
        if k is None:
            return self._json(409, {"reason": f"no free {kind} slot: every one has a client"})
        return self._json(200, {"slot": k})

    def _task(self, k: int) -> None:
        task = self.relay.next_task(k, wait=5.0)
        if self.relay.finished:
            return self._json(200, {"status": "done"})
        if task is None:
            return self._json(200, {"status": "wait"})
        task.taken = True
        return self._json(
            200,
            {
                "status": "task",
                "id": task.id,
                "phase": task.phase,
                "round": task.round,
                "config": task.config,
            },
        )

    def _run(self, k: int, body: bytes) -> None:
        try:
            arrays = npz_to_arrays(body)
            config = json.loads(self.headers.get("X-Config") or "{}")
            timeout = float(self.headers.get("X-Timeout") or 600.0)
            phase, round_ = self.headers.get("X-Phase", ""), int(self.headers.get("X-Round") or 0)
            task = self.relay.run(k, phase, round_, config, arrays)
        except Exception as exc:  # the bridge's request is malformed: it learns why
            return self._json(400, {"reason": f"{type(exc).__name__}: {exc}"})
        task = self.relay.wait(k, task, timeout)
        if task.reason is not None:
            return self._json(422, {"reason": task.reason})
        headers = {"X-Metrics": json.dumps(task.metrics), "X-Client": json.dumps(task.client)}
        return self._send(200, arrays_to_npz(task.arrays), "application/octet-stream", headers)


def _loads(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

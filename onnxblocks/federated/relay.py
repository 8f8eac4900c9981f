"""The relay between bridge ClientApps and JavaScript clients: an HTTP server on 127.0.0.1.

Flower starts a fresh ClientApp process for every message, so the endpoint a browser or a Node
process talks to cannot live in a ClientApp. :class:`Relay` lives as long as the federation (the
process that runs the deployment starts it before the SuperNodes and stops it after them) and holds
one *slot* per bridge SuperNode. A round goes:

1. the node's bridge ClientApp (:mod:`onnxblocks.federated.bridge`) posts the global parameters
   (an ``.npz``) and the round's config to ``POST /slots/<k>/run`` and waits on that request;
2. the slot's JavaScript client, which polls ``GET /slots/<k>/task``, takes the task, fetches its
   state file (``GET /slots/<k>/tasks/<id>/state``: the web format of ``onnxblocks.web.state``,
   the global trainable parameters, no optimizer state), trains, and posts its trained state file
   with its metrics (``POST /slots/<k>/tasks/<id>/result``), beating ``POST /slots/<k>/alive``
   meanwhile;
3. the relay checks the posted file as the server checks a reply
   (:mod:`~onnxblocks.federated.validation`: exactly the global names, dtypes and shapes,
   finite values, a whole ``num-examples``, finite
   metrics) and answers the ClientApp with the arrays, or with the reason it refused them, which the
   ClientApp raises: Flower's error reply, dropped by the server with that reason.

A client that takes no task within the ClientApp's timeout, or whose beats stop for
``heartbeat_timeout`` seconds (a closed tab, a killed process), fails the task with the reason.
The relay also serves the JavaScript client's artifact files (``GET /files/<name>``) and, when
given a site folder, a page for browser tabs, which claim free slots (``POST /claim``).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidValueError, StateError
from onnxblocks.federated.relay_http import RelayHandler
from onnxblocks.federated.validation import (
    WEIGHT_KEY,
    Specs,
    check_arrays,
    check_metrics,
    specs_of,
)
from onnxblocks.safetensors import read_safetensors, write_safetensors

#: ``__metadata__["format"]`` of the web state files (``onnxblocks.web.state.STATE_FORMAT``).
STATE_FORMAT = "onnxblocks-web/1"
#: The metrics a training reply carries, as a Python client's (``train_client``).
TRAIN_METRICS = (WEIGHT_KEY, "train-loss", "steps", "train-seconds")
#: The metrics an evaluation reply carries (``accuracy`` when the labels are class indices).
EVAL_METRICS = (WEIGHT_KEY, "eval-loss")
#: The kinds of JavaScript clients.
KINDS = ("node", "browser")


@dataclass
class Task:
    """One message relayed to a slot's client."""

    id: int
    phase: str
    round: int
    config: dict[str, Any]
    specs: Specs
    state: bytes
    taken: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None

    def fail(self, reason: str) -> None:
        if not self.done.is_set():
            self.reason = reason
            self.done.set()


@dataclass
class Slot:
    """One bridge SuperNode's place: its kind, its client's last beat, its current task."""

    kind: str
    last_seen: float | None = None
    claimed: bool = False
    task: Task | None = None


class Relay:
    """The relay server (see the module docstring); a context manager that serves in a thread.

    Args:
        slots: The kind of each slot's client (``node`` or ``browser``), slot k for bridge node k.
        files: The files JavaScript clients fetch, by name (``step_model.onnx``,
            ``eval_model.onnx``, ``params.safetensors``, ``base_weights.bin``):
            the portable artifacts they train.
        work_dir: Where state files in transit are written (created).
        heartbeat_timeout: Seconds without a beat after which a client counts as gone.
        site: A folder served at ``/`` for browser tabs (None: no page).
        port: The port (0: a free one).

    Raises:
        InvalidValueError: for an unknown kind or a file that does not exist.
    """

    def __init__(
        self,
        slots: Sequence[str],
        files: Mapping[str, str | os.PathLike],
        work_dir: str | os.PathLike,
        *,
        heartbeat_timeout: float = 10.0,
        site: str | os.PathLike | None = None,
        port: int = 0,
    ) -> None:
        for k, kind in enumerate(slots):
            if kind not in KINDS:
                raise InvalidValueError(f"Relay: slot {k} is of kind {kind!r}; use one of {KINDS}.")
        self.files = {name: Path(path) for name, path in files.items()}
        for name, path in self.files.items():
            if not path.is_file():
                raise InvalidValueError(
                    f"Relay: file {name!r} ({path}) does not exist; JavaScript clients fetch it."
                )
        self.slots = [Slot(kind) for kind in slots]
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.site = Path(site) if site is not None else None
        self.finished = False
        self.lock = threading.Condition()
        self._ids = itertools.count(1)
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifetime

    def __enter__(self) -> Relay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Serve in a daemon thread."""
        if self._server is not None:
            raise StateError("This Relay is serving already.")
        self._server = _Server(("127.0.0.1", self._port), RelayHandler)
        self._server.relay = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="onnxblocks-relay", daemon=True
        )
        self._thread.start()

    def finish(self) -> None:
        """Tell the clients the federation is over (their next poll answers ``done``)."""
        with self.lock:
            self.finished = True
            for slot in self.slots:
                if slot.task is not None:
                    slot.task.fail("the federation ended")
            self.lock.notify_all()

    def stop(self) -> None:
        """Finish, and stop serving."""
        self.finish()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join()
        self._server = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._server is None:
            raise StateError("The Relay is not serving: start() it first.")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def slot_url(self, k: int) -> str:
        """Slot ``k``'s URL: node config ``bridge``, a Node client's ``--federate``."""
        return f"{self.url}/slots/{k}"

    # ------------------------------------------------------------------ the bridge's side

    def run(
        self, k: int, phase: str, round_: int, config: dict[str, Any], arrays: Mapping[str, Any]
    ) -> Task:
        """Post a task to slot ``k`` (replacing one left from an earlier message); return it."""
        if phase not in ("train", "evaluate"):
            raise InvalidValueError(f"Relay: phase {phase!r} is neither 'train' nor 'evaluate'.")
        arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
        path = self.work_dir / f"task-{k}.safetensors"
        metadata = {
            "format": STATE_FORMAT,
            "trainable": json.dumps(list(arrays)),
            "frozen": "[]",
            "step": "0",
        }
        write_safetensors(path, arrays, metadata)
        task = Task(next(self._ids), phase, round_, config, specs_of(arrays), path.read_bytes())
        with self.lock:
            slot = self.slots[k]
            if slot.task is not None:
                slot.task.fail("a newer message replaced it")
            slot.task = task
            self.lock.notify_all()
        return task

    def wait(self, k: int, task: Task, timeout: float) -> Task:
        """Wait until ``task`` is done, failing it on timeout or when its client stops beating."""
        deadline = time.monotonic() + timeout
        while not task.done.wait(0.25):
            slot = self.slots[k]
            now = time.monotonic()
            gone = slot.last_seen is not None and now - slot.last_seen > self.heartbeat_timeout
            if gone:
                where = "during the round" if task.taken else "before the round"
                task.fail(
                    f"its {slot.kind} client disconnected {where} (no beat for "
                    f"{self.heartbeat_timeout:g} s)"
                )
            elif now > deadline:
                task.fail(
                    f"its {slot.kind} client sent no result within {timeout:g} s"
                    + ("" if slot.last_seen is not None else " (no client ever joined its slot)")
                )
        with self.lock:
            if self.slots[k].task is task:
                self.slots[k].task = None
        return task

    # ------------------------------------------------------------------ the client's side

    def beat(self, k: int) -> Slot:
        slot = self.slots[k]
        slot.last_seen = time.monotonic()
        return slot

    def claim(self, kind: str) -> int | None:
        """A free slot of ``kind`` (never claimed, or its client gone), now claimed; None: none."""
        with self.lock:
            now = time.monotonic()
            for k, slot in enumerate(self.slots):
                stale = slot.last_seen is None or now - slot.last_seen > self.heartbeat_timeout
                if slot.kind == kind and (not slot.claimed or stale):
                    slot.claimed = True
                    self.beat(k)
                    return k
        return None

    def next_task(self, k: int, wait: float) -> Task | None:
        """The slot's task not yet taken, waiting up to ``wait`` seconds for one."""
        deadline = time.monotonic() + wait
        with self.lock:
            while True:
                self.beat(k)
                task = self.slots[k].task
                if self.finished or (task is not None and not task.taken):
                    return None if self.finished else task
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(min(left, 1.0))

    def result(self, k: int, task_id: int, body: bytes, metrics: Any, client: Any) -> str | None:
        """Take a client's result; why it was refused (None: accepted). The task is done."""
        task = self.slots[k].task
        if task is None or task.id != task_id:
            return f"task {task_id} of slot {k} is not current (it timed out or was replaced)"
        reason = self._check(k, task, body, metrics)
        if isinstance(client, dict):
            task.client = {
                key: str(value)[:80] for key, value in client.items() if key in ("kind", "runtime")
            }
        task.client.setdefault("kind", self.slots[k].kind)
        if reason is not None:
            task.fail(reason)
        task.done.set()
        return reason

    def _check(self, k: int, task: Task, body: bytes, metrics: Any) -> str | None:
        if not isinstance(metrics, dict):
            return "its metrics are not a JSON object"
        keys = TRAIN_METRICS if task.phase == "train" else EVAL_METRICS
        optional = () if task.phase == "train" else ("accuracy",)
        task.metrics = {key: metrics[key] for key in (*keys, *optional) if key in metrics}
        reason = check_metrics(task.metrics, keys)
        if reason is not None:
            return reason
        if task.phase == "train":
            task.metrics[WEIGHT_KEY] = int(task.metrics[WEIGHT_KEY])
            return self._check_state(k, task, body)
        task.metrics = {key: float(v) for key, v in task.metrics.items()}
        return None

    def _check_state(self, k: int, task: Task, body: bytes) -> str | None:
        """Read the posted state file as ``read_safetensors`` reads any; check it as a reply."""
        path = self.work_dir / f"result-{k}.safetensors"
        path.write_bytes(body)
        try:
            tensors, metadata = read_safetensors(path)
        except Exception as exc:  # any malformed file is a reason, never the relay's failure
            return f"its state file cannot be read ({type(exc).__name__}: {exc!s:.200})"
        finally:
            path.unlink(missing_ok=True)
        if metadata.get("format") != STATE_FORMAT:
            return (
                f"its state file's format is {metadata.get('format')!r:.40}, not {STATE_FORMAT!r}"
            )
        reason = check_arrays(tensors, task.specs)
        if reason is None:
            task.arrays = tensors
        return reason


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client gone mid-answer (a closed tab, a killed process) is the relay's ordinary weather
        pass

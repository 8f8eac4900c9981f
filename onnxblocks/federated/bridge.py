"""The bridge ClientApp: a SuperNode whose client is a browser tab or a Node process.

Flower has no JavaScript client. A SuperNode started with node config ``bridge="http://127.0.0.1:P/slots/K"``
runs onnxblocks' ClientApp like any other node, but its messages are relayed instead of trained:
the ClientApp posts the global parameters and the round's config to the relay's slot
(:mod:`onnxblocks.federated.relay`, a server that outlives Flower's one-process-per-message
ClientApps), waits for the JavaScript client's trained state file, which the relay has checked as
the server would, and replies with the ``arrays``, ``metrics`` and ``client`` records a Python
client sends (``client`` saying ``kind``: ``node`` or ``browser``). A refusal, a timeout or a
client that disconnects becomes Flower's error reply with the reason, which the server drops.

This module imports no ONNX Runtime: a bridge node's ClientApp process pays for Flower, numpy
and the standard library only.

* node config ``bridge``: the slot's URL (required; ``onnxblocks federate`` sets it);
* run config ``round-timeout`` (else ``bridge-timeout``, else 600 s): how long to wait for the
  client.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from onnxblocks._core.errors import InvalidValueError, StateError
from onnxblocks.federated.records import arrays_to_npz, from_record, npz_to_arrays, to_record

#: The node config key naming a bridge node's relay slot.
BRIDGE_KEY = "bridge"
#: Seconds a bridge waits for its client when the run config sets no ``round-timeout``.
DEFAULT_TIMEOUT = 600.0


class BridgeError(StateError):
    """The JavaScript client behind a bridge did not deliver (the reason says why)."""


def is_bridge(context: Any) -> bool:
    """Whether this node relays to a JavaScript client (node config ``bridge``)."""
    return BRIDGE_KEY in context.node_config


def relay_message(message: Any, context: Any, phase: str) -> Any:
    """Relay a ``train`` or ``evaluate`` message to the node's JavaScript client; its reply.

    Raises:
        InvalidValueError: for FedProx (the JavaScript step has no proximal term) or a
            malformed message.
        BridgeError: when the client's result is refused, late or missing (the relay's reason).
    """
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    records = list(message.content.array_records.values())
    if len(records) != 1:
        raise InvalidValueError(
            f"The server sent {len(records)} ArrayRecords; one (the global model) expected."
        )
    config = dict(message.content.config_records.get("config", {}))
    if phase == "train" and float(config.get("proximal-mu", 0.0) or 0.0) > 0:
        raise InvalidValueError(
            "A bridge node's JavaScript client cannot train with FedProx's proximal-mu > 0 (its "
            "fused step has no proximal term); use --strategy fedavg, fedadam or fedyogi with "
            "web clients."
        )
    run = dict(context.run_config)
    timeout = float(run.get("round-timeout") or run.get("bridge-timeout") or DEFAULT_TIMEOUT)
    url = str(context.node_config[BRIDGE_KEY]).rstrip("/") + "/run"
    request = urllib.request.Request(
        url,
        data=arrays_to_npz(from_record(records[0])),
        method="POST",
        headers={
            "Content-Type": "application/octet-stream",
            "X-Phase": phase,
            "X-Round": str(int(config.get("server-round", 0))),
            "X-Config": json.dumps(_plain(config)),
            "X-Timeout": repr(timeout),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout + 60) as answer:
            body = answer.read()
            metrics = json.loads(answer.headers.get("X-Metrics") or "{}")
            client = json.loads(answer.headers.get("X-Client") or "{}")
    except urllib.error.HTTPError as exc:
        reason = _reason(exc.read())
        raise BridgeError(f"bridge slot {url[:-4]}: {reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise BridgeError(
            f"bridge slot {url[:-4]}: the relay does not answer ({exc}); it runs beside the "
            "SuperNodes (onnxblocks federate starts it)."
        ) from None
    info: dict[str, Any] = {"backend": "portable", "kind": str(client.get("kind", "javascript"))}
    if client.get("runtime"):
        info["runtime"] = str(client["runtime"])
    if "partition-id" in context.node_config:
        info["partition-id"] = int(context.node_config["partition-id"])
    content: dict[str, Any] = {"metrics": MetricRecord(metrics), "client": ConfigRecord(info)}
    if phase == "train":
        content = {"arrays": to_record(npz_to_arrays(body)), **content}
    return Message(content=RecordDict(content), reply_to=message)


def make_bridge_app() -> Any:
    """A ``ClientApp`` that only relays (onnxblocks' own ClientApp relays on bridge nodes too)."""
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(message: Any, context: Any) -> Any:
        return relay_message(message, context, "train")

    @app.evaluate()
    def evaluate(message: Any, context: Any) -> Any:
        return relay_message(message, context, "evaluate")

    return app


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in config.items()}


def _reason(body: bytes) -> str:
    try:
        return str(json.loads(body).get("reason", "")) or "refused"
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace") or "refused"

"""The Flower ClientApp over an artifacts directory (one client's work is
:mod:`onnxblocks.federated.local`).

Where a ClientApp finds its inputs (the factory's arguments win over the configs):

* the artifacts directory: run config ``artifacts``, and ``backend`` (``auto``, ``training`` or
  ``portable``);
* the training data: node config ``data-path`` (a SuperNode's ``--node-config``), else run config
  ``data-path-<partition-id>`` (simulation: the node config holds ``partition-id``);
* the evaluation data: node config ``eval-data-path``, else run config
  ``eval-data-path-<partition-id>``, else the training data;
* where the node keeps what its messages would otherwise find again (the index rules of the
  artifacts' models, by content): node config ``cache-dir``, else ``onnxblocks-<user>/node-cache``
  in the temporary directory. Flower starts a fresh ClientApp process for every message;
* whether the node keeps its optimizer state between rounds: run config ``keep-optimizer-state``
  (default false). When true, each node keeps its state in Flower's per-node ``Context.state`` (an
  ``ArrayRecord`` ``optimizer-state`` of ``optimizer/<param>/<slot>`` moments and a ``ConfigRecord``
  ``optimizer-scalars``); it never travels to the server.

The ``.npz`` files use ``onnxblocks train``'s format (docs/cli.md).
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.federated.bridge import is_bridge, relay_message
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.federated.validation import WEIGHT_KEY

if TYPE_CHECKING:  # training imports ONNX Runtime: a bridge node's ClientApp never pays for it
    from onnxblocks.federated.local import DataSource
    from onnxblocks.federated.optimizer_state import KeptOptimizerState

#: The ``Context.state`` records where a node keeps its optimizer state between rounds.
STATE_ARRAYS, STATE_SCALARS = "optimizer-state", "optimizer-scalars"


def _key(name: str) -> str:
    return name.replace("_", "-")


def node_cache_dir(context: Any) -> Path:
    """Where this node keeps what its messages would otherwise find again: node config
    ``cache-dir``, else ``onnxblocks-<user>/node-cache`` in the temporary directory.
    """
    given = dict(context.node_config).get("cache-dir")
    if given:
        return Path(str(given))
    user = str(os.getuid()) if hasattr(os, "getuid") else getpass.getuser()
    return Path(tempfile.gettempdir()) / f"onnxblocks-{user}" / "node-cache"


def keeps_optimizer_state(given: bool | None, run_config: Mapping[str, Any]) -> bool:
    """``given``, else run config ``keep-optimizer-state`` (a bool, or ``"true"``/``"false"``;
    default false).

    Raises:
        InvalidTypeError: for a value that is not a bool.
    """
    value: Any = given if given is not None else run_config.get("keep-optimizer-state", False)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if not isinstance(value, bool):
        raise InvalidTypeError(
            f"Run config 'keep-optimizer-state' must be true or false, got {value!r:.60}."
        )
    return value


def kept_state(context: Any) -> KeptOptimizerState | None:
    """The optimizer state this node kept in ``context.state`` last round (None: none yet)."""
    if STATE_ARRAYS not in context.state or STATE_SCALARS not in context.state:
        return None
    from onnxblocks.federated.optimizer_state import KeptOptimizerState

    arrays = from_record(context.state[STATE_ARRAYS])
    return KeptOptimizerState.from_parts(arrays, dict(context.state[STATE_SCALARS]))


def keep_state(context: Any, state: KeptOptimizerState) -> None:
    """Keep ``state`` in ``context.state`` for this node's next round."""
    from flwr.app import ConfigRecord

    context.state[STATE_ARRAYS] = to_record(state.moments)
    context.state[STATE_SCALARS] = ConfigRecord(state.scalars())


@dataclass(frozen=True)
class ClientSources:
    """Where a ClientApp finds its artifacts and data (None: from the run and node configs).

    Attributes:
        artifacts: The artifacts directory.
        data: The training data: one source for every node, or one per partition id.
        eval_data: The evaluation data, as ``data``; None evaluates on the training data.
        backend: ``auto``, ``training`` or ``portable``.
    """

    artifacts: str | os.PathLike | None = None
    data: DataSource | Sequence[DataSource] | Mapping[int, DataSource] | None = None
    eval_data: DataSource | Sequence[DataSource] | Mapping[int, DataSource] | None = None
    backend: str | None = None

    def resolve(
        self, context: Any, evaluation: bool = False
    ) -> tuple[str | os.PathLike, DataSource, str]:
        """``(artifacts, data, backend)`` for this node.

        Raises:
            UnknownNameError: when the configs name no artifacts or no data for this node.
        """
        run, node = dict(context.run_config), dict(context.node_config)
        # a node's own artifacts (node config) win over the run's: clients of different kinds train
        # artifact sets of one model, e.g. portable ones on stock onnxruntime (onnxblocks federate
        # --client-artifacts)
        artifacts = (
            self.artifacts
            if self.artifacts is not None
            else node.get("artifacts", run.get("artifacts"))
        )
        if artifacts is None:
            raise UnknownNameError(
                "The ClientApp has no artifacts directory: set run config 'artifacts' (flwr run "
                "--run-config "
                "'artifacts=\"DIR\"') or pass make_client_app(artifacts=DIR)."
            )
        backend = self.backend or str(run.get("backend", "auto"))
        data: Any = None
        if evaluation:
            data = self._pick(self.eval_data, node, run, "eval-data-path")
        if data is None:
            data = self._pick(self.data, node, run, "data-path")
        if data is None:
            partition = node.get("partition-id")
            raise UnknownNameError(
                f"The ClientApp of node {context.node_id} has no training data: set node config "
                "'data-path' "
                "(flower-supernode --node-config 'data-path=\"FILE.npz\"') or run config "
                f"'data-path-{partition}'."
            )
        return str(artifacts), data, backend

    @staticmethod
    def _pick(given: Any, node: dict[str, Any], run: dict[str, Any], key: str) -> DataSource | None:
        partition = node.get("partition-id")
        if given is not None:
            if isinstance(given, (str, os.PathLike)) or (
                isinstance(given, Mapping) and not all(isinstance(k, int) for k in given)
            ):
                return given  # one source for every node
            if partition is None:
                raise UnknownNameError(
                    f"Per-partition {key} sources need the node config 'partition-id'."
                )
            try:
                return given[int(partition)]
            except (IndexError, KeyError):
                raise UnknownNameError(
                    f"No {key} source for partition {partition} ({len(given)} given)."
                ) from None
        if key in node:
            return str(node[key])
        if partition is not None and f"{key}-{partition}" in run:
            return str(run[f"{key}-{partition}"])
        return None


def make_client_app(
    artifacts: str | os.PathLike | None = None,
    *,
    data: DataSource | Sequence[DataSource] | Mapping[int, DataSource] | None = None,
    eval_data: DataSource | Sequence[DataSource] | Mapping[int, DataSource] | None = None,
    backend: str | None = None,
    keep_optimizer_state: bool | None = None,
) -> Any:
    """A Flower ``ClientApp`` training ``artifacts`` on each node's local data.

    On a ``train`` message it runs :func:`train_client` with the message's single ArrayRecord (the
    global trainable parameters) and its ``config`` ConfigRecord, and replies with the trained
    parameters (ArrayRecord ``arrays``), the metrics (MetricRecord ``metrics``: ``num-examples``,
    ``train-loss``, ``steps``, ``train-seconds``) and a ConfigRecord ``client`` saying who answered
    (``partition-id``,
    ``backend``, ``python``). On ``evaluate`` it replies with :func:`evaluate_client`'s metrics.
    A failure becomes Flower's error reply, which the server logs and drops.

    Args:
        artifacts: The artifacts directory; None: run config ``artifacts``.
        data: Training data for every node, or a list or dict by partition id; None: the configs
        (see
            the module docstring).
        eval_data: Evaluation data, as ``data``; None: the configs, else the training data.
        backend: ``auto``, ``training`` or ``portable``; None: run config ``backend`` (default
        ``auto``).
        keep_optimizer_state: Each node keeps its optimizer state between rounds in its
        ``Context.state``
            and restores it before training; None: run config ``keep-optimizer-state`` (default
            false: the
            optimizer state starts fresh every round).

    Returns:
        The ``flwr.clientapp.ClientApp``.
    """
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    sources = ClientSources(artifacts, data, eval_data, backend)
    app = ClientApp()

    def _global(message: Any) -> dict[str, np.ndarray]:
        records = list(message.content.array_records.values())
        if len(records) != 1:
            raise InvalidValueError(
                f"The server sent {len(records)} ArrayRecords; one (the global model) expected."
            )
        return from_record(records[0])

    def _config(message: Any) -> dict[str, Any]:
        return dict(message.content.config_records.get("config", {}))

    def _client(context: Any, backend_name: str) -> Any:
        info: dict[str, Any] = {
            "backend": backend_name,
            "kind": "python",
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        }
        if "partition-id" in context.node_config:
            info["partition-id"] = int(context.node_config["partition-id"])
        return ConfigRecord(info)

    @app.train()
    def train(message: Any, context: Any) -> Any:
        if is_bridge(context):  # a browser's or Node's SuperNode: relayed, not trained here
            return relay_message(message, context, "train")
        from onnxblocks.federated.local import train_client
        from onnxblocks.runtime.rules_cache import keep_rules_in

        path, local, backend_name = sources.resolve(context)
        keep = keeps_optimizer_state(keep_optimizer_state, dict(context.run_config))
        with keep_rules_in(node_cache_dir(context)):
            update = train_client(
                path,
                local,
                _global(message),
                _config(message),
                backend=backend_name,
                optimizer_state=kept_state(context) if keep else None,
                keep_optimizer_state=keep,
            )
        if update.optimizer_state is not None:
            keep_state(context, update.optimizer_state)
        reply = RecordDict(
            {
                "arrays": to_record(update.parameters),
                "metrics": MetricRecord({WEIGHT_KEY: update.num_examples, **update.metrics}),
                "client": _client(context, update.backend),
            }
        )
        return Message(content=reply, reply_to=message)

    @app.evaluate()
    def evaluate_(message: Any, context: Any) -> Any:
        if is_bridge(context):
            return relay_message(message, context, "evaluate")
        from onnxblocks.federated.local import evaluate_client
        from onnxblocks.runtime.rules_cache import keep_rules_in

        path, local, backend_name = sources.resolve(context, evaluation=True)
        batch = int(_config(message).get("batch-size", 256))
        with keep_rules_in(node_cache_dir(context)):
            metrics = evaluate_client(
                path, local, _global(message), batch_size=max(batch, 1), backend=backend_name
            )
        reply = RecordDict(
            {
                "metrics": MetricRecord(dict[str, Any](metrics)),
                "client": _client(context, backend_name),
            }
        )
        return Message(content=reply, reply_to=message)

    return app

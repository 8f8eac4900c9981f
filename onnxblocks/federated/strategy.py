"""Flower's strategies, built by name, behind a wrapper that checks every reply before aggregation.

:func:`build_strategy` returns Flower's own ``FedAvg``, ``FedProx``, ``FedAdam`` or ``FedYogi``,
optionally wrapped in ``DifferentialPrivacyServerSideFixedClipping``. :class:`ValidatingStrategy`
wraps any strategy: it drops the replies that fail :mod:`~onnxblocks.federated.validation` (and
Flower's error replies: a client that crashed or timed out), records why in the
:class:`~onnxblocks.federated.history.FederatedHistory`, and hands the rest to the wrapped
strategy's own aggregation. An aggregate with a non-finite value is refused (the global model
stays as it was), so no global parameter is ever non-finite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.federated.history import FederatedHistory
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.federated.validation import (
    Specs,
    check_arrays,
    check_evaluate_reply,
    check_train_reply,
)

logger = logging.getLogger("onnxblocks.federated")

#: The strategies :func:`build_strategy` knows, by name.
STRATEGIES = ("fedavg", "fedprox", "fedadam", "fedyogi")


def build_strategy(
    name: str = "fedavg",
    *,
    min_nodes: int = 2,
    fraction_train: float = 1.0,
    fraction_evaluate: float = 1.0,
    proximal_mu: float = 0.0,
    server_lr: float = 0.1,
    dp_clipping_norm: float | None = None,
    dp_noise_multiplier: float = 0.0,
) -> Strategy:
    """One of Flower's strategies, configured.

    Args:
        name: ``fedavg``, ``fedprox`` (sends ``proximal-mu`` to the clients), ``fedadam`` or
        ``fedyogi``
            (server-side Adam/Yogi on the averaged update, with learning rate ``server_lr``).
        min_nodes: Nodes that must be connected, and sampled for training and evaluation.
        fraction_train: Fraction of the nodes sampled for training each round.
        fraction_evaluate: Fraction of the nodes sampled for evaluation each round (0: none).
        proximal_mu: FedProx's ``mu``.
        server_lr: FedAdam's and FedYogi's ``eta``.
        dp_clipping_norm: Wrap the strategy in Flower's
        ``DifferentialPrivacyServerSideFixedClipping``
            with this clipping norm (each client's update is scaled to at most this L2 norm).
        dp_noise_multiplier: The Gaussian noise multiplier of the DP wrapper.

    Raises:
        InvalidValueError: for an unknown name or a value out of range.
    """
    from flwr.serverapp import strategy as flower

    key = name.lower().replace("-", "").replace("_", "")
    if key not in STRATEGIES:
        raise InvalidValueError(
            f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}."
        )
    if not isinstance(min_nodes, int) or min_nodes < 1:
        raise InvalidValueError(f"min_nodes must be an int >= 1, got {min_nodes!r}.")
    common: dict[str, Any] = {
        "fraction_train": fraction_train,
        "fraction_evaluate": fraction_evaluate,
        "min_train_nodes": min_nodes,
        "min_evaluate_nodes": min_nodes if fraction_evaluate > 0 else 0,
        "min_available_nodes": min_nodes,
    }
    strategy: Strategy
    if key == "fedavg":
        strategy = flower.FedAvg(**common)
    elif key == "fedprox":
        strategy = flower.FedProx(proximal_mu=float(proximal_mu), **common)
    elif key == "fedadam":
        strategy = flower.FedAdam(eta=float(server_lr), **common)
    else:
        strategy = flower.FedYogi(eta=float(server_lr), **common)
    if dp_clipping_norm is not None:
        strategy = flower.DifferentialPrivacyServerSideFixedClipping(
            strategy,
            noise_multiplier=float(dp_noise_multiplier),
            clipping_norm=float(dp_clipping_norm),
            num_sampled_clients=min_nodes,
        )
    return strategy


class ValidatingStrategy(Strategy):
    """A strategy that checks each reply before the wrapped strategy aggregates it.

    Args:
        strategy: The Flower strategy that samples, configures and aggregates.
        reference: ``{name: (dtype, shape)}`` of the global trainable parameters.
        history: Where to record per-client metrics and dropped replies.
        timeout: The round timeout in seconds, named in the reason recorded for a node that sent no
        reply.
        straggler_timeout: Seconds a round waited for missing replies once its first came (see
            :class:`~onnxblocks.federated.grid.PromptGrid`), named in that reason too.
    """

    def __init__(
        self,
        strategy: Strategy,
        reference: Specs,
        history: FederatedHistory,
        timeout: float | None = None,
        straggler_timeout: float | None = None,
    ) -> None:
        self.strategy = strategy
        self.reference = dict(reference)
        self.history = history
        self.timeout = timeout
        self.straggler_timeout = straggler_timeout
        self._global: dict[str, np.ndarray] = {}
        self._started = time.perf_counter()
        self._asked: dict[str, list[int]] = {"train": [], "evaluate": []}

    def summary(self) -> None:
        """Log the wrapped strategy's summary."""
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's messages (the global parameters are kept to measure each
        update).
        """
        self._started = time.perf_counter()
        self._global = from_record(arrays)
        return self._sent(
            "train", self.strategy.configure_train(server_round, arrays, config, grid)
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Drop the replies that fail the checks, then aggregate the others with the wrapped
        strategy.
        """
        kept = self._screen(
            server_round,
            "train",
            replies,
            lambda content: check_train_reply(content, self.reference),
        )
        self.history.rounds = max(self.history.rounds, server_round)
        if not kept:
            logger.warning(
                "round %d: no training reply passed the checks; the global model stays",
                server_round,
            )
            return None, None
        arrays, metrics = self.strategy.aggregate_train(server_round, kept)
        if arrays is not None:
            received = from_record(arrays)
            aggregate = self._as_reference_dtypes(received)
            reason = check_arrays(aggregate, self.reference)
            if any(aggregate[n] is not received[n] for n in received):
                arrays = to_record(aggregate)
            if reason is not None:
                logger.warning("round %d: the aggregate was refused: %s", server_round, reason)
                self.history.dropped.append(
                    {
                        "round": server_round,
                        "phase": "aggregate",
                        "node": None,
                        "reason": f"the aggregate: {reason}",
                    }
                )
                arrays = None
        if metrics is not None:
            self.history.train.append({"round": server_round, **_plain(metrics)})
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluation messages."""
        return self._sent(
            "evaluate", self.strategy.configure_evaluate(server_round, arrays, config, grid)
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Drop the evaluation replies that fail the checks, then aggregate the others."""
        kept = self._screen(server_round, "evaluate", replies, check_evaluate_reply)
        metrics = self.strategy.aggregate_evaluate(server_round, kept) if kept else None
        if metrics is not None:
            self.history.evaluate.append({"round": server_round, **_plain(metrics)})
        self.history.seconds.append(time.perf_counter() - self._started)
        return metrics

    # ------------------------------------------------------------------ helpers
    def _sent(self, phase: str, messages: Iterable[Message]) -> list[Message]:
        """The messages, with the nodes they go to remembered (to name the ones that never
        answer).
        """
        sent = list(messages)
        self._asked[phase] = [int(m.metadata.dst_node_id) for m in sent]
        return sent

    def _screen(
        self,
        server_round: int,
        phase: str,
        replies: Iterable[Message],
        check: Callable[[Any], str | None],
    ) -> list[Message]:
        """The replies of ``phase`` that pass ``check`` and share metric keys; the others dropped
        and recorded.
        """
        replies = list(replies)
        self._silent(server_round, phase, replies)
        kept = []
        for message in replies:
            reason = self._reason(message, check)
            if reason is not None:
                self._drop(server_round, phase, message, reason)
                continue
            kept.append(message)
        kept = self._same_metric_keys(server_round, phase, kept)
        for message in kept:
            self._record_client(server_round, phase, message)
        return kept

    def _silent(self, server_round: int, phase: str, replies: list[Message]) -> None:
        """Record the nodes that were asked and sent no reply (they hung, or died without an
        error reply).
        """
        answered = {_node(m) for m in replies}
        within = (
            f" within the round timeout ({self.timeout:g} s)" if self.timeout is not None else ""
        )
        if self.straggler_timeout is not None:
            within += f" or {self.straggler_timeout:g} s after the round's first reply"

        for node in self._asked[phase]:
            if node not in answered:
                reason = f"no reply{within}"
                logger.warning(
                    "round %d: dropped node %s from %s: %s", server_round, node, phase, reason
                )
                self.history.dropped.append(
                    {"round": server_round, "phase": phase, "node": node, "reason": reason}
                )
        self._asked[phase] = []

    def _as_reference_dtypes(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Flower's server optimizers and DP noise compute in float64: back to the global
        parameters' float dtypes.
        """
        out = {}
        for name, array in arrays.items():
            want = self.reference.get(name)
            same_kind = (
                want is not None and array.dtype.kind == "f" and np.dtype(want[0]).kind == "f"
            )
            out[name] = array.astype(want[0]) if same_kind and array.dtype != want[0] else array  # type: ignore[index]
        return out

    @staticmethod
    def _reason(message: Message, check: Any) -> str | None:
        if message.has_error():
            return f"the client failed: {message.error.reason}"
        try:
            return check(message.content)
        except (
            Exception
        ) as exc:  # a reply malformed in a way no check foresaw is dropped, never fatal
            return f"its reply cannot be read ({type(exc).__name__}: {exc})"

    def _drop(self, server_round: int, phase: str, message: Message, reason: str) -> None:
        node = _node(message)
        logger.warning(
            "round %d: dropped the %s reply of node %s: %s", server_round, phase, node, reason
        )
        self.history.dropped.append(
            {"round": server_round, "phase": phase, "node": node, "reason": reason}
        )

    def _same_metric_keys(
        self, server_round: int, phase: str, kept: list[Message]
    ) -> list[Message]:
        """Flower refuses to aggregate metric records with different keys: keep those like the
        most common.
        """
        if not kept:
            return kept
        keys = [frozenset(next(iter(m.content.metric_records.values())).keys()) for m in kept]
        common = max(set(keys), key=keys.count)
        for message, own in zip(kept, keys, strict=True):
            if own != common:
                self._drop(
                    server_round,
                    phase,
                    message,
                    f"its metrics {sorted(own)} differ from the others' {sorted(common)}",
                )
        return [m for m, own in zip(kept, keys, strict=True) if own == common]

    def _record_client(self, server_round: int, phase: str, message: Message) -> None:
        content = message.content
        row: dict[str, Any] = {"round": server_round, "phase": phase, "node": _node(message)}
        info: Any = content.config_records.get("client")
        row["partition"] = (
            int(info["partition-id"]) if info is not None and "partition-id" in info else None
        )
        for key in ("backend", "kind"):  # kind: python, node or browser (bridge nodes)
            if info is not None and key in info:
                row[key] = str(info[key])
        row.update(_plain(next(iter(content.metric_records.values()))))
        if phase == "train" and self._global:
            arrays = from_record(next(iter(content.array_records.values())))
            squares = sum(
                float(np.sum((arrays[n].astype(np.float64) - g) ** 2))
                for n, g in self._global.items()
            )
            row["update-norm"] = float(np.sqrt(squares))
        self.history.clients.append(row)


def _node(message: Message) -> int | None:
    try:
        return int(message.metadata.src_node_id)
    except Exception:  # a message without metadata (built in a test): no node id
        return None


def _plain(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else float(v)) for k, v in metrics.items()}

"""What a federation recorded, round by round: aggregated, per-client and server-side metrics,
dropped replies.

:class:`FederatedHistory` is written as JSON by the ServerApp (``history`` in the run config) and
plotted like :func:`onnxblocks.runtime.plot_history` plots ``fit``'s history, with
:func:`~onnxblocks.runtime.save_line_plot` (SVG built in, PNG with matplotlib).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import InvalidValueError, UnknownNameError
from onnxblocks.runtime.plot import PALETTE, save_line_plot

#: Where a metric comes from: the strategy's aggregate of the clients' training or evaluation
#: replies, or the server's own evaluation on held-out data.
SOURCES = ("train", "evaluate", "server")


@dataclass
class FederatedHistory:
    """The record of one federated run.

    Attributes:
        train: One dict per round with the aggregated training metrics (``round``, ``train-loss``
        ...).
        evaluate: One dict per round with the aggregated client evaluation metrics (``eval-loss``,
        ``accuracy``).
        server: One dict per server-side evaluation (round 0 is the initial model): ``eval-loss``,
        ``accuracy``.
        clients: One dict per client reply kept: ``round``, ``phase`` (``train`` or ``evaluate``),
        ``node``,
            ``partition`` (when the client said), its metrics, and for training ``update-norm`` (the
            L2 norm
            of its parameters minus the global ones).
        dropped: One dict per reply dropped: ``round``, ``phase``, ``node`` and ``reason``.
        rounds: The number of rounds run.
        seconds: One wall time per round (training and evaluation of the round).
    """

    train: list[dict[str, Any]] = field(default_factory=list)
    evaluate: list[dict[str, Any]] = field(default_factory=list)
    server: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    seconds: list[float] = field(default_factory=list)

    def metric(self, name: str, source: str = "train") -> list[tuple[int, float]]:
        """``(round, value)`` of metric ``name`` from ``source`` (``train``, ``evaluate`` or
        ``server``).

        Raises:
            InvalidValueError: for an unknown source.
            UnknownNameError: when no round recorded ``name`` there.
        """
        if source not in SOURCES:
            raise InvalidValueError(
                f"FederatedHistory.metric: source must be one of {SOURCES}, got {source!r}."
            )
        rows = getattr(self, source)
        values = [(int(r["round"]), float(r[name])) for r in rows if name in r]
        if not values:
            known = sorted({k for r in rows for k in r} - {"round"})
            raise UnknownNameError(
                f"No round logged '{name}' in the {source} metrics. Logged: {known}."
            )
        return values

    def client_metric(self, name: str, phase: str = "train") -> dict[str, list[tuple[int, float]]]:
        """``{client label: [(round, value), ...]}`` of metric ``name`` in ``phase`` (label:
        partition, else node).
        """
        out: dict[str, list[tuple[int, float]]] = {}
        for row in self.clients:
            if row["phase"] == phase and name in row:
                out.setdefault(client_label(row), []).append((int(row["round"]), float(row[name])))
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-encodable copy."""
        return {
            "rounds": self.rounds,
            "train": [dict(r) for r in self.train],
            "evaluate": [dict(r) for r in self.evaluate],
            "server": [dict(r) for r in self.server],
            "clients": [dict(r) for r in self.clients],
            "dropped": [dict(r) for r in self.dropped],
            "seconds": list(self.seconds),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FederatedHistory:
        """The history :meth:`to_dict` wrote."""
        known = {"rounds", "train", "evaluate", "server", "clients", "dropped", "seconds"}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: str | os.PathLike) -> Path:
        """Write the history as JSON (atomically)."""
        from onnxblocks.io import atomic_file

        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(out) as temp:
            temp.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=True), encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> FederatedHistory:
        """Read a history :meth:`save` wrote."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def plot(
        self, path: str | os.PathLike, metric: str = "loss", title: str = "", backend: str = "auto"
    ) -> Path:
        """Save a per-round plot of the global and per-client values of ``metric`` (SVG, or PNG with
        matplotlib).

        ``metric="loss"`` draws the global training loss (the clients' weighted mean), the clients'
        evaluation
        loss, the server's held-out loss and each client's training loss (faint);
        ``metric="accuracy"`` draws
        the clients' and the server's accuracy and each client's accuracy. Any other name is drawn
        from every
        source that logged it.

        Raises:
            InvalidValueError: when no round logged ``metric``.
        """
        series: dict[str, tuple[list[int], list[float]]] = {}
        styles: dict[str, dict[str, Any]] = {}
        pairs = {
            "loss": [("train", "train-loss"), ("evaluate", "eval-loss"), ("server", "eval-loss")],
        }.get(metric, [(s, metric) for s in SOURCES])
        labels = {
            "train": "clients (weighted)",
            "evaluate": "clients' evaluation",
            "server": "server (held out)",
        }
        for i, (source, name) in enumerate(pairs):
            try:
                points = self.metric(name, source)
            except UnknownNameError:
                continue
            label = f"{name}: {labels[source]}"
            series[label] = ([r for r, _ in points], [v for _, v in points])
            styles[label] = {"color": PALETTE[i % len(PALETTE)], "width": 2.5}
        phase, per_client = ("train", "train-loss") if metric == "loss" else ("evaluate", metric)
        for j, (client, points) in enumerate(self.client_metric(per_client, phase).items()):
            label = f"{per_client}: client {client}"
            series[label] = ([r for r, _ in points], [v for _, v in points])
            styles[label] = {"color": PALETTE[(j + 3) % len(PALETTE)], "width": 1.2, "alpha": 0.55}
        if not any(math.isfinite(v) for _, ys in series.values() for v in ys):
            raise InvalidValueError(f"Cannot plot '{path}': no round logged a finite '{metric}'.")
        return save_line_plot(
            path,
            series,
            title=title or f"Federated {metric} per round",
            xlabel="round",
            ylabel=metric,
            styles=styles,
            backend=backend,
        )


def client_label(row: dict[str, Any]) -> str:
    """How a client is named in plots: its partition id when it sent one, else its node id."""
    return str(row["partition"]) if row.get("partition") is not None else f"node {row['node']}"

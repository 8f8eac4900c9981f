"""The server side: the Flower ServerApp that federates an artifacts directory.

The server opens the artifacts (:class:`~onnxblocks.runtime.TrainingSession`), sends their trainable
parameters as the initial global model, and runs one of Flower's strategies
(:func:`~onnxblocks.federated.strategy.build_strategy`) behind
:class:`~onnxblocks.federated.strategy.ValidatingStrategy`. After each round it can evaluate the
global model on held-out data (``eval-data``); after the last it writes a checkpoint in the
artifacts' format with the trainable parameters replaced (``save``), an inference model
(``export``), the :class:`~onnxblocks.federated.history.FederatedHistory` as JSON (``history``) and
its plots (``plot``).

Run config keys (``[tool.flwr.app.config]`` of the Flower app, or ``flwr run --run-config``); each
is a field of :class:`ServerSettings` with ``-`` for ``_``, and ``num-server-rounds`` for
``rounds``:
``artifacts``, ``backend``, ``num-server-rounds``, ``strategy``, ``local-epochs``, ``lr``,
``batch-size``, ``shuffle``, ``seed``, ``local-steps``, ``proximal-mu``, ``server-lr``,
``min-nodes``, ``fraction-train``, ``fraction-evaluate``, ``round-timeout``,
``straggler-timeout``, ``eval-data``,
``save``, ``export``, ``history``, ``plot``, ``dp-clipping-norm``, ``dp-noise-multiplier``,
``keep-optimizer-state`` (read by the ClientApp: each node keeps its optimizer state between
rounds).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)
from onnxblocks.federated.grid import PromptGrid
from onnxblocks.federated.history import FederatedHistory
from onnxblocks.federated.local import LocalConfig, has_classes, pick_arrays
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.federated.strategy import ValidatingStrategy, build_strategy
from onnxblocks.federated.validation import specs_of
from onnxblocks.runtime import Accuracy, ArrayBatches, TrainingSession, evaluate, load_npz

logger = logging.getLogger("onnxblocks.federated")

#: Run config keys that are not fields of ServerSettings under their own name.
_ALIASES = {"num-server-rounds": "rounds"}


@dataclass(frozen=True)
class ServerSettings:
    """What the ServerApp does (see the module docstring for the run config keys).

    Attributes:
        artifacts: The artifacts directory (its checkpoint is the initial global model).
        backend: The server's session backend: ``auto``, ``training`` or ``portable``.
        rounds: Federated rounds.
        strategy: ``fedavg``, ``fedprox``, ``fedadam`` or ``fedyogi``.
        local_epochs: Client epochs per round (sent as ``local-epochs``).
        lr: Client learning rate (``lr``); None keeps the artifacts' optimizer's.
        batch_size: Client batch size (``batch-size``).
        shuffle: Clients shuffle their rows each epoch; False keeps file order.
        seed: Seed of the clients' shuffling.
        local_steps: Exact client optimizer steps per round instead of epochs.
        proximal_mu: FedProx's ``mu`` (``fedprox`` only).
        server_lr: FedAdam's and FedYogi's server learning rate.
        min_nodes: Nodes to wait for and sample each round.
        fraction_train: Fraction of the nodes sampled for training.
        fraction_evaluate: Fraction of the nodes sampled for evaluation (0: no client evaluation).
        round_timeout: Seconds to wait for the replies of a round; a client later than that is
        dropped.
        straggler_timeout: Seconds a round still waits for the missing replies once its first reply
            came (None: until every reply came or ``round_timeout`` passed); a node that hangs then
            costs this much, not the whole round timeout.
        eval_data: A held-out ``.npz`` the server evaluates the global model on after each round.
        save: Where to write the final checkpoint.
        export: Where to write the final inference model (``.onnx``).
        history: Where to write the history (JSON).
        plot: Where to plot the loss per round (``.svg`` or ``.png``); an accuracy plot goes beside
        it
            (``<stem>-accuracy<suffix>``) when accuracy was measured.
        dp_clipping_norm: Server-side differential privacy with this fixed clipping norm.
        dp_noise_multiplier: The DP noise multiplier.
        keep_optimizer_state: Each client keeps its optimizer state between rounds in its node's
            ``Context.state`` (the ClientApp reads ``keep-optimizer-state`` from the run config);
            False: it
            starts fresh every round.
    """

    artifacts: str
    backend: str = "auto"
    rounds: int = 3
    strategy: str = "fedavg"
    local_epochs: int = 1
    lr: float | None = None
    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    local_steps: int | None = None
    proximal_mu: float = 0.0
    server_lr: float = 0.1
    min_nodes: int = 2
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    round_timeout: float = 3600.0
    straggler_timeout: float | None = None
    eval_data: str | None = None
    save: str | None = None
    export: str | None = None
    history: str | None = None
    plot: str | None = None
    dp_clipping_norm: float | None = None
    dp_noise_multiplier: float = 0.0
    keep_optimizer_state: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise InvalidValueError(
                f"ServerSettings: num-server-rounds must be an int >= 1, got {self.rounds!r}."
            )
        if not (isinstance(self.round_timeout, (int, float)) and self.round_timeout > 0):
            raise InvalidValueError(
                f"ServerSettings: round-timeout must be > 0 seconds, got {self.round_timeout!r}."
            )
        late = self.straggler_timeout
        if late is not None and not (isinstance(late, (int, float)) and late > 0):
            raise InvalidValueError(
                f"ServerSettings: straggler-timeout must be > 0 seconds, got {late!r}."
            )
        self.local_config()  # the client settings, checked here rather than on every client

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **overrides: Any) -> ServerSettings:
        """Settings from a Flower run config (hyphenated keys), then ``overrides`` (field names).

        Unknown keys are left to the ClientApp (``data-path-<partition-id>`` ...).

        Raises:
            UnknownNameError: when there is no ``artifacts``, or an override is not a field.
            InvalidValueError, InvalidTypeError: for a value of the wrong kind or out of range.
        """
        names = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            name = _ALIASES.get(key, key.replace("-", "_"))
            if name in names and raw is not None and raw != "":
                values[name] = raw
        for name, raw in overrides.items():
            if name not in names:
                raise UnknownNameError(
                    f"ServerSettings has no field '{name}'.{did_you_mean(name, list(names))}"
                )
            if raw is not None:
                values[name] = raw
        if "artifacts" not in values:
            raise UnknownNameError(
                "The ServerApp has no artifacts directory: set run config 'artifacts' or pass "
                "make_server_app(artifacts=DIR)."
            )
        return cls(**{name: _coerce(name, names[name].type, raw) for name, raw in values.items()})

    def local_config(self) -> LocalConfig:
        """The clients' per-round settings (sent as the ``config`` ConfigRecord)."""
        return LocalConfig(
            local_epochs=self.local_epochs,
            lr=self.lr,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            local_steps=self.local_steps,
        )


def _coerce(name: str, annotation: Any, raw: Any) -> Any:
    """A run-config value as the field's type (TOML gives ints for floats like ``1``).

    Raises:
        InvalidTypeError: for a value that is not of the field's kind.
    """
    kind = str(annotation).split(" ")[0]
    value = _converted(kind, raw)
    if value is None:
        key = {v: k for k, v in _ALIASES.items()}.get(name, name.replace("_", "-"))
        raise InvalidTypeError(f"Run config '{key}' must be {kind}, got {raw!r:.60}.")
    return value


def _converted(kind: str, raw: Any) -> Any:
    """``raw`` as ``kind`` (``int``, ``float``, ``bool`` or ``str`` first in the annotation), or
    None.
    """
    if kind.startswith("str"):
        return str(raw)
    if kind.startswith("bool"):
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        return raw if isinstance(raw, bool) else None
    if isinstance(raw, bool):
        return None
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return None
    if kind.startswith("int"):
        return int(number) if number.is_integer() else None
    return number


def build_server_strategy(settings: ServerSettings) -> Any:
    """The Flower strategy ``settings`` name (FedProx sends ``proximal-mu`` itself)."""
    return build_strategy(
        settings.strategy,
        min_nodes=settings.min_nodes,
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        proximal_mu=settings.proximal_mu,
        server_lr=settings.server_lr,
        dp_clipping_norm=settings.dp_clipping_norm,
        dp_noise_multiplier=settings.dp_noise_multiplier,
    )


def run_server(grid: Any, settings: ServerSettings, strategy: Any = None) -> FederatedHistory:
    """Run the federation on ``grid`` and write what ``settings`` asks for.

    Args:
        grid: Flower's ``Grid`` (the ServerApp's first argument).
        settings: The :class:`ServerSettings`.
        strategy: A Flower strategy to use instead of the one ``settings`` names (it is wrapped in
            :class:`~onnxblocks.federated.strategy.ValidatingStrategy` all the same).

    Returns:
        The :class:`~onnxblocks.federated.history.FederatedHistory`.
    """
    from flwr.app import ConfigRecord, MetricRecord

    session = TrainingSession(settings.artifacts, backend=settings.backend)
    initial = session.parameters(trainable_only=True)
    history = FederatedHistory()
    chosen = strategy or build_server_strategy(settings)
    late = settings.straggler_timeout
    wrapped = ValidatingStrategy(
        chosen,
        specs_of(initial),
        history,
        timeout=float(settings.round_timeout),
        straggler_timeout=None if late is None else float(late),
    )
    evaluate_fn = None
    if settings.eval_data is not None:
        held_out = _held_out(session, settings.eval_data)

        def evaluate_fn(server_round: int, arrays: Any) -> Any:
            metrics = _evaluate_global(session, from_record(arrays), held_out)
            history.server.append({"round": server_round, **metrics})
            logger.info("round %d: server evaluation %s", server_round, metrics)
            return MetricRecord(metrics)

    # Flower's strategies call only send_and_receive and what PromptGrid hands on to ``grid``
    prompt: Any = PromptGrid(grid, wrapped.straggler_timeout)
    result = wrapped.start(
        grid=prompt,
        initial_arrays=to_record(initial),
        num_rounds=settings.rounds,
        timeout=float(settings.round_timeout),
        train_config=ConfigRecord(settings.local_config().to_config()),
        evaluate_config=ConfigRecord({"batch-size": max(settings.batch_size, 256)}),
        evaluate_fn=evaluate_fn,
    )
    final = from_record(result.arrays) if len(result.arrays) else initial
    session.set_parameters(final)
    write_outputs(session, history, settings)
    return history


def _held_out(session: TrainingSession, path: str) -> ArrayBatches:
    columns = pick_arrays(load_npz(path), session.eval_input_names, f"'{path}'")
    return ArrayBatches(columns, batch_size=1024, shuffle=False)


def _evaluate_global(
    session: TrainingSession, parameters: Mapping[str, np.ndarray], data: ArrayBatches
) -> dict:
    session.set_parameters(parameters)
    callbacks = [Accuracy(output=1)] if has_classes(session, data.arrays) else []
    logs = evaluate(session, data, callbacks)
    out = {"eval-loss": float(logs["eval_loss"])}
    if callbacks:
        out["accuracy"] = float(logs["accuracy"])
    return out


def write_outputs(
    session: TrainingSession, history: FederatedHistory, settings: ServerSettings
) -> None:
    """The final checkpoint, inference model, history and plots that ``settings`` asks for."""
    if settings.save:
        session.save_checkpoint(settings.save, include_optimizer_state=False)
    if settings.export:
        session.export_inference_model(settings.export)
    if settings.history:
        history.save(settings.history)
    if settings.plot:
        path = Path(settings.plot)
        measured = any("accuracy" in row for row in (*history.evaluate, *history.server))
        metrics = ["loss", "accuracy"] if measured else ["loss"]
        for metric in metrics:
            target = (
                path if metric == "loss" else path.with_name(f"{path.stem}-{metric}{path.suffix}")
            )
            try:
                history.plot(target, metric)
            except (
                InvalidValueError
            ) as exc:  # nothing finite to draw (every round dropped): the run still succeeded
                logger.warning("no plot written to %s: %s", target, exc)


def make_server_app(
    artifacts: str | os.PathLike | None = None, *, strategy: Any = None, **settings: Any
) -> Any:
    """A Flower ``ServerApp`` federating ``artifacts``.

    Args:
        artifacts: The artifacts directory; None: run config ``artifacts``.
        strategy: A strategy name (``fedavg``, ``fedprox``, ``fedadam``, ``fedyogi``), or a Flower
        strategy
            object to run instead of the one the settings name.
        **settings: :class:`ServerSettings` fields; they win over the run config.

    Returns:
        The ``flwr.serverapp.ServerApp``; its ``main`` reads the run config when the run starts.
    """
    from flwr.serverapp import ServerApp

    if artifacts is not None:
        settings["artifacts"] = os.fspath(artifacts)
    if isinstance(strategy, str):
        settings["strategy"], strategy = strategy, None
    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        chosen = ServerSettings.from_run_config(dict(context.run_config), **settings)
        run_server(grid, chosen, strategy)

    return app

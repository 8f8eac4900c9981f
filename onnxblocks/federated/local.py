"""One client's round without Flower: load the global parameters, train with ``fit``, return the
update.

:func:`train_client` and :func:`evaluate_client` open a fresh
:class:`~onnxblocks.runtime.TrainingSession`
over the artifacts (either backend; parameters and optimizer state from the artifacts' checkpoint,
so the optimizer state is fresh every round), write the global trainable parameters into it, and
train with :func:`~onnxblocks.runtime.fit` (or evaluate) on the client's data. FedProx's proximal
term is a gradient hook (:func:`proximal_term`) that the session runs between ``train_step`` and the
optimizer step.

A client may keep its optimizer state between rounds (opt-in: ``keep-optimizer-state``):
:func:`train_client` returns it (``keep_optimizer_state=True``) and restores it
(``optimizer_state=``)
after writing the global parameters (:mod:`~onnxblocks.federated.optimizer_state`; either backend).

The data is an ``.npz`` in ``onnxblocks train``'s format (docs/cli.md): one array per model input
named after it, or ``arr_0, arr_1, ...`` in input order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.federated.optimizer_state import (
    KeptOptimizerState,
    read_optimizer_state,
    write_optimizer_state,
)
from onnxblocks.federated.validation import WEIGHT_KEY
from onnxblocks.runtime import Accuracy, ArrayBatches, TrainingSession, evaluate, fit, load_npz

#: What a client's data may be: an ``.npz`` path, or arrays by input name.
DataSource = str | os.PathLike | Mapping[str, np.ndarray]


@dataclass(frozen=True)
class LocalConfig:
    """How a client trains in one round: the ``config`` ConfigRecord the strategy sends.

    Attributes:
        local_epochs: Epochs over the local data (``local-epochs``).
        lr: Learning rate; None keeps the optimizer model's (``lr``).
        batch_size: Rows per batch (``batch-size``).
        shuffle: Shuffle the rows each epoch; False takes batches in file order (``shuffle``).
        seed: Seed of the shuffling (``seed``).
        proximal_mu: FedProx: ``mu * (w - w_global)`` is added to each gradient before the
            optimizer step (``proximal-mu``; 0 is plain local training).
        local_steps: Exactly this many optimizer steps instead of ``local_epochs``
        (``local-steps``).
    """

    local_epochs: int = 1
    lr: float | None = None
    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    proximal_mu: float = 0.0
    local_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("local_epochs", "batch_size", "seed", "local_steps"):
            value = getattr(self, name)
            if value is None and name == "local_steps":
                continue
            low = 0 if name == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise InvalidValueError(
                    f"LocalConfig: {_key(name)} must be an int >= {low}, got {value!r}."
                )
        if self.lr is not None:
            _hyper.learning_rate(self.lr, "LocalConfig: lr")  # the one check of learning rates
        _hyper.nonnegative(self.proximal_mu, "LocalConfig: proximal-mu")
        if not isinstance(self.shuffle, (bool, np.bool_)):
            raise InvalidTypeError(f"LocalConfig: shuffle must be a bool, got {self.shuffle!r}.")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LocalConfig:
        """The settings in a ConfigRecord (``local-epochs``, ``lr``, ...); other keys are ignored.

        Raises:
            InvalidValueError: for a value out of range.
        """
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = _key(f.name)
            if key in config and config[key] is not None:
                values[f.name] = config[key]
        for name in ("lr", "proximal_mu"):  # TOML and Flower give ints for whole numbers
            if isinstance(values.get(name), int) and not isinstance(values[name], bool):
                values[name] = float(values[name])
        return cls(**values)

    def to_config(self) -> dict[str, Any]:
        """The ConfigRecord entries (hyphenated keys; None values left out)."""
        return {
            _key(f.name): getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None
        }


@dataclass
class ClientUpdate:
    """What one client's local training returns.

    Attributes:
        parameters: The trained trainable parameters, by name (the checkpoint's dtypes and shapes).
        num_examples: Training rows the client holds (the weight of its update).
        metrics: ``train-loss`` (mean over the round's steps), ``steps`` and ``train-seconds`` (the
        wall time
            of ``fit``).
        backend: The session's backend (``training`` or ``portable``).
        optimizer_state: The optimizer state after training, when asked for
        (``keep_optimizer_state``).
    """

    parameters: dict[str, np.ndarray]
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    backend: str = ""
    optimizer_state: KeptOptimizerState | None = None


def open_session(artifacts: str | os.PathLike, backend: str = "auto") -> TrainingSession:
    """A fresh session over ``artifacts`` (parameters and optimizer state from its checkpoint)."""
    return TrainingSession(artifacts, backend=backend, check_inputs=True)


def load_global(session: TrainingSession, parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Write the global ``parameters`` into ``session``; they must be exactly its trainable
    parameters.

    Returns:
        The parameters as arrays, by name.

    Raises:
        UnknownNameError: for a name that is not a trainable parameter, or a trainable one missing.
        InvalidValueError: for a dtype or shape that differs from the parameter's.
    """
    trainable = session.parameter_names(trainable_only=True)
    unknown = [n for n in parameters if n not in trainable]
    if unknown:
        frozen = [n for n in unknown if n in session.parameter_names()]
        what = (
            "frozen (frozen parameters never travel)"
            if frozen
            else "not parameters of the artifacts"
        )
        raise UnknownNameError(
            f"The global parameters {preview(unknown)} are "
            f"{what}.{did_you_mean(unknown[0], trainable)} "
            f"Trainable parameters: {preview(trainable)}."
        )
    missing = [n for n in trainable if n not in parameters]
    if missing:
        raise UnknownNameError(
            f"The global parameters lack the trainable parameter(s) {preview(missing)}; the "
            "server must send "
            "every trainable parameter of the artifacts."
        )
    arrays = {n: np.asarray(parameters[n], order="C") for n in trainable}  # 0-d stays 0-d
    session.set_parameters(arrays)
    return arrays


def pick_arrays(
    arrays: Mapping[str, np.ndarray], inputs: Sequence[str], source: str
) -> tuple[np.ndarray, ...]:
    """One array per model input: by input name, else ``arr_0, arr_1, ...`` in input order.

    Raises:
        UnknownNameError: when an input has no array.
    """
    if all(n in arrays for n in inputs):
        return tuple(arrays[n] for n in inputs)
    positional = [f"arr_{i}" for i in range(len(inputs))]
    if all(p in arrays for p in positional):
        return tuple(arrays[p] for p in positional)
    missing = [n for n in inputs if n not in arrays]
    raise UnknownNameError(
        f"{source} has arrays {sorted(arrays)} but none for the model input(s) {missing}. Save "
        "the arrays under "
        f"the input names (numpy.savez(path, {', '.join(f'{n}=...' for n in inputs)}))."
    )


def _arrays_of(data: DataSource) -> tuple[dict[str, np.ndarray], str]:
    if isinstance(data, Mapping):
        return dict(data), "the client's data"
    if isinstance(data, (str, os.PathLike)):
        return load_npz(data), f"'{os.fspath(data)}'"
    raise InvalidTypeError(
        "A client's data must be an .npz path or a dict of arrays by input name, not "
        f"{type(data).__name__}."
    )


def proximal_term(mu: float, anchor: Mapping[str, np.ndarray]) -> Callable[[TrainingSession], None]:
    """A gradient hook adding ``mu * (w - anchor)`` to each trainable parameter's gradient
    (FedProx).

    Set as ``session.gradient_reducer``: the session calls it between ``train_step`` and the
    optimizer step, on the gradients about to be applied.
    """

    def add_proximal(session: TrainingSession) -> None:
        gradients = session.gradients()
        session.set_gradients(
            {
                name: (grad + mu * (session.get_parameter(name) - anchor[name])).astype(
                    grad.dtype, copy=False
                )
                for name, grad in gradients.items()
            }
        )

    return add_proximal


def train_client(
    artifacts: str | os.PathLike,
    data: DataSource,
    parameters: Mapping[str, Any],
    config: LocalConfig | Mapping[str, Any] = LocalConfig(),
    *,
    backend: str = "auto",
    optimizer_state: KeptOptimizerState | None = None,
    keep_optimizer_state: bool = False,
) -> ClientUpdate:
    """One client's local training in one round.

    The session starts from the artifacts' checkpoint (so its optimizer state is fresh unless
    ``optimizer_state`` is given), takes the global ``parameters``, and trains with
    :func:`~onnxblocks.runtime.fit` on ``data``.

    Args:
        artifacts: The artifacts directory (``generate_artifacts``; portable ones run on stock
        onnxruntime).
        data: The client's training data: an ``.npz`` path or arrays by input name.
        parameters: The global trainable parameters, by name.
        config: A :class:`LocalConfig`, or the ConfigRecord the strategy sent.
        backend: ``auto``, ``training`` or ``portable``.
        optimizer_state: The client's optimizer state from its previous round
            (:attr:`ClientUpdate.optimizer_state`), restored before training; None starts fresh.
        keep_optimizer_state: Return the optimizer state after training in the update.

    Returns:
        The :class:`ClientUpdate`.

    Raises:
        UnknownNameError: if ``parameters`` are not the artifacts' trainable parameters, or the data
            lacks an input.
        InvalidValueError: for a config value out of range, data that does not fit the model, or an
            ``optimizer_state`` of other artifacts.
    """
    settings = config if isinstance(config, LocalConfig) else LocalConfig.from_config(config)
    session = open_session(artifacts, backend)
    anchor = load_global(session, parameters)
    if optimizer_state is not None:
        write_optimizer_state(session, optimizer_state)
    arrays, source = _arrays_of(data)
    columns = pick_arrays(arrays, session.input_names, source)
    batches = ArrayBatches(
        columns, batch_size=settings.batch_size, shuffle=settings.shuffle, seed=settings.seed
    )
    if settings.lr is not None:
        session.learning_rate = settings.lr
    if settings.proximal_mu > 0:
        session.gradient_reducer = proximal_term(settings.proximal_mu, anchor)
    steps = settings.local_steps
    epochs = settings.local_epochs if steps is None else math.ceil(steps / len(batches))
    history = fit(session, batches, epochs=epochs, progress=False, max_steps=steps)
    trained = session.parameters(trainable_only=True)
    losses = np.asarray(history.losses, np.float64)
    metrics = {
        "train-loss": float(losses.mean()) if losses.size else math.nan,
        "steps": float(history.steps),
        "train-seconds": float(history.seconds),
    }
    kept = read_optimizer_state(session) if keep_optimizer_state else None
    return ClientUpdate(trained, batches.num_rows, metrics, session.backend, kept)


def evaluate_client(
    artifacts: str | os.PathLike,
    data: DataSource,
    parameters: Mapping[str, Any],
    *,
    batch_size: int = 256,
    backend: str = "auto",
) -> dict[str, float]:
    """Evaluate the global ``parameters`` on a client's data with the eval model.

    Returns:
        ``num-examples``, ``eval-loss`` (row-weighted mean) and, when the labels are class indices
        and the eval model returns scores after the loss, ``accuracy``.

    Raises:
        As :func:`train_client`.
    """
    session = open_session(artifacts, backend)
    load_global(session, parameters)
    arrays, source = _arrays_of(data)
    columns = pick_arrays(arrays, session.eval_input_names, source)
    batches = ArrayBatches(columns, batch_size=batch_size, shuffle=False)
    callbacks = [Accuracy(output=1)] if has_classes(session, columns) else []
    logs = evaluate(session, batches, callbacks)
    out = {WEIGHT_KEY: float(batches.num_rows), "eval-loss": float(logs["eval_loss"])}
    if callbacks:
        out["accuracy"] = float(logs["accuracy"])
    return out


def has_classes(session: TrainingSession, columns: tuple[np.ndarray, ...]) -> bool:
    """True when the last eval input holds class indices and the eval model returns scores after
    the loss.
    """
    labels = columns[-1]
    return len(session.eval_output_names) > 1 and labels.dtype.kind in "iu" and len(columns) > 1


def _key(name: str) -> str:
    return name.replace("_", "-")

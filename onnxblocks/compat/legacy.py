"""ONNX Runtime's pre-1.15 training API, as a drop-in: TrainingParameters, TrainingSession,
GradientGraphBuilder.

Replace::

    from onnxruntime import TrainingParameters, TrainingSession

with::

    from onnxblocks.compat.legacy import TrainingParameters, TrainingSession

and the program runs on stock ``onnxruntime`` (any Python, 3.13 included). The
session builds portable artifacts with a fused step (:func:`onnxblocks.generate_artifacts`
with ``portable=True``) on first use, cached under ``<cache>/legacy-training/<key>``
(``$ONNXBLOCKS_CACHE``, ``$XDG_CACHE_HOME/onnxblocks`` or ``~/.cache/onnxblocks``),
keyed by the model's bytes and the parameters, written atomically; ``run`` then
feeds the batch, trains one step and returns the fetches. docs/torch.md ("The
pre-1.15 API") shows each legacy program beside its onnxblocks equivalent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx

from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    StateError,
    UnknownNameError,
    did_you_mean,
)
from onnxblocks.compat import _legacy_state as _state
from onnxblocks.compat._legacy_gradient import GradientGraphBuilder
from onnxblocks.compat._legacy_optim import optimizer_for
from onnxblocks.compat._legacy_parameters import TrainingParameters, load_model_arg

__all__ = ["GradientGraphBuilder", "TrainingParameters", "TrainingSession"]


class NodeArg(NamedTuple):
    """An input or output of the session, as ``onnxruntime.NodeArg`` shows it."""

    name: str
    type: str
    shape: list


def _node_arg(info: onnx.ValueInfoProto) -> NodeArg:
    tensor = info.type.tensor_type
    dtype = (
        onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        if tensor.elem_type
        else "undefined"
    )
    shape = [
        d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim
    ]
    kind = {"float32": "float", "float64": "double"}.get(dtype, dtype)
    return NodeArg(info.name, f"tensor({kind})", shape)


_FLOATS = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


def _immutable(model: onnx.ModelProto, rules: Mapping[str, Iterable[Any]]) -> set[str]:
    from onnxblocks.ir.walk import proto_nodes

    values = {init.name: init for init in model.graph.initializer}
    out = set()
    for node in proto_nodes(model.graph):
        for index, value in rules.get(node.op_type, ()):
            if int(index) < len(node.input) and node.input[int(index)] in values:
                array = onnx.numpy_helper.to_array(values[node.input[int(index)]])
                if array.size == 1 and np.isclose(float(array.reshape(-1)[0]), float(value)):
                    out.add(node.input[int(index)])
    return out


def _trained(model: onnx.ModelProto, parameters: TrainingParameters) -> list[str]:
    floats = [init.name for init in model.graph.initializer if init.data_type in _FLOATS]
    given = list(parameters.weights_to_train or ())
    missing = [name for name in given if name not in floats]
    if missing:
        raise UnknownNameError(
            f"weights_to_train names '{missing[0]}', which is not a float initializer of the model."
            f"{did_you_mean(missing[0], floats)} The float initializers: {', '.join(floats[:20])}."
        )
    skip = set(parameters.weights_not_to_train or ()) | _immutable(
        model, parameters.immutable_weights or {}
    )
    names = [name for name in (given or floats) if name not in skip]
    if not names:
        raise InvalidValueError(
            "TrainingParameters leave no weight to train: set weights_to_train."
        )
    return sorted(names) if given else names


def _cache_dir(model_bytes: bytes, parameters: TrainingParameters) -> Path:
    from onnxblocks._core.version import __version__
    from onnxblocks.gradient.worker import cache_root

    digest = hashlib.sha256(model_bytes)
    digest.update(
        json.dumps([__version__, parameters._key()], sort_keys=True, default=repr).encode()
    )
    return cache_root() / "legacy-training" / digest.hexdigest()[:32]


class TrainingSession:
    """The legacy ``onnxruntime.TrainingSession``: forward, backward and the optimizer step in one
    ``run``.

    Args:
        path_or_bytes: The model (path or serialized bytes); its graph computes the loss
            (``parameters.loss_output_name``).
        parameters: The :class:`TrainingParameters`.
        sess_options: An ``onnxruntime.SessionOptions`` for the runs, or None.
        providers: ONNX Runtime providers; ``CUDAExecutionProvider`` first selects ``"cuda"``.

    Raises:
        UnknownNameError: for a loss output or weight the model does not have.
        InvalidValueError: for parameters without a standard-op form (see
        :mod:`onnxblocks.compat._legacy_optim`).
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike | bytes,
        parameters: TrainingParameters,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
    ) -> None:
        if not isinstance(parameters, TrainingParameters):
            raise InvalidTypeError(
                f"parameters must be a TrainingParameters, not {type(parameters).__name__}."
            )
        model, data = load_model_arg(path_or_bytes)
        outputs = [o.name for o in model.graph.output]
        loss = parameters.loss_output_name
        if loss not in outputs:
            raise UnknownNameError(
                f"loss_output_name '{loss}' is not an output of the "
                f"model.{did_you_mean(str(loss), outputs)} "
                f"Outputs: {outputs}."
            )
        steps = parameters.gradient_accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidValueError(
                f"gradient_accumulation_steps must be an int >= 1, not {steps!r}."
            )
        self.parameters = parameters
        self._weights = _trained(model, parameters)
        self._optimizer = optimizer_for(
            parameters.training_optimizer_name,
            self._weights,
            parameters.optimizer_attributes_map or {},
            parameters.optimizer_int_attributes_map or {},
            bool(parameters.enable_grad_norm_clip),
        )
        self._model = model
        self._outputs = [loss, *(name for name in outputs if name != loss)]
        self._directory = self._artifacts(model, data)
        from onnxblocks.runtime import TrainingSession as _Session

        device = "cuda" if providers and "CUDA" in str(providers[0]) else "cpu"
        self._session = _Session(self._directory, device=device, session_options=sess_options)
        self._runs = 0
        self._inputs = [
            _node_arg(i)
            for i in model.graph.input
            if i.name not in {x.name for x in model.graph.initializer}
        ]

    # ---------------------------------------------------------------- artifacts
    def _artifacts(self, model: onnx.ModelProto, data: bytes) -> Path:
        target = _cache_dir(data, self.parameters)
        if (target / "step_model.onnx").exists():
            return target
        from onnxblocks.artifacts import generate_artifacts

        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            generate_artifacts(
                model,
                requires_grad=self._weights,
                loss=None,
                optimizer=self._optimizer,
                artifact_directory=staging,
                loss_input_names=self._outputs[:1],
                additional_output_names=self._outputs[1:] or None,
                portable=True,
            )
            with contextlib.suppress(
                OSError
            ):  # another process won the race: its artifacts are the same
                os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if not (target / "step_model.onnx").exists():
            raise StateError(
                f"The artifacts cache '{target}' holds no step model; remove that directory and "
                "retry."
            )
        return target

    # ---------------------------------------------------------------- running
    def get_inputs(self) -> list[NodeArg]:
        """The feeds ``run`` takes: the model's inputs, then the learning rate."""
        return [*self._inputs, NodeArg(self.parameters.lr_params_feed_name, "tensor(float)", [1])]

    def get_outputs(self) -> list[NodeArg]:
        """The fetches ``run`` returns: the model's outputs (loss first), then the gradients when
        asked for.
        """
        by_name = {o.name: _node_arg(o) for o in self._model.graph.output}
        out = [by_name[name] for name in self._outputs]
        if self.parameters.set_gradients_as_graph_outputs:
            shapes = {i.name: list(i.dims) for i in self._model.graph.initializer}
            out += [NodeArg(gradient_name(w), "tensor(float)", shapes[w]) for w in self._weights]
        return out

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list:
        """Feed one batch and the learning rate, train one step, return the fetches.

        With ``gradient_accumulation_steps = N`` the weights are updated on every N-th call
        (with that call's learning rate), from the sum of the N calls' gradients.

        Args:
            output_names: Outputs to return (:meth:`get_outputs` names), or None for all.
            input_feed: ``{input name: array}``, the learning rate under ``lr_params_feed_name``.
            run_options: Accepted for compatibility; unused.

        Raises:
            UnknownNameError: for a missing or unknown feed or fetch.
        """
        if not isinstance(input_feed, Mapping):
            raise InvalidTypeError(
                f"input_feed must be a dict {{name: array}}, not {type(input_feed).__name__}."
            )
        feeds = dict(input_feed)
        lr_name = self.parameters.lr_params_feed_name
        if lr_name not in feeds:
            raise UnknownNameError(
                f"input_feed has no learning rate: feed it as '{lr_name}' (lr_params_feed_name)."
            )
        lr = np.asarray(feeds.pop(lr_name), dtype=np.float64).reshape(-1)
        if lr.size != 1 or not np.isfinite(lr[0]):
            raise InvalidValueError(
                f"The learning rate '{lr_name}' must be one finite number, got {lr!r:.60}."
            )
        names = self._session.input_names
        unknown = [k for k in feeds if k not in names]
        missing = [k for k in names if k not in feeds]
        if unknown or missing:
            bad = (unknown or missing)[0]
            raise UnknownNameError(
                f"input_feed {'has an unknown' if unknown else 'lacks the'} input '{bad}'. "
                f"Inputs: {names} and "
                f"'{lr_name}'.{did_you_mean(bad, names)}"
            )
        wanted = self._fetches(output_names)
        self._session.learning_rate = float(lr[0])
        batch = [feeds[k] for k in names]
        steps = self.parameters.gradient_accumulation_steps
        grads_out = self.parameters.set_gradients_as_graph_outputs
        self._runs += 1
        gradients: dict[str, np.ndarray] = {}
        if steps == 1 and not grads_out:
            values = self._session.train_and_update(*batch)
        else:
            values = self._session.train_step(*batch)
            if grads_out:
                gradients = {gradient_name(k): v for k, v in self._session.gradients().items()}
            if self._runs % steps == 0:
                self._session.optimizer_step()
        fetched = dict(zip(self._outputs, values, strict=True)) | gradients
        return [fetched[name] for name in wanted]

    def _fetches(self, output_names: Sequence[str] | None) -> list[str]:
        known = [o.name for o in self.get_outputs()]
        if output_names is None:
            return known
        if isinstance(output_names, str):
            raise InvalidTypeError(
                f"output_names must be a list of names, not the str {output_names!r}."
            )
        for name in output_names:
            if name not in known:
                raise UnknownNameError(
                    f"run cannot fetch '{name}'. Outputs: {known}.{did_you_mean(name, known)}"
                )
        return list(output_names)

    # ---------------------------------------------------------------- state
    def get_model_state(
        self, include_mixed_precision_weights: bool = False
    ) -> dict[str, dict[str, np.ndarray]]:
        """``{"full_precision": {weight: array}}`` of the trained weights."""
        return {"full_precision": _state.weights(self._session, self._weights)}

    def get_optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """``{weight: {"Moment_1": m, "Moment_2": v, "Update_Count": step}}`` (empty for SGD)."""
        return _state.optimizer_state(self._session)

    def get_state(self) -> dict[str, np.ndarray]:
        """The weights and the optimizer state in one flat dict (``Moment_1_<weight>``,
        ``Update_Count_<weight>``).
        """
        return _state.flat_state(self._session, self._weights)

    def load_state(self, dict: Mapping[str, Any], strict: bool = False) -> None:  # legacy name
        """Set weights and optimizer state from a :meth:`get_state` dict; names it does not hold
        keep their values.

        Raises:
            UnknownNameError: for a name the session does not have (with ``strict``, also for one it
            lacks).
            InvalidValueError: for an array of the wrong shape, or ``Update_Count`` values that
            differ.
        """
        _state.load_flat_state(self._session, self._weights, dict, strict)

    def __repr__(self) -> str:
        return (
            f"TrainingSession({self.parameters.training_optimizer_name}, {len(self._weights)} "
            "weights, "
            f"loss '{self.parameters.loss_output_name}', artifacts '{self._directory}')"
        )

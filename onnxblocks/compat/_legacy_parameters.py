"""The legacy ``TrainingParameters`` and how the legacy session reads its model argument."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx

from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)

#: Fields of the legacy ``TrainingParameters`` that the drop-in implements, with their defaults.
_FIELDS: dict[str, Any] = {
    "loss_output_name": "",
    "weights_to_train": set(),
    "weights_not_to_train": set(),
    "immutable_weights": {},
    "training_optimizer_name": "SGDOptimizer",
    "lr_params_feed_name": "Learning_Rate",
    "optimizer_attributes_map": {},
    "optimizer_int_attributes_map": {},
    "gradient_accumulation_steps": 1,
    "enable_grad_norm_clip": True,
    "set_gradients_as_graph_outputs": False,
    # accepted and ignored: they changed how the graph was built or logged, not what it computes
    "batch_size": 0,
    "use_memory_efficient_gradient": False,
    "model_with_training_graph_path": "",
    "model_after_graph_transforms_path": "",
    "model_with_gradient_graph_path": "",
}
#: Fields that only ORT's distributed or mixed-precision trainer used: settable to their default
#: only.
_DISTRIBUTED: dict[str, Any] = {
    "use_mixed_precision": False,
    "use_fp16_moments": False,
    "loss_scale": 0.0,
    "scaled_loss_output_name": "",
    "allreduce_post_accumulation": False,
    "deepspeed_zero_stage": 0,
    "partition_optimizer": False,
    "enable_adasum": False,
    "world_rank": 0,
    "world_size": 1,
    "local_rank": 0,
    "local_size": 1,
    "data_parallel_size": 1,
    "horizontal_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "num_pipeline_micro_batches": 1,
    "sliced_schema": {},
    "sliced_axes": {},
    "sliced_tensor_names": [],
}


def _copy(value: Any) -> Any:
    return type(value)(value) if isinstance(value, (set, dict, list)) else value


class TrainingParameters:
    """The legacy ``onnxruntime.TrainingParameters``: what to train and how.

    Attributes:
        loss_output_name: The graph output that is the loss (a scalar).
        weights_to_train: Initializers to train; empty: every float initializer.
        weights_not_to_train: Initializers left out of ``weights_to_train``'s default.
        immutable_weights: ``{op_type: [(input_index, value), ...]}``: an initializer read at
            that input of such a node, holding that scalar value, is not trained.
        training_optimizer_name: ``"SGDOptimizer"``, ``"AdamOptimizer"`` or ``"LambOptimizer"``.
        lr_params_feed_name: The feed holding the learning rate (default ``"Learning_Rate"``).
        optimizer_attributes_map: ``{weight: {attribute: float}}`` (``alpha``, ``beta``, ``lambda``,
            ``epsilon``, ``max_norm_clip``; Lamb's ``ratio_min``/``ratio_max``).
        optimizer_int_attributes_map: ``{weight: {attribute: int}}`` (``do_bias_correction``,
            ``weight_decay_mode``).
        gradient_accumulation_steps: Sum the gradients of this many ``run`` calls, then update.
        enable_grad_norm_clip: Clip the global gradient norm at ``max_norm_clip`` (Adam, Lamb;
        default on).
        set_gradients_as_graph_outputs: Make ``<weight>_grad`` fetchable from ``run``.

    Fields of ORT's distributed and mixed-precision trainer (``world_size``,
    ``use_mixed_precision``,
    ``deepspeed_zero_stage``, ``pipeline_parallel_size``, ``sliced_schema``...) may be set to their
    defaults only; any other value raises ``InvalidValueError``. An unknown field raises
    ``UnknownNameError``.
    """

    loss_output_name: str
    weights_to_train: set[str]
    weights_not_to_train: set[str]
    immutable_weights: dict[str, list[tuple[int, float]]]
    training_optimizer_name: str
    lr_params_feed_name: str
    optimizer_attributes_map: dict[str, dict[str, float]]
    optimizer_int_attributes_map: dict[str, dict[str, int]]
    gradient_accumulation_steps: int
    enable_grad_norm_clip: bool
    set_gradients_as_graph_outputs: bool

    def __init__(self) -> None:
        for name, value in {**_FIELDS, **_DISTRIBUTED}.items():
            object.__setattr__(self, name, _copy(value))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _DISTRIBUTED:
            default = _DISTRIBUTED[name]
            if value != default or (isinstance(value, bool) != isinstance(default, bool)):
                raise InvalidValueError(
                    f"TrainingParameters.{name} = {value!r:.60}: this field belonged to ONNX "
                    "Runtime's distributed "
                    "and mixed-precision trainer, which onnxblocks does not reproduce; leave it "
                    f"at {default!r}. "
                    "For data-parallel training see onnxblocks.torch.distributed."
                )
        elif name not in _FIELDS:
            known = [*_FIELDS, *_DISTRIBUTED]
            raise UnknownNameError(
                f"TrainingParameters has no field '{name}'.{did_you_mean(name, known)}"
            )
        object.__setattr__(self, name, value)

    def _key(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, (set, frozenset)):
                return sorted(value)
            if isinstance(value, Mapping):
                return {
                    str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                }
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        return {
            name: plain(getattr(self, name))
            for name in _FIELDS
            if not name.startswith(("model_", "batch"))
        }


def load_model_arg(path_or_bytes: Any) -> tuple[onnx.ModelProto, bytes]:
    """The model and its bytes, from a path or serialized bytes (the caller's object is not
    kept).
    """
    if isinstance(path_or_bytes, (bytes, bytearray)):
        data = bytes(path_or_bytes)
        try:
            return onnx.load_from_string(data), data
        except Exception as error:  # protobuf raises its own DecodeError
            raise InvalidValueError(
                f"path_or_bytes holds {len(data)} bytes that are not an ONNX model: {error}"
            ) from None
    if isinstance(path_or_bytes, (str, os.PathLike)):
        from onnxblocks._core.paths import as_path
        from onnxblocks.io import load_model

        path = as_path(path_or_bytes, "path_or_bytes")
        model = load_model(path, load_external_data=True)
        return model, model.SerializeToString(deterministic=True)
    raise InvalidTypeError(
        "path_or_bytes must be a model file path or the model's bytes, not "
        f"{type(path_or_bytes).__name__}."
    )

"""The record a model with LoRA adapters keeps of them: model metadata ``onnxblocks.lora``.

:func:`~onnxblocks.peft.apply_lora` writes it; the artifacts copy it into the training, eval
and step models; everything downstream (checkpoints, PEFT files, merging, the JS client) reads
it with :func:`lora_info`. The value is JSON::

    {"config": <LoraConfig.to_peft_dict()>,
     "targets": {"model.layers.0.self_attn.q_proj": {
         "weight": "<base weight initializer>", "weight_layout": "out_in" | "in_out",
         "node": "<MatMul or Gemm node>", "in_features": 64, "out_features": 64,
         "lora_A": "model.layers.0.self_attn.q_proj.lora_A.weight",
         "lora_B": "model.layers.0.self_attn.q_proj.lora_B.weight", "scale_value": 2.0}}}

``weight_layout`` says how the base weight is stored in the graph: ``"out_in"`` as torch's
``nn.Linear.weight`` (``[out, in]``), ``"in_out"`` transposed (``[in, out]``, as GPT-2's
``Conv1D`` stores it, or a Linear's weight the exporter folded transposed). ``lora_A`` is
``[r, in_features]`` and ``lora_B`` ``[out_features, r]`` either way (PEFT's layout).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from onnxblocks._core.contracts import LORA_METADATA
from onnxblocks._core.errors import FileMissingError, InvalidTypeError, InvalidValueError
from onnxblocks.peft.config import LoraConfig

__all__ = ["LORA_METADATA", "LoraInfo", "LoraTarget", "lora_info"]

_LAYOUTS = ("out_in", "in_out")


@dataclass(frozen=True)
class LoraTarget:
    """One adapted layer.

    Attributes:
        module: The torch module path (``model.layers.0.self_attn.q_proj``), PEFT's key stem.
        weight: The base weight's initializer name in the graph.
        weight_layout: ``"out_in"`` (``[out, in]``, nn.Linear) or ``"in_out"`` (``[in, out]``) in
        the graph.
        node: The name of the MatMul or Gemm node that applies the weight.
        in_features: The layer's input width.
        out_features: The layer's output width.
        lora_A: The name of the ``[r, in_features]`` adapter initializer.
        lora_B: The name of the ``[out_features, r]`` adapter initializer.
        scale_value: The branch's scale, ``lora_alpha / r``.
    """

    module: str
    weight: str
    weight_layout: str
    node: str
    in_features: int
    out_features: int
    lora_A: str  # noqa: N815 (PEFT's name)
    lora_B: str  # noqa: N815 (PEFT's name)
    scale_value: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON entry of this target (without its module, the entry's key)."""
        return {
            "weight": self.weight,
            "weight_layout": self.weight_layout,
            "node": self.node,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "lora_A": self.lora_A,
            "lora_B": self.lora_B,
            "scale_value": self.scale_value,
        }


@dataclass(frozen=True)
class LoraInfo:
    """The LoRA adapters a model carries (its ``onnxblocks.lora`` metadata, parsed and checked).

    Attributes:
        config: The LoRA config the adapters were made with.
        targets: The adapted layers, by module path, in graph order.
    """

    config: LoraConfig
    targets: dict[str, LoraTarget]

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """Every adapter initializer's name (``lora_A`` then ``lora_B`` of each target, in
        order).
        """
        return tuple(name for t in self.targets.values() for name in (t.lora_A, t.lora_B))

    def to_json(self) -> str:
        """The metadata value (compact JSON)."""
        targets = {module: target.to_dict() for module, target in self.targets.items()}
        return json.dumps(
            {"config": self.config.to_peft_dict(), "targets": targets}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> LoraInfo:
        """Parse and check a metadata value.

        Args:
            text: The JSON text.

        Returns:
            The info.

        Raises:
            InvalidValueError: not JSON, or an entry of the wrong shape (the message names it).
        """
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise InvalidValueError(
                f"model metadata {LORA_METADATA!r} is not JSON: {error}"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise InvalidValueError(f"model metadata {LORA_METADATA!r} has no 'config' object")
        if not isinstance(data.get("targets"), dict):
            raise InvalidValueError(f"model metadata {LORA_METADATA!r} has no 'targets' object")
        config = LoraConfig.from_peft_dict(data["config"])
        targets = {module: _target(module, entry) for module, entry in data["targets"].items()}
        return cls(config=config, targets=targets)


def _target(module: str, entry: Any) -> LoraTarget:
    where = f"model metadata {LORA_METADATA!r}, target {module!r}"
    if not isinstance(entry, Mapping):
        raise InvalidValueError(f"{where} is not an object")
    values: dict[str, Any] = {}
    for key in ("weight", "weight_layout", "node", "lora_A", "lora_B"):
        if not isinstance(entry.get(key), str):
            raise InvalidValueError(f"{where}: {key!r} must be a string, got {entry.get(key)!r}")
        values[key] = entry[key]
    if values["weight_layout"] not in _LAYOUTS:
        raise InvalidValueError(
            f"{where}: weight_layout must be one of {_LAYOUTS}, got {values['weight_layout']!r}"
        )
    for key in ("in_features", "out_features"):
        value = entry.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValueError(f"{where}: {key!r} must be a positive int, got {value!r}")
        values[key] = value
    scale = entry.get("scale_value")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise InvalidValueError(f"{where}: 'scale_value' must be a finite number, got {scale!r}")
    return LoraTarget(module=module, scale_value=float(scale), **values)


def lora_info(model: onnx.ModelProto | str | os.PathLike) -> LoraInfo | None:
    """The LoRA adapters a model carries, from its ``onnxblocks.lora`` metadata.

    Args:
        model: A model, or an ``.onnx`` file (read without its external data).

    Returns:
        The :class:`LoraInfo`, or None for a model without LoRA adapters.

    Raises:
        InvalidTypeError: ``model`` is neither a ModelProto nor a path.
        FileMissingError: no such file.
        InvalidValueError: the metadata is malformed.
    """
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileMissingError(f"no model file at {os.fspath(model)!r}")
        model = onnx.load(os.fspath(model), load_external_data=False)
    if not isinstance(model, onnx.ModelProto):
        raise InvalidTypeError(
            f"lora_info takes an onnx.ModelProto or a path, got {type(model).__name__}"
        )
    text = next((p.value for p in model.metadata_props if p.key == LORA_METADATA), None)
    return None if text is None else LoraInfo.from_json(text)

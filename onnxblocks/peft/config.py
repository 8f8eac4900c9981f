"""LoraConfig: Hugging Face PEFT's LoRA options, with PEFT's names, defaults and meaning.

onnxblocks supports the options that describe plain LoRA on Linear (and GPT-2 ``Conv1D``)
layers: ``r``, ``lora_alpha`` (scaling ``lora_alpha / r``), ``target_modules``,
``exclude_modules``, ``lora_dropout``, ``fan_in_fan_out``, ``bias="none"`` and
``init_lora_weights`` ``True`` / ``False`` / ``"gaussian"``. Every other PEFT option set to
something other than its "off" value (``use_dora``, ``use_rslora``, ``rank_pattern``...) is
refused with :class:`~onnxblocks.errors.InvalidValueError`, also when it comes from an
``adapter_config.json`` file (:meth:`LoraConfig.from_peft_dict`, :meth:`LoraConfig.from_json_file`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    did_you_mean,
)

__all__ = ["LoraConfig"]

#: PEFT options onnxblocks does not support, each with the value that means "off" in PEFT 0.21.
#: A file or dict may carry them only with that value (or None).
_REFUSED: dict[str, Any] = {
    "use_dora": False,
    "use_rslora": False,
    "use_qalora": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "modules_to_save": None,
    "lora_bias": False,
    "target_parameters": None,
    "layer_replication": None,
    "megatron_config": None,
    "trainable_token_indices": None,
    "eva_config": None,
    "corda_config": None,
    "lora_ga_config": None,
    "use_bdlora": None,
    "arrow_config": None,
    "kasa_config": None,
    "alora_invocation_tokens": None,
    "velora_config": None,
    "monteclora_config": None,
    "loftq_config": {},
    "ensure_weight_tying": False,
}

#: What each refused option would need, for the error message.
_REFUSAL_HINTS: dict[str, str] = {
    "use_dora": "DoRA adds a magnitude vector and a norm of W + BA to each layer",
    "use_rslora": "rsLoRA scales by lora_alpha / sqrt(r); for that scale, set lora_alpha to "
    "lora_alpha * sqrt(r)",
    "rank_pattern": "per-module ranks; give one r for all targets (or apply LoRA per group of "
    "modules)",
    "alpha_pattern": "per-module alphas; give one lora_alpha for all targets",
    "layers_to_transform": "use a target_modules regex such as "
    "r'.*\\.layers\\.(0|1)\\.self_attn\\.q_proj'",
    "modules_to_save": "train those modules as full parameters with "
    "generate_artifacts(requires_grad=...) instead",
    "lora_bias": "LoRA's own bias on lora_B",
    "target_parameters": "LoRA on nn.Parameter targets (MoE experts)",
}

#: Keys PEFT writes that carry no meaning for the adapter itself; read and kept as they are.
_PASSED = ("task_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping")

#: Keys PEFT writes that are ignored (bookkeeping or options of refused features).
_IGNORED = (
    "peft_type",
    "peft_version",
    "megatron_core",
    "qalora_group_size",
    "layers_pattern",
    "runtime_config",
)

_INIT_CHOICES = (True, False, "gaussian")


def _is_off(value: Any, off: Any) -> bool:
    """True if ``value`` is the "off" value ``off`` of a PEFT option (None and empty containers
    count as off).
    """
    if value is None or value == off:
        return True
    return (
        isinstance(value, (dict, list, tuple))
        and not value
        and (off is None or isinstance(off, dict))
    )


def _targets(value: Any, parameter: str) -> tuple[str, ...] | str | None:
    if value is None or isinstance(value, str):
        if isinstance(value, str) and not value:
            raise InvalidValueError(
                f"LoraConfig {parameter}='' matches nothing: give module names or a regex"
            )
        return value
    if isinstance(value, (Sequence, set, frozenset)) and not isinstance(value, (bytes, bytearray)):
        names = (
            tuple(sorted(set(value)))
            if isinstance(value, (set, frozenset))
            else tuple(dict.fromkeys(value))
        )
        for name in names:
            if not isinstance(name, str) or not name:
                raise InvalidTypeError(
                    f"LoraConfig {parameter} must hold non-empty module names (str), got "
                    f"{name!r} in {value!r}"
                )
        if not names:
            raise InvalidValueError(
                f"LoraConfig {parameter}=[] matches nothing: give at least one module name"
            )
        return names
    raise InvalidTypeError(
        f"LoraConfig {parameter} must be a list of module names, a regex string or None, got "
        f"{type(value).__name__}"
    )


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters for an exported model, with Hugging Face PEFT's option names and meaning.

    Each target layer ``y = x @ W^T`` becomes ``y = x @ W^T + dropout(x) @ A^T @ B^T * (lora_alpha /
    r)``
    with ``A`` of shape ``[r, in_features]`` (initialised as PEFT does) and ``B`` of shape
    ``[out_features, r]`` (zero), the only trainable tensors. See docs/lora.md.

    Example:
        >>> config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        >>> config.scaling
        2.0

    Attributes:
        r: The rank of the adapters (a positive int).
        lora_alpha: The scale numerator: the adapter branch is multiplied by ``lora_alpha / r``.
        target_modules: The torch modules to adapt: a list of names, each matching a module whose
            path is that name or ends with ``.name`` (``"q_proj"`` matches
            ``model.layers.0.self_attn.q_proj``),
            or one regex string matched against the whole module path, or ``"all-linear"`` (every
            Linear
            layer but the output layer). None (PEFT's per-architecture default) is refused when LoRA
            is
            applied: name the modules.
        exclude_modules: Modules never adapted, by the same rule.
        lora_dropout: Dropout probability on the adapter branch's input, in the training graph only.
        fan_in_fan_out: True for layers that store their weight as ``[in, out]`` (GPT-2's
        ``Conv1D``).
            onnxblocks reads the layout from the graph; this flag is kept so the saved config
            matches PEFT's.
        bias: Only ``"none"`` (no bias is trained).
        init_lora_weights: ``True`` (PEFT's default: A kaiming-uniform, B zero), ``"gaussian"``
            (A normal with std ``1 / r``, B zero) or ``False`` (A and B both as a fresh
            ``nn.Linear``'s weight).
        task_type: Kept for the saved ``adapter_config.json`` (``"CAUSAL_LM"``...), else unused.
        base_model_name_or_path: Kept for the saved ``adapter_config.json``, else unused.
        revision: Kept for the saved ``adapter_config.json``, else unused.
        inference_mode: Kept for the saved ``adapter_config.json``, else unused.

    Raises:
        InvalidTypeError: an option of the wrong kind.
        InvalidValueError: an option out of range (``r < 1``, dropout outside ``[0, 1)``, ``bias !=
        "none"``...).
    """

    r: int = 8
    lora_alpha: float = 8
    target_modules: tuple[str, ...] | str | None = None
    lora_dropout: float = 0.0
    fan_in_fan_out: bool = False
    bias: str = "none"
    exclude_modules: tuple[str, ...] | str | None = None
    init_lora_weights: bool | str = True
    task_type: str | None = None
    base_model_name_or_path: str | None = None
    revision: str | None = None
    inference_mode: bool = False
    _extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int):
            raise InvalidTypeError(f"LoraConfig r must be an int, got {type(self.r).__name__}")
        if self.r < 1:
            raise InvalidValueError(f"LoraConfig r must be at least 1, got {self.r}")
        alpha = self.lora_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise InvalidTypeError(
                f"LoraConfig lora_alpha must be a number, got {type(alpha).__name__}"
            )
        if not math.isfinite(alpha) or alpha <= 0:
            raise InvalidValueError(
                f"LoraConfig lora_alpha must be a positive finite number, got {alpha}"
            )
        dropout = self.lora_dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise InvalidTypeError(
                f"LoraConfig lora_dropout must be a number, got {type(dropout).__name__}"
            )
        if not 0.0 <= dropout < 1.0:
            raise InvalidValueError(f"LoraConfig lora_dropout must be in [0, 1), got {dropout}")
        object.__setattr__(self, "lora_dropout", float(dropout))
        for name in ("fan_in_fan_out", "inference_mode"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidTypeError(
                    f"LoraConfig {name} must be a bool, got {getattr(self, name)!r}"
                )
        if self.bias != "none":
            raise InvalidValueError(
                f"LoraConfig bias={self.bias!r} is not supported: onnxblocks trains no bias with "
                "LoRA; use bias='none' "
                "(to train biases, list them in generate_artifacts(requires_grad=...))"
            )
        if self.init_lora_weights not in _INIT_CHOICES or (
            isinstance(self.init_lora_weights, int) and not isinstance(self.init_lora_weights, bool)
        ):
            raise InvalidValueError(
                f"LoraConfig init_lora_weights={self.init_lora_weights!r} is not supported: use "
                "True (PEFT's default), "
                "'gaussian' or False, then load trained adapters if you need another start"
            )
        object.__setattr__(self, "target_modules", _targets(self.target_modules, "target_modules"))
        object.__setattr__(
            self, "exclude_modules", _targets(self.exclude_modules, "exclude_modules")
        )
        for name in ("task_type", "base_model_name_or_path", "revision"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidTypeError(
                    f"LoraConfig {name} must be a str or None, got {type(value).__name__}"
                )

    @property
    def scaling(self) -> float:
        """The adapter branch's scale, ``lora_alpha / r`` (PEFT's ``scaling``)."""
        return float(self.lora_alpha) / self.r

    def to_peft_dict(self) -> dict[str, Any]:
        """What PEFT writes in ``adapter_config.json`` for this config (``peft.LoraConfig`` reads it
        back).

        Returns:
            A JSON-serialisable dict: the supported options, the refused ones at their "off" values,
            ``peft_type="LORA"``.
        """
        targets = (
            list(self.target_modules)
            if isinstance(self.target_modules, tuple)
            else self.target_modules
        )
        excluded = (
            list(self.exclude_modules)
            if isinstance(self.exclude_modules, tuple)
            else self.exclude_modules
        )
        alpha: float = self.lora_alpha
        if isinstance(alpha, float) and alpha.is_integer():
            alpha = int(alpha)
        out: dict[str, Any] = {
            key: (dict(off) if isinstance(off, dict) else off) for key, off in _REFUSED.items()
        }
        out.update(
            {
                "peft_type": "LORA",
                "r": self.r,
                "lora_alpha": alpha,
                "target_modules": targets,
                "exclude_modules": excluded,
                "lora_dropout": self.lora_dropout,
                "fan_in_fan_out": self.fan_in_fan_out,
                "bias": self.bias,
                "init_lora_weights": self.init_lora_weights,
                "layers_pattern": None,
                "task_type": self.task_type,
                "base_model_name_or_path": self.base_model_name_or_path,
                "revision": self.revision,
                "inference_mode": self.inference_mode,
                "auto_mapping": None,
            }
        )
        out.update(dict(self._extra))
        return dict(sorted(out.items()))

    @classmethod
    def from_peft_dict(cls, data: Mapping[str, Any]) -> LoraConfig:
        """Read a PEFT LoRA config (the content of ``adapter_config.json``, or
        ``peft.LoraConfig.to_dict()``).

        Args:
            data: The dict.

        Returns:
            The config.

        Raises:
            InvalidTypeError: ``data`` is not a mapping.
            InvalidValueError: not a LoRA config (``peft_type``), or an option onnxblocks does not
                support is set (the message names the key and says what to do).
        """
        if not isinstance(data, Mapping):
            raise InvalidTypeError(f"a PEFT config must be a dict, got {type(data).__name__}")
        peft_type = data.get("peft_type", "LORA")
        if str(getattr(peft_type, "value", peft_type)).upper() != "LORA":
            raise InvalidValueError(
                f"PEFT config has peft_type={peft_type!r}: onnxblocks reads LoRA configs only "
                "(peft_type 'LORA')"
            )
        kwargs: dict[str, Any] = {}
        known = {
            "r",
            "lora_alpha",
            "target_modules",
            "lora_dropout",
            "fan_in_fan_out",
            "bias",
            "exclude_modules",
        }
        known.update(("init_lora_weights", *_PASSED))
        extra = []
        for key, value in data.items():
            if not isinstance(key, str):
                raise InvalidTypeError(f"PEFT config keys must be str, got {key!r}")
            if key in known:
                if key == "task_type" and value is not None:
                    value = str(getattr(value, "value", value))
                if key != "auto_mapping":
                    kwargs[key] = value
            elif key in _REFUSED:
                if not _is_off(value, _REFUSED[key]):
                    hint = _REFUSAL_HINTS.get(key, "onnxblocks applies plain LoRA only")
                    raise InvalidValueError(
                        f"PEFT option {key}={value!r} is not supported by onnxblocks ({hint}); "
                        f"set {key} to {_REFUSED[key]!r} (or remove it) to use plain LoRA"
                    )
            elif key in _IGNORED:
                continue
            elif not _is_off(value, None) and value is not False:
                raise InvalidValueError(
                    f"PEFT option {key}={value!r} is unknown to "
                    f"onnxblocks{did_you_mean(key, sorted(known))}: "
                    "remove it or set it to null if it only selects a feature onnxblocks does "
                    "not use"
                )
            else:
                extra.append((key, value))
        if "target_modules" in kwargs and isinstance(kwargs["target_modules"], list):
            kwargs["target_modules"] = tuple(kwargs["target_modules"])
        return cls(**kwargs, _extra=tuple(extra))

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> LoraConfig:
        """Read an ``adapter_config.json`` file (or a PEFT adapter directory holding one).

        Args:
            path: The file, or the directory holding ``adapter_config.json``.

        Returns:
            The config.

        Raises:
            FileMissingError: no such file.
            InvalidValueError: the file is not JSON, or sets an option onnxblocks does not support.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        file = Path(path)
        if file.is_dir():
            file = file / "adapter_config.json"
        if not file.is_file():
            raise FileMissingError(
                f"no PEFT adapter config at {file}: give adapter_config.json or its directory"
            )
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidValueError(f"{file} is not a JSON PEFT config: {error}") from None
        try:
            return cls.from_peft_dict(data)
        except InvalidValueError as error:
            raise InvalidValueError(f"{file}: {error}") from None

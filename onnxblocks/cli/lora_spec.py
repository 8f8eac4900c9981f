"""``--lora r=8,alpha=16,targets=q_proj,v_proj``: the LoRA settings of ``onnxblocks artifacts``
read into a :class:`~onnxblocks.peft.LoraConfig`, each refusal naming the key.
"""

from __future__ import annotations

import re
from typing import Any

from onnxblocks.cli.errors import EXIT_USAGE, CliError

#: ``--lora`` keys and the LoraConfig field each sets.
LORA_KEYS = {
    "r": "r",
    "alpha": "lora_alpha",
    "lora_alpha": "lora_alpha",
    "targets": "target_modules",
    "target_modules": "target_modules",
    "exclude": "exclude_modules",
    "exclude_modules": "exclude_modules",
    "dropout": "lora_dropout",
    "lora_dropout": "lora_dropout",
    "fan_in_fan_out": "fan_in_fan_out",
}
_LORA_LISTS = ("target_modules", "exclude_modules")


def lora_config(spec: str) -> Any:
    """The :class:`~onnxblocks.peft.LoraConfig` of a ``--lora`` spec
    (``r=8,alpha=16,targets=q_proj,v_proj``).

    Raises:
        CliError: (exit 2) for an unknown key, a value that is not a number where one is expected, a
            spec without targets, or a value LoraConfig refuses (the message names the key).
    """
    from onnxblocks._core.errors import did_you_mean
    from onnxblocks.peft import LoraConfig

    values: dict[str, Any] = {}
    field: str | None = None
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        key, eq, value = token.partition("=")
        if not eq:  # a further name of the list key before it
            if field is None or field not in _LORA_LISTS:
                raise CliError(
                    f"--lora: {token!r} is not KEY=VALUE (keys: {', '.join(LORA_KEYS)})", EXIT_USAGE
                )
            values[field].append(token)
            continue
        field = LORA_KEYS.get(key.strip())
        if field is None:
            raise CliError(
                f"--lora: unknown key {key!r}{did_you_mean(key, LORA_KEYS)} (keys: "
                f"{', '.join(LORA_KEYS)})",
                EXIT_USAGE,
            )
        values[field] = [value] if field in _LORA_LISTS else _lora_value(key, field, value)
    if "target_modules" not in values:
        raise CliError(
            "--lora: name the modules to adapt with targets=NAME[,NAME...] (e.g. "
            "targets=q_proj,v_proj)",
            EXIT_USAGE,
        )
    try:
        return LoraConfig(**values)
    except (TypeError, ValueError) as exc:
        short = {"lora_alpha": "alpha", "target_modules": "targets", "exclude_modules": "exclude"}
        short |= {"lora_dropout": "dropout", "fan_in_fan_out": "fan_in_fan_out", "r": "r"}
        key = next((k for f, k in short.items() if re.search(rf"\b{f}\b", str(exc))), "")
        raise CliError(f"--lora {key}: {exc}" if key else f"--lora: {exc}", EXIT_USAGE) from None


def _lora_value(key: str, field: str, value: str) -> Any:
    kind = "an int" if field == "r" else "0 or 1" if field == "fan_in_fan_out" else "a number"
    if field == "fan_in_fan_out":
        if value.lower() in ("0", "1", "true", "false"):
            return value.lower() in ("1", "true")
    else:
        try:
            return int(value) if field == "r" else float(value)
        except ValueError:
            pass
    raise CliError(f"--lora: {key}={value!r} must be {kind}", EXIT_USAGE)

"""The Flower app directory a federation runs: a ``pyproject.toml`` that names the apps and the run
config.

``flwr run`` ships a Flower app (a FAB: the directory's ``pyproject.toml`` and sources) to the
SuperLink. onnxblocks' apps live in the installed package (:mod:`onnxblocks.federated.app`), so the
directory :func:`write_app` writes holds only the ``pyproject.toml``: its
``[tool.flwr.app.components]`` point at ``onnxblocks.federated.app:server_app`` and ``client_app``,
and ``[tool.flwr.app.config]`` holds the run config (the keys of
:class:`~onnxblocks.federated.server.ServerSettings` and the client's ``artifacts`` and
``backend``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

#: The components of onnxblocks' own Flower apps.
SERVER_APP = "onnxblocks.federated.app:server_app"
CLIENT_APP = "onnxblocks.federated.app:client_app"

#: What a run config value may be (TOML has no null: leave a key out instead of None).
ConfigValue = str | int | float | bool

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def toml_value(value: ConfigValue, what: str = "value") -> str:
    """``value`` written as a TOML value.

    Raises:
        InvalidTypeError: for a value TOML's run config cannot hold (None, lists, objects).
        InvalidValueError: for a non-finite float.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValueError(
                f"The run config's {what} is {value}; Flower's run config holds finite numbers."
            )
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        escaped = (
            text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        )
        return f'"{escaped}"'
    raise InvalidTypeError(
        f"The run config's {what} is a {type(value).__name__}; it must be a str, int, float or "
        "bool "
        "(leave the key out for 'not set')."
    )


def render_config(config: Mapping[str, ConfigValue]) -> str:
    """``key = value`` lines of a TOML table, keys in the given order.

    Raises:
        InvalidValueError: for a key that is not a bare TOML key.
        InvalidTypeError: for a value TOML's run config cannot hold.
    """
    lines = []
    for key, value in config.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise InvalidValueError(
                f"Run config key {key!r} is not a plain key: use letters, digits, '-', '_' and '.'."
            )
        lines.append(f"{key} = {toml_value(value, f'key {key!r}')}")
    return "\n".join(lines)


def config_arg(config: Mapping[str, ConfigValue]) -> str:
    """``config`` as the one argument of ``flower-supernode --node-config`` or ``flwr run
    --run-config``.

    Flower reads ``key=value`` pairs separated by spaces, strings in double quotes without escapes.

    Raises:
        InvalidValueError: for a bad key, or a string holding a double quote (Flower cannot read
        it).
        InvalidTypeError: for a value TOML cannot hold.
    """
    pairs = []
    for key, value in config.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise InvalidValueError(
                f"Config key {key!r} is not a plain key: use letters, digits, '-', '_' and '.'."
            )
        if isinstance(value, (str, os.PathLike)) and (
            '"' in os.fspath(value) or "\\" in os.fspath(value)
        ):
            raise InvalidValueError(
                f"Config value of {key!r} ({os.fspath(value)!r}) holds a double quote or a "
                "backslash, which "
                "Flower's --node-config/--run-config cannot carry; rename the file or folder."
            )
        pairs.append(f"{key}={toml_value(value, f'key {key!r}')}")
    return " ".join(pairs)


def write_app(
    directory: str | os.PathLike,
    run_config: Mapping[str, ConfigValue],
    *,
    name: str = "onnxblocks-federation",
    server_app: str = SERVER_APP,
    client_app: str = CLIENT_APP,
    modules: Mapping[str, str] | None = None,
) -> Path:
    """Write a Flower app directory that runs onnxblocks' apps with ``run_config``.

    Args:
        directory: Where to write it (created; a ``pyproject.toml`` already there is replaced).
        run_config: The run config, ``[tool.flwr.app.config]`` (keys as the apps read them).
        name: The app's name (``[project].name``).
        server_app: The ServerApp, ``module:attribute``.
        client_app: The ClientApp, ``module:attribute``.
        modules: Extra Python modules shipped with the app, ``{"module_name": source}`` (written as
            ``module_name.py`` beside the pyproject, so ``server_app``/``client_app`` may name
            them).

    Returns:
        The app directory.

    Raises:
        InvalidValueError: for a bad name, component or module name, or run config key.
        InvalidTypeError: for a run config value TOML cannot hold.
    """
    if not re.match(r"^[a-z0-9][a-z0-9-]*$", name):
        raise InvalidValueError(
            f"Flower app name {name!r}: use lower-case letters, digits and '-'."
        )
    for label, ref in (("server_app", server_app), ("client_app", client_app)):
        module, _, attribute = ref.partition(":")
        if not _MODULE.match(module) or not attribute:
            raise InvalidValueError(f"{label} {ref!r} is not 'module:attribute'.")
    extra = dict(modules or {})
    for module_name in extra:
        if not _MODULE.match(module_name) or "." in module_name:
            raise InvalidValueError(
                f"Module name {module_name!r} is not a plain Python identifier."
            )
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    text = f"""\
# written by onnxblocks.federated.project: a Flower app running onnxblocks' ServerApp and ClientApp
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "onnxblocks"

[tool.flwr.app.components]
serverapp = {toml_value(server_app)}
clientapp = {toml_value(client_app)}

[tool.flwr.app.config]
{render_config(run_config)}
"""
    for module_name, source in extra.items():
        (out / f"{module_name}.py").write_text(source, encoding="utf-8")
    (out / "pyproject.toml").write_text(text, encoding="utf-8")
    return out

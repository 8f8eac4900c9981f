"""Federated learning on Flower: clients train one set of artifacts, a Flower server aggregates
(docs/federated.md).

* :mod:`~onnxblocks.federated.client`: :func:`train_client` / :func:`evaluate_client` (one client's
  round, without Flower) and :func:`make_client_app` (the Flower ``ClientApp`` around them);
* :mod:`~onnxblocks.federated.server`: :func:`make_server_app` (the Flower ``ServerApp``),
  :class:`ServerSettings` (its run config);
* :mod:`~onnxblocks.federated.strategy`: Flower's strategies by name (:func:`build_strategy`) and
  :class:`ValidatingStrategy`, which drops bad replies before they are aggregated
  (:mod:`~onnxblocks.federated.validation`);
* :mod:`~onnxblocks.federated.simulation`: :func:`simulate`, a federation on Flower's simulation
  runtime started with ``flwr run``;
* :mod:`~onnxblocks.federated.history`: :class:`FederatedHistory`, per-round metrics, JSON and
  plots;
* :mod:`~onnxblocks.federated.app`: ``client_app`` and ``server_app`` for a Flower app's pyproject.

Flower is an optional extra: ``pip install "onnxblocks[flower]"``.
"""

import importlib
from typing import Any

try:
    import flwr  # noqa: F401
except ImportError as _missing:  # the extra is not installed
    from onnxblocks._core.errors import MissingDependencyError

    raise MissingDependencyError(
        'onnxblocks.federated needs Flower, an optional extra: pip install "onnxblocks[flower]".'
    ) from _missing

#: Each public name and its module, imported on first use: a SuperNode's ClientApp process imports
#: ``onnxblocks.federated.app`` through this package every message, and a bridge node needs none of
#: the training, server or simulation code.
_EXPORTS = {
    "ClientUpdate": "local",
    "FederatedHistory": "history",
    "LocalConfig": "local",
    "ServerSettings": "server",
    "ValidatingStrategy": "strategy",
    "build_strategy": "strategy",
    "check_arrays": "validation",
    "evaluate_client": "local",
    "make_client_app": "client",
    "make_server_app": "server",
    "run_server": "server",
    "simulate": "simulation",
    "train_client": "local",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "ClientUpdate",
    "FederatedHistory",
    "LocalConfig",
    "ServerSettings",
    "ValidatingStrategy",
    "build_strategy",
    "check_arrays",
    "evaluate_client",
    "make_client_app",
    "make_server_app",
    "run_server",
    "simulate",
    "train_client",
]

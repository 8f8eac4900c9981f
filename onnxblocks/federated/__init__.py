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

try:
    import flwr  # noqa: F401
except ImportError as _missing:  # the extra is not installed
    from onnxblocks._core.errors import MissingDependencyError

    raise MissingDependencyError(
        'onnxblocks.federated needs Flower, an optional extra: pip install "onnxblocks[flower]".'
    ) from _missing

from onnxblocks.federated.client import make_client_app
from onnxblocks.federated.history import FederatedHistory
from onnxblocks.federated.local import ClientUpdate, LocalConfig, evaluate_client, train_client
from onnxblocks.federated.server import ServerSettings, make_server_app, run_server
from onnxblocks.federated.simulation import simulate
from onnxblocks.federated.strategy import ValidatingStrategy, build_strategy
from onnxblocks.federated.validation import check_arrays

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

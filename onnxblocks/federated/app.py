"""The ``client_app`` and ``server_app`` a Flower app's pyproject points at.

```toml
[tool.flwr.app.components]
serverapp = "onnxblocks.federated.app:server_app"
clientapp = "onnxblocks.federated.app:client_app"

[tool.flwr.app.config]
artifacts = "/path/to/artifacts"
num-server-rounds = 10
local-epochs = 1
```

Both read everything from the run config (and the client its node config): see
:mod:`onnxblocks.federated.client` and :mod:`onnxblocks.federated.server` for the keys.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    # built when Flower first reads them: a SuperNode's ClientApp process imports neither the server
    # (strategies, plots) nor, on a bridge node, the training code
    if name == "client_app":
        from onnxblocks.federated.client import make_client_app

        globals()[name] = make_client_app()
    elif name == "server_app":
        from onnxblocks.federated.server import make_server_app

        globals()[name] = make_server_app()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return globals()[name]


#: ``client_app``: the ClientApp (artifacts from run config ``artifacts``, data from node config
#: ``data-path``, or run config ``data-path-<partition-id>`` in simulation; node config ``bridge``
#: relays to a JavaScript client). ``server_app``: the ServerApp (settings from the run config,
#: ``ServerSettings.from_run_config``). Both are built on first access, by ``__getattr__``.

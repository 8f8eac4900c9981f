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

# Built on first access: Flower starts a ClientApp process for every message and loads
# ``client_app`` from this module, so a client never imports the server, its strategies or the
# history (and the ServerApp process never imports the client).
_BUILDERS = {
    # the ClientApp: artifacts from run config ``artifacts``, data from node config ``data-path``
    # (or run config ``data-path-<partition-id>`` in simulation)
    "client_app": ("onnxblocks.federated.client", "make_client_app"),
    # the ServerApp: settings from the run config (``ServerSettings.from_run_config``)
    "server_app": ("onnxblocks.federated.server", "make_server_app"),
}


def __getattr__(name: str) -> Any:
    if name not in _BUILDERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, factory = _BUILDERS[name]
    app = getattr(importlib.import_module(module), factory)()
    globals()[name] = app  # one app per process, as a module attribute would be
    return app


def __dir__() -> list[str]:
    return sorted({*globals(), *_BUILDERS})


# Flower checks a component's name in the module's source (an assignment, or ``__all__``)
__all__ = ["client_app", "server_app"]  # noqa: F822 (built by __getattr__)

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

from onnxblocks.federated.client import make_client_app
from onnxblocks.federated.server import make_server_app

#: The ClientApp: artifacts from run config ``artifacts``, data from node config ``data-path``
#: (or run config ``data-path-<partition-id>`` in simulation).
client_app = make_client_app()
#: The ServerApp: settings from the run config (``ServerSettings.from_run_config``).
server_app = make_server_app()

"""The Flower app `simulate` writes, and its argument checks (no SuperLink started)."""

from __future__ import annotations

import pytest
import tomllib

from onnxblocks.errors import FileMissingError, InvalidValueError, UnknownNameError
from onnxblocks.federated import simulate
from onnxblocks.federated.simulation import write_flower_app


def test_the_app_points_at_onnxblocks_apps_and_holds_the_run_config(tmp_path):
    config = {
        "artifacts": 'C:\\\\dir "x"',
        "num-server-rounds": 3,
        "lr": 0.01,
        "shuffle": False,
        "data-path-0": "a",
    }
    app = write_flower_app(tmp_path / "app", config)
    parsed = tomllib.loads((app / "pyproject.toml").read_text())
    assert parsed["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "onnxblocks.federated.app:server_app",
        "clientapp": "onnxblocks.federated.app:client_app",
    }
    assert parsed["tool"]["flwr"]["app"]["config"] == config
    with pytest.raises(InvalidValueError, match="'bad' is a list"):
        write_flower_app(tmp_path / "app2", {"bad": [1, 2]})


def test_simulate_checks_its_arguments_before_starting_anything(tmp_path):
    data = tmp_path / "a.npz"
    data.write_bytes(b"")
    with pytest.raises(FileMissingError, match="missing.npz"):
        simulate(tmp_path, [str(tmp_path / "missing.npz")])
    with pytest.raises(UnknownNameError, match="round"):
        simulate(tmp_path, [str(data)], round=3)
    with pytest.raises(InvalidValueError, match="client_eval_data"):
        simulate(tmp_path, [str(data)], client_eval_data=[str(data), str(data)])
    with pytest.raises(InvalidValueError, match="at least one"):
        simulate(tmp_path, [])
    assert not list(tmp_path.glob("flwr-home"))

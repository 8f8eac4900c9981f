"""Flower's deployment engine on localhost: a real SuperLink and SuperNodes, started and stopped by onnxblocks.

The apps here are :data:`support.federation.ECHO_APP` (each client adds its node config's value to the
global arrays; the server runs Flower's FedAvg), so the numbers check the plumbing: node configs
reach their nodes, every reply is aggregated, the weights are the clients' row counts. What the
tests pin most is that no Flower process outlives the deployment, whichever way it ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.federation import ECHO_APP, await_flower_processes, flower_processes
from support.numerics import assert_equal

from onnxblocks.federated.deployment import DeploymentError, LocalDeployment, NodeSpec, free_port
from onnxblocks.federated.project import config_arg, write_app


def _echo_app(directory, out, nodes, **extra):
    return write_app(
        directory,
        {"num-server-rounds": 1, "out": str(out), "nodes": nodes, **extra},
        server_app="echo:server_app",
        client_app="echo:client_app",
        modules={"echo": ECHO_APP},
    )


def test_one_round_aggregates_every_node_and_nothing_outlives_the_deployment(tmp_path):
    """Two SuperNodes with their own node config: FedAvg's row-weighted mean of their updates, then all stopped."""
    run_dir = tmp_path / "run"
    app = _echo_app(tmp_path / "app", tmp_path / "out.npy", nodes=2)
    nodes = [NodeSpec({"value": 1.0, "rows": 1}), NodeSpec({"value": 5.0, "rows": 3})]
    with LocalDeployment(nodes, run_dir) as deployment:
        expected = 1 + 2 * len(nodes)  # the SuperLink, the SuperNodes and their SuperExecs
        assert len(await_flower_processes(run_dir, expected)) >= expected
        outcome = deployment.run(app, timeout=300)
        assert outcome.ok, (outcome.status, outcome.details, outcome.log.read_text()[-3000:])
    aggregated = np.load(tmp_path / "out.npy")  # (1 * 1 + 5 * 3) / 4: exact in any order
    assert_equal(aggregated, np.full(3, (1.0 * 1 + 5.0 * 3) / 4, aggregated.dtype))
    assert flower_processes(run_dir) == []
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["run.log", "superlink.log", "supernode-0.log", "supernode-1.log"]
    assert "Activated node_id" in (run_dir / "logs" / "superlink.log").read_text()
    assert "[ROUND 1/1]" in outcome.log.read_text()


def test_an_error_inside_the_block_stops_everything(tmp_path):
    """An exception (here: a run past its timeout, stopped with flwr stop) leaves no Flower process behind."""
    run_dir = tmp_path / "run"
    app = _echo_app(tmp_path / "app", tmp_path / "out.npy", nodes=1, sleep=600.0)
    with pytest.raises(DeploymentError, match="did not finish within"):
        with LocalDeployment([NodeSpec({"value": 1.0, "rows": 1})], run_dir) as deployment:
            deployment.run(app, timeout=8)
    assert flower_processes(run_dir) == []
    assert not (tmp_path / "out.npy").exists()


def test_a_node_that_cannot_start_is_reported_with_its_log_and_nothing_is_left(tmp_path):
    """A SuperNode whose interpreter does not exist: DeploymentError naming its log; the SuperLink is stopped too."""
    run_dir = tmp_path / "run"
    nodes = [NodeSpec({"value": 1.0}), NodeSpec({"value": 2.0}, python=tmp_path / "no-such-python")]
    with pytest.raises(DeploymentError, match=r"supernode-1 exited .*supernode-1\.log"):
        with LocalDeployment(nodes, run_dir, startup_timeout=60):
            pass
    assert flower_processes(run_dir) == []


def test_keyboard_interrupt_stops_everything(tmp_path):
    """Ctrl-C while a round runs (KeyboardInterrupt in the waiting loop) stops the SuperLink, nodes and apps."""
    run_dir = tmp_path / "run"
    app = _echo_app(tmp_path / "app", tmp_path / "out.npy", nodes=1, sleep=600.0)
    deployment = LocalDeployment([NodeSpec({"value": 1.0, "rows": 1})], run_dir)
    interrupted: list[int] = []
    status = deployment.status

    def interrupted_status(run_id):
        # at the first poll that finds the ClientApp alive: it sleeps in its round (sleep=600)
        pids = deployment.client_app_pids(0)
        if pids:
            interrupted.extend(pids)
            raise KeyboardInterrupt
        return status(run_id)

    deployment.status = interrupted_status  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        with deployment:
            deployment.run(app, timeout=300)
    assert interrupted, "the run ended before its ClientApp was seen"
    assert flower_processes(run_dir) == []


def test_free_ports_differ_and_configs_render_as_flower_reads_them():
    ports = {free_port() for _ in range(5)}
    assert all(1024 <= p < 65536 for p in ports)
    taken = {free_port()}
    assert free_port(taken) not in taken
    assert config_arg({"data-path": "/d/a b.npz", "rows": 3, "mu": 0.5, "shuffle": False}) == (
        'data-path="/d/a b.npz" rows=3 mu=0.5 shuffle=false'
    )
    from flwr.common.config import parse_config_args

    assert parse_config_args(
        [config_arg({"data-path": "/d/a b.npz", "rows": 3, "shuffle": False})]
    ) == {
        "data-path": "/d/a b.npz",
        "rows": 3,
        "shuffle": False,
    }


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"data-path": 'a"b.npz'}, ValueError, "double quote"),
        ({"bad key": 1}, ValueError, "not a plain key"),
        ({"x": None}, TypeError, "leave the key out"),
        ({"x": float("nan")}, ValueError, "finite"),
    ],
)
def test_configs_flower_cannot_carry_are_refused(config, error, match):
    with pytest.raises(error, match=match):
        config_arg(config)


def test_bad_node_lists_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one NodeSpec"):
        LocalDeployment([], tmp_path)
    with pytest.raises(TypeError, match=r"nodes\[0\] is a dict"):
        LocalDeployment([{"value": 1}], tmp_path)  # type: ignore[list-item]

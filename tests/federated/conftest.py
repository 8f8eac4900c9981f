"""Fixtures of the federated tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def task_identity():
    """Messages are stamped with the run and node of the process, as in a real run (a ServerApp's or ClientApp's)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture(scope="module")
def one_ray():
    """One Ray instance for the module's in-process simulations (``flwr.simulation.run_simulation``).

    Flower's Ray backend starts Ray when none runs and shuts it down at the end of every run; starting
    it (its GCS, raylet and worker processes) is most of a small simulation's cost on two cores. Here
    each run still gets its own actors, stopped at its end, but Ray itself is shut down once, when the
    module's tests are done.
    """
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend, ray

    def terminate_actors(self) -> None:
        if self.pool:
            self.pool.terminate_all_actors()

    patch = pytest.MonkeyPatch()
    patch.setattr(RayBackend, "terminate", terminate_actors)
    try:
        yield
    finally:
        patch.undo()
        if ray.is_initialized():
            ray.shutdown()

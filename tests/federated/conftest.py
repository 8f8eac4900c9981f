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

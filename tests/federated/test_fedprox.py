"""FedProx on the client: mu * (w - w_global) added to each gradient before the optimizer step, checked in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from support.flower_apps import assert_steps_from, client_files, sgd_reference, spiral_artifacts

from onnxblocks.federated import train_client
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedprox")
    art = spiral_artifacts(root)
    files = client_files(root, sizes=(40,))
    start = {
        k: v * 1.1 - 0.02 for k, v in TrainingSession(art).parameters(trainable_only=True).items()
    }
    return art, files[0], start


@pytest.mark.parametrize("mu", [0.5, 3.0])
def test_proximal_term_matches_numpy(setup, mu):
    art, path, start = setup
    config = {"local-steps": 5, "lr": 0.2, "batch-size": 8, "shuffle": False, "proximal-mu": mu}
    update = train_client(art, path, start, config)
    expected = sgd_reference(art, path, steps=5, lr=0.2, batch_size=8, start=start, mu=mu)
    plain = train_client(art, path, start, {**config, "proximal-mu": 0.0})
    assert_steps_from(start, update.parameters, expected)

    # the term pulls towards the global parameters: the update is shorter than without it
    def distance(p):
        return sum(float(np.sum((p[n] - start[n]) ** 2)) for n in start)

    assert distance(update.parameters) < distance(plain.parameters)


def test_proximal_term_on_the_portable_backend(tmp_path, setup):
    art, path, start = setup
    portable = spiral_artifacts(tmp_path, portable=True)
    config = {"local-steps": 4, "lr": 0.2, "batch-size": 8, "shuffle": False, "proximal-mu": 1.0}
    update = train_client(portable, path, start, config)
    expected = sgd_reference(art, path, steps=4, lr=0.2, batch_size=8, start=start, mu=1.0)
    assert_steps_from(start, update.parameters, expected)

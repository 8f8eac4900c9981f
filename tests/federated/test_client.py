"""One client's round (onnxblocks.federated.local) and the ClientApp's sources, without Flower's runtime."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from support.flower_apps import assert_steps_from, client_files, sgd_reference, spiral_artifacts
from support.numerics import assert_close

from onnxblocks.errors import InvalidValueError, UnknownNameError
from onnxblocks.federated import LocalConfig, evaluate_client, train_client
from onnxblocks.federated.client import ClientSources
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("client")
    art = spiral_artifacts(root)
    files = client_files(root)
    start = {
        k: v * 0.9 + 0.01 for k, v in TrainingSession(art).parameters(trainable_only=True).items()
    }
    return art, files, start


def test_local_training_is_sgd_from_the_global_parameters(setup):
    art, files, start = setup
    config = {"local-steps": 3, "lr": 0.1, "batch-size": 6, "shuffle": False}
    update = train_client(art, files[0], start, config)
    expected = sgd_reference(art, files[0], steps=3, lr=0.1, batch_size=6, start=start)
    assert sorted(update.parameters) == sorted(expected)
    assert_steps_from(start, update.parameters, expected)
    assert (
        update.num_examples == 20 and update.metrics["steps"] == 3 and update.backend == "training"
    )
    assert np.isfinite(update.metrics["train-loss"]) and update.metrics["train-seconds"] > 0


def test_file_order_is_reproducible_and_shuffling_follows_the_seed(setup):
    art, files, start = setup
    runs = [
        train_client(
            art, files[2], start, {"local-epochs": 1, "batch-size": 8, "shuffle": s, "seed": seed}
        )
        for s, seed in ((False, 0), (False, 1), (True, 0), (True, 1))
    ]
    w = "fc1.weight"
    np.testing.assert_array_equal(
        runs[0].parameters[w], runs[1].parameters[w]
    )  # file order: the seed is unused
    assert not np.array_equal(runs[2].parameters[w], runs[3].parameters[w])
    assert runs[0].metrics["steps"] == 5  # 40 rows in batches of 8


def test_optimizer_state_starts_fresh_every_round(tmp_path, setup):
    _, files, start = setup
    art = spiral_artifacts(tmp_path, optimizer="adamw")
    one = train_client(art, files[0], start, {"local-steps": 2, "shuffle": False})
    two = train_client(art, files[0], start, {"local-steps": 2, "shuffle": False})
    for name in one.parameters:
        np.testing.assert_array_equal(one.parameters[name], two.parameters[name])


def test_frozen_parameters_never_travel(tmp_path, setup):
    from onnxblocks import artifacts, optim
    from onnxblocks.demo import build_classifier
    from onnxblocks.losses import CrossEntropyLoss

    _, files, _ = setup
    model = build_classifier(hidden=(16,), seed=0)
    art = tmp_path / "frozen"
    artifacts.generate_artifacts(
        model,
        requires_grad=["fc2.weight", "fc2.bias"],
        frozen_params=["fc1.weight", "fc1.bias"],
        loss=CrossEntropyLoss(),
        optimizer=optim.SGD(),
        artifact_directory=art,
        additional_output_names=["logits"],
    )
    session = TrainingSession(art)
    trainable = session.parameters(trainable_only=True)
    update = train_client(art, files[1], trainable, {"local-steps": 1})
    assert sorted(update.parameters) == ["fc2.bias", "fc2.weight"]
    with pytest.raises(UnknownNameError, match="frozen"):
        train_client(
            art, files[1], {**trainable, "fc1.bias": session.get_parameter("fc1.bias")}, {}
        )
    with pytest.raises(UnknownNameError, match="lack the trainable parameter"):
        train_client(art, files[1], {"fc2.bias": trainable["fc2.bias"]}, {})


def test_bad_config_and_data_get_clear_errors(setup, tmp_path):
    art, files, start = setup
    with pytest.raises(InvalidValueError, match="batch-size"):
        LocalConfig.from_config({"batch-size": 0})
    with pytest.raises(InvalidValueError, match="proximal-mu"):
        LocalConfig.from_config({"proximal-mu": -1.0})
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 2), np.float32))
    with pytest.raises(UnknownNameError, match="features"):
        train_client(art, str(bad), start, {})
    wrong = dict(start, **{"fc1.weight": start["fc1.weight"][:1]})
    with pytest.raises(InvalidValueError, match="fc1.weight"):
        train_client(art, files[0], wrong, {})


def test_evaluation_matches_the_eval_model(setup):
    art, files, start = setup
    metrics = evaluate_client(art, files[2], start, batch_size=7)
    session = TrainingSession(art)
    session.set_parameters(start)
    with np.load(files[2]) as data:
        x, y = data["features"], data["labels"]
    loss, logits = session.eval_step(x, y)
    assert metrics["num-examples"] == 40
    # batches of 7 against one run of 40 rows: the eval model both times, no float64 truth
    assert_close(np.float32(metrics["eval-loss"]), loss, rtol=1e-5, name="eval-loss")
    assert round(metrics["accuracy"] * len(y)) == np.sum(
        np.argmax(logits, 1) == y
    )  # the same rows right


def test_portable_artifacts_train_the_same_on_the_portable_backend(tmp_path, setup):
    art, files, start = setup
    portable = spiral_artifacts(tmp_path, portable=True)
    config = {"local-steps": 3, "lr": 0.1, "batch-size": 6, "shuffle": False}
    update = train_client(portable, files[0], start, config)
    reference = train_client(art, files[0], start, config)
    assert update.backend == "portable"
    assert_steps_from(start, update.parameters, reference.parameters)


def test_client_sources_read_node_and_run_configs():
    context = SimpleNamespace(
        node_id=7,
        node_config={"partition-id": 1, "num-partitions": 2},
        run_config={"artifacts": "art", "data-path-1": "one.npz", "eval-data-path-1": "val1.npz"},
    )
    assert ClientSources().resolve(context) == ("art", "one.npz", "auto")
    assert ClientSources().resolve(context, evaluation=True) == ("art", "val1.npz", "auto")
    assert ClientSources(data=["a.npz", "b.npz"], backend="portable").resolve(context) == (
        "art",
        "b.npz",
        "portable",
    )
    deployed = SimpleNamespace(
        node_id=3, node_config={"data-path": "mine.npz"}, run_config={"artifacts": "art"}
    )
    assert ClientSources().resolve(deployed, evaluation=True) == ("art", "mine.npz", "auto")
    with pytest.raises(UnknownNameError, match="data-path"):
        ClientSources().resolve(
            SimpleNamespace(node_id=1, node_config={}, run_config={"artifacts": "a"})
        )
    with pytest.raises(UnknownNameError, match="artifacts"):
        ClientSources().resolve(SimpleNamespace(node_id=1, node_config={}, run_config={}))
    with pytest.raises(UnknownNameError, match="partition 1"):
        ClientSources(data=["only.npz"]).resolve(context)


def test_importing_without_flower_names_the_extra():
    import subprocess
    import sys

    code = "import sys; sys.modules['flwr'] = None\nimport onnxblocks.federated"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert (
        "MissingDependencyError" in done.stderr
        and 'pip install "onnxblocks[flower]"' in done.stderr
    )

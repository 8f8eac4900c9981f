"""LoRA artifacts in a federation: only the adapters travel, FedAvg averages lora_A and lora_B separately.

A tiny LLaMA (transformers config, random init, TorchScript export) gets LoRA on ``q_proj`` and
``v_proj``; its artifacts' trainable parameters are the adapters alone, so the ArrayRecord each way
holds exactly the ``lora_A``/``lora_B`` names and the frozen base never leaves a client. One FedAvg
round on Flower's simulation runtime equals the example-weighted average of the adapters two
separate ``TrainingSession``s train (rtol 1e-5), and the final checkpoint holds the adapters only.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp.strategy import FedAvg
from support import hf_families
from support.flower_apps import assert_fedavg, session_steps, simulate, weighted_average
from support.numerics import is_close

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.errors import UnknownNameError
from onnxblocks.federated import FederatedHistory, make_client_app, make_server_app, train_client
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

ROWS = (
    4,
    6,
)  # two clients' rows; the TorchScript export has a fixed batch of hf_families.BATCH (2)
LOCAL = {"local_steps": 2, "batch_size": hf_families.BATCH, "shuffle": False, "lr": 1e-2}
CONFIG = {"local-steps": 2, "batch-size": hf_families.BATCH, "shuffle": False, "lr": 1e-2}


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_federated")
    family = hf_families.make("llama")
    artifacts = generate_artifacts(
        hf_families.export(family, "ts"),
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=root / "art",
        additional_output_names=["output"],
        lora=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    info = lora_info(artifacts.training_model)
    assert info is not None
    rng = np.random.default_rng(1)
    files = []
    for k, rows in enumerate(ROWS):
        ids = rng.integers(0, hf_families.VOCAB, (rows, hf_families.SEQ)).astype(np.int64)
        labels = rng.integers(0, hf_families.VOCAB, (rows, hf_families.SEQ)).astype(np.int64)
        files.append(str(root / f"client{k}.npz"))
        np.savez(files[-1], arr_0=ids, arr_1=labels)  # onnxblocks train's format, inputs in order
    return root, artifacts.directory, info, files


def separate_sessions(art, files):
    """Each client's adapters after the round's AdamW steps, in a session of its own."""
    steps, lr, batch = LOCAL["local_steps"], LOCAL["lr"], LOCAL["batch_size"]
    return [session_steps(art, path, steps, lr, batch)[0] for path in files]


def test_only_the_adapters_travel_and_the_base_stays(lora, task_identity):
    _, art, info, files = lora
    adapters = sorted(info.adapter_names)
    assert len(adapters) == 4 and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    start = TrainingSession(art).parameters(trainable_only=True)
    assert sorted(start) == adapters
    context = Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config={})
    content = RecordDict({"arrays": to_record(start), "config": ConfigRecord(CONFIG)})
    reply = make_client_app(art, data=files[0])(
        Message(content=content, dst_node_id=3, message_type="train"), context
    )
    assert not reply.has_error(), reply.error
    sent = from_record(reply.content["arrays"])
    assert sorted(sent) == adapters  # exactly the adapters: the base weights never leave the client
    assert any(
        np.abs(sent[n] - start[n]).max() > 0 for n in adapters if ".lora_B." in n
    )  # they trained
    checkpoint = load_checkpoint(art / "checkpoint")
    assert sorted(checkpoint.trainable) == adapters and not checkpoint.frozen
    graph = onnx.load(
        art / "training_model.onnx"
    ).graph  # the frozen base: constants of every client's graphs
    base = sum(int(np.prod(i.dims)) for i in graph.initializer if i.name not in start)
    assert base > 10 * sum(
        v.size for v in start.values()
    )  # 3575 base elements, 224 adapter elements
    weight = next(iter(info.targets.values())).weight
    with pytest.raises(UnknownNameError, match="not parameters of the artifacts"):
        train_client(art, files[0], {**start, weight: np.zeros(1, np.float32)}, CONFIG)


def test_one_fedavg_round_averages_the_clients_adapters(lora):
    root, art, info, files = lora
    out = root / "fedavg"
    seen: dict[str, list[list[str]]] = {"sent": [], "received": []}

    class Recording(FedAvg):
        """Flower's FedAvg, noting the names of what travels each way."""

        def configure_train(self, server_round, arrays, config, grid):
            seen["sent"].append(sorted(arrays.keys()))
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen["received"] += [sorted(m.content["arrays"].keys()) for m in replies]
            return super().aggregate_train(server_round, replies)

    strategy = Recording(
        fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2, min_evaluate_nodes=0
    )
    server = make_server_app(
        art,
        strategy=strategy,
        rounds=1,
        save=str(out / "final.ckpt"),
        export=str(out / "model.onnx"),
        history=str(out / "history.json"),
        **LOCAL,
    )
    simulate(server, make_client_app(art, data=files), len(files))
    adapters = sorted(info.adapter_names)
    assert seen == {"sent": [adapters], "received": [adapters, adapters]}
    saved = load_checkpoint(out / "final.ckpt")
    assert sorted(saved.trainable) == adapters and not saved.frozen and not saved.optimizer_state
    final = TrainingSession(art, checkpoint=out / "final.ckpt").parameters(trainable_only=True)
    results = separate_sessions(art, files)
    assert_fedavg(final, results, ROWS)
    expected, _ = weighted_average(results, ROWS)
    history = FederatedHistory.load(out / "history.json")
    assert sorted(c["num-examples"] for c in history.clients) == list(ROWS) and not history.dropped
    # FedAvg averages A and B separately: the merged update is not the average of the clients' updates
    target = next(iter(info.targets.values()))
    merged = expected[target.lora_B] @ expected[target.lora_A]
    per_client, _ = weighted_average(
        [{"d": r[target.lora_B].astype(np.float64) @ r[target.lora_A]} for r in results], ROWS
    )
    assert not is_close(merged, per_client["d"], rtol=1e-3)
    assert (out / "model.onnx").exists()

"""What a node keeps between messages, and what a ClientApp process does not import.

Flower's SuperNode starts a fresh ClientApp process for every message, so whatever a message finds
about the artifacts is found again next round unless the node keeps it. The index rules of the
artifacts' models (their search walks each graph and may run ONNX shape inference over it) are
kept in the node's cache directory by model content: the second message reads them back and searches
no graph, trains to the same parameters bit for bit, and its batch guard still refuses a label out
of range. File opens are counted with an audit hook on ``open``, as in
tests/runtime/test_artifact_set.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from onnx import TensorProto, helper
from support.flower_apps import client_files, spiral_artifacts

from onnxblocks.errors import InvalidValueError
from onnxblocks.federated import make_client_app
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.runtime import TrainingSession, rules_cache
from onnxblocks.runtime.index_rules import index_rules

CONFIG = {"local-steps": 2, "batch-size": 4, "shuffle": False}

_counting: list[Counter] = []


def _hook(event: str, args: tuple) -> None:
    if _counting and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _counting[-1][Path(os.fsdecode(args[0])).name] += 1


sys.addaudithook(_hook)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("node_cache")
    art = spiral_artifacts(root)
    return art, client_files(root, (8,))[0]


def _message(app, context, start):
    content = RecordDict({"arrays": to_record(start), "config": ConfigRecord(CONFIG)})
    return app(Message(content=content, dst_node_id=7, message_type="train"), context)


def test_the_second_message_reads_the_rules_the_first_kept(
    setup, tmp_path, monkeypatch, task_identity
):
    art, data = setup
    cache = tmp_path / "node"
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"cache-dir": str(cache)},
        state=RecordDict(),
        run_config={},
    )
    searched: list[tuple[str, ...]] = []

    def counted(model, inputs):
        searched.append(tuple(inputs))
        return index_rules(model, inputs)

    monkeypatch.setattr(rules_cache, "index_rules", counted)
    app = make_client_app(art, data=data)
    start = TrainingSession(art).parameters(trainable_only=True)
    replies, reads, searches = [], [], []
    for _ in range(2):
        searched.clear()
        counts: Counter = Counter()
        _counting.append(counts)
        try:
            replies.append(_message(app, context, start))
        finally:
            _counting.pop()
        assert not replies[-1].has_error(), replies[-1].error
        reads.append({n: c for n, c in counts.items() if n.startswith("index-rules-")})
        searches.append(len(searched))
    kept = sorted(p.name for p in cache.iterdir())
    assert len(kept) == 2, kept  # the training and the eval model's rules
    assert searches == [2, 0]
    assert sorted(reads[1]) == kept and all(c == 1 for c in reads[1].values())
    first, second = (from_record(r.content["arrays"]) for r in replies)
    assert sorted(first) == sorted(second)
    for name in first:  # one computation twice: equal bit for bit
        np.testing.assert_array_equal(second[name], first[name], err_msg=name)


def test_rules_read_back_still_refuse_a_label_out_of_range(setup, tmp_path, task_identity):
    art, data = setup
    with np.load(data) as loaded:
        bad = tmp_path / "bad.npz"
        labels = loaded["labels"].copy()
        labels[0] = 3  # the spiral classifier has 3 classes: 0, 1, 2
        np.savez(bad, features=loaded["features"], labels=labels)
    cache = tmp_path / "node"
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"cache-dir": str(cache)},
        state=RecordDict(),
        run_config={},
    )
    start = TrainingSession(art).parameters(trainable_only=True)
    assert not _message(make_client_app(art, data=data), context, start).has_error()
    assert len(list(cache.iterdir())) == 2
    with pytest.raises(InvalidValueError, match=r"'labels' holds 3 .* must be in \[0, 3\)"):
        _message(make_client_app(art, data=str(bad)), context, start)


def _loss_model(classes: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])],
        "loss",
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", classes]),
            helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_changed_model_or_a_damaged_file_is_never_served_stale_rules(tmp_path):
    three, five = _loss_model(3), _loss_model(5)
    assert rules_cache.rules_file(three, ["labels"]) != rules_cache.rules_file(five, ["labels"])
    assert rules_cache.rules_file(three, ["labels"]) != rules_cache.rules_file(three, ["other"])
    assert rules_cache.cached_index_rules(three, ["labels"]) == index_rules(three, ["labels"])
    assert not list(tmp_path.iterdir())  # outside keep_rules_in nothing is written
    with rules_cache.keep_rules_in(tmp_path) as directory:
        assert directory == tmp_path
        for model, high in ((three, 3), (five, 5)):
            assert [r.high for r in rules_cache.cached_index_rules(model, ["labels"])] == [high]
        path = tmp_path / rules_cache.rules_file(three, ["labels"])
        for damaged in ("not json", '[{"input": "labels", "low": "0"}]', '[{"high": 1.5}]'):
            path.write_text(damaged)
            assert rules_cache.cached_index_rules(three, ["labels"]) == index_rules(
                three, ["labels"]
            )
        assert path.read_text() != damaged  # rewritten whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        rules_cache.rules_file(m, ["labels"]) for m in (three, five)
    )


def test_a_client_app_process_imports_no_server_no_graph_builder_and_no_onnxruntime():
    code = (
        "import sys\n"
        "from flwr.supercore.object_ref import load_app\n"
        "app = load_app('onnxblocks.federated.app:client_app', RuntimeError)\n"
        "print(type(app).__name__)\n"
        "print(' '.join(m for m in ('onnxblocks.federated.server', 'onnxblocks.blocks',\n"
        "    'onnxblocks.losses', 'onnxblocks.optim', 'onnx', 'onnxruntime', 'torch')\n"
        "    if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    kind, imported = [*done.stdout.splitlines(), "", ""][:2]
    assert kind == "ClientApp"
    assert imported == "", f"a ClientApp process imported {imported} before its first message"

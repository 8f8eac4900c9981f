"""``from_hub`` across architectures and tasks: each task's loss equals transformers' on the same weights.

Qwen2 and GPT-2 causal LMs with past key values (fed an empty cache), a Qwen2 token classifier and
BERT's sequence classifier and masked LM, all Optimum exports of tiny random-init configs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support.numerics import assert_close
from support.optimum_env import optimum_export

from onnxblocks.hub import from_hub, read_record
from onnxblocks.runtime import TrainingSession

BATCH, SEQ = 2, 6
CASES = [
    ("qwen2", True, "causal-lm"),
    ("gpt2", True, "causal-lm"),
    ("qwen2", False, "token-classification"),
    ("bert", False, "sequence-classification"),
    ("bert", False, "masked-lm"),
]
TORCH_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "token-classification": "AutoModelForTokenClassification",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
}


def _batch(hub, task: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    ids = rng.integers(7, 27, size=(BATCH, SEQ), dtype=np.int64)
    if task == "sequence-classification":
        labels = np.array([0, 1], np.int64)
    elif task == "token-classification":
        labels = rng.integers(0, 2, size=(BATCH, SEQ), dtype=np.int64)
        labels[0, 0] = -100
    elif task == "masked-lm":
        labels = np.full((BATCH, SEQ), -100, np.int64)
        labels[:, 2] = ids[:, 2]
        ids[:, 2] = 4  # [MASK]
    else:
        labels = ids.copy()
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "position_ids": np.tile(np.arange(SEQ, dtype=np.int64), (BATCH, 1)),
        "labels": labels,
    }
    graph = onnx.load(str(hub / "onnx" / "model.onnx"), load_external_data=False).graph
    for value in graph.input:
        if value.name.startswith("past_key_values."):
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            batch[value.name] = np.zeros((BATCH, dims[1], 0, dims[3]), np.float32)
    return batch


def _torch_loss(hub, task: str, batch: dict) -> tuple[float, float]:
    torch = pytest.importorskip("torch")
    import transformers

    cls = getattr(transformers, TORCH_CLASSES[task])
    losses = []
    for dtype in (torch.float32, torch.float64):
        model = cls.from_pretrained(hub, dtype=dtype).eval()
        feeds = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "labels")}
        with torch.no_grad():
            losses.append(float(model(**feeds).loss))
    return losses[0], losses[1]


@pytest.mark.parametrize("family, with_past, task", CASES, ids=[f"{f}-{t}" for f, _, t in CASES])
def test_task_loss_equals_transformers(tmp_path, family, with_past, task):
    hub = optimum_export(family, with_past=with_past, task=task)
    from_hub(hub, tmp_path / "art")
    assert read_record(tmp_path / "art").task == task  # from config.json's architectures
    session = TrainingSession(tmp_path / "art")
    batch = _batch(hub, task)
    expected, expected64 = _torch_loss(hub, task, batch)
    losses = [
        session.eval_step(*[batch[n] for n in session.eval_input_names])[0],
        session.train_step(*[batch[n] for n in session.input_names])[0],
    ]
    for loss in losses:
        assert_close(np.float32(loss), np.float32(expected), np.float64(expected64), rtol=1e-5)

"""CrossEntropyLoss(chunk_size=...): the lean language-model loss (onnxblocks.losses.chunked).

The loss over chunks of tokens, with the LM head inside the chunks (``head_weight``) or on the
logits, against torch's ``cross_entropy`` in float32 and float64, on the training build and on
portable artifacts (this venv's onnxruntime): the loss and the gradient of a trained weight
upstream of the head, within 1e-6 relative. The training graph holds no ``[B, T, V]`` value when
the head is inside the loss.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

import onnxblocks
from onnxblocks import losses
from onnxblocks.artifacts import OptimType
from onnxblocks.errors import GradientError, InvalidTypeError, InvalidValueError
from onnxblocks.runtime import TrainingSession

B, T, H, V = 2, 5, 8, 11
RTOL = 1e-6
_rng = np.random.default_rng(0)
A = (_rng.standard_normal((H, H)) * 0.5).astype(np.float32)
W = _rng.standard_normal((V, H)).astype(np.float32)
X = _rng.standard_normal((B, T, H)).astype(np.float32)
LABELS = _rng.integers(0, V, (B, T)).astype(np.int64)
IGNORED = LABELS.copy()
IGNORED[0, 1] = IGNORED[1, 3] = IGNORED[1, 4] = -100


def _model(in_out: bool) -> onnx.ModelProto:
    """``x @ A`` then an LM head: ``MatMul(h, Transpose(W))`` ([V, H]) or ``MatMul(h, W^T)``."""
    head = [helper.make_node("MatMul", ["h", "W"], ["logits"])]
    weight = W.T.copy() if in_out else W
    if not in_out:
        head.insert(0, helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]))
        head[1] = helper.make_node("MatMul", ["h", "Wt"], ["logits"])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "A"], ["h"]), *head],
        "lm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, H])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", T, V])],
        [numpy_helper.from_array(A, "A"), numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _torch(labels: np.ndarray, reduction: str, dtype: torch.dtype) -> tuple[float, np.ndarray]:
    a = torch.tensor(A, dtype=dtype, requires_grad=True)
    logits = (torch.tensor(X, dtype=dtype) @ a) @ torch.tensor(W, dtype=dtype).T
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, V),
        torch.tensor(labels).reshape(-1),
        ignore_index=-100,
        reduction=reduction,
    )
    loss.backward()
    assert a.grad is not None
    return loss.item(), a.grad.numpy()


CASES = [
    pytest.param(head, in_out, reduction, ignore, portable, id=f"{name}-{reduction}-{tag}-{kind}")
    for head, in_out, name in [
        (None, False, "logits"),
        ("W", False, "head"),
        ("W", True, "head_in_out"),
    ]
    for reduction in ["mean", "sum"]
    for ignore, tag in [(False, "all"), (True, "ignored")]
    for portable, kind in [(False, "training"), (True, "portable")]
    if not (portable and reduction == "sum" and ignore)  # the portable cases: one less each
]


@pytest.mark.parametrize(("head", "in_out", "reduction", "ignore", "portable"), CASES)
def test_chunked_loss_matches_torch(tmp_path, head, in_out, reduction, ignore, portable) -> None:
    labels = IGNORED if ignore else LABELS
    loss = losses.CrossEntropyLoss(
        class_axis=-1,
        reduction=reduction,
        ignore_index=-100 if ignore else None,
        chunk_size=3,
        head_weight=head,
    )
    onnxblocks.generate_artifacts(
        _model(in_out),
        requires_grad=["A"],
        loss=loss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        portable=portable,
    )
    session = TrainingSession(tmp_path)
    got = session.train_step(X, labels)[0]
    grad = session.gradients()["A"]
    want, grad32 = _torch(labels, reduction, torch.float32)
    want64, grad64 = _torch(labels, reduction, torch.float64)
    assert_close(np.asarray(got), np.float32(want), np.float64(want64), rtol=RTOL, name="loss")
    assert_close(grad, grad32, grad64, rtol=RTOL, name="dA")


def _value_dims(model: onnx.ModelProto) -> list[list[int | str]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return [
        [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]
        for vi in inferred.graph.value_info
    ]


def test_head_in_the_loss_keeps_no_vocabulary_wide_value(tmp_path) -> None:
    """With the head inside the loss, no top-level value of the training graph has V columns."""
    loss = losses.CrossEntropyLoss(class_axis=-1, ignore_index=-100, chunk_size=3, head_weight="W")
    onnxblocks.generate_artifacts(
        _model(False),
        requires_grad=["A"],
        loss=loss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
    )
    training = onnx.load(tmp_path / "training_model.onnx")
    wide = [dims for dims in _value_dims(training) if dims and dims[-1] == V]
    assert wide == []
    assert not any(n.op_type in ("MatMul", "Gemm") and "Wt" in n.input for n in training.graph.node)


def test_trained_head_weight_is_refused(tmp_path) -> None:
    loss = losses.CrossEntropyLoss(class_axis=-1, chunk_size=3, head_weight="W")
    with pytest.raises(GradientError, match="'W'"):
        onnxblocks.generate_artifacts(
            _model(False),
            requires_grad=["A", "W"],
            loss=loss,
            optimizer=OptimType.AdamW,
            artifact_directory=tmp_path,
        )


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"chunk_size": 0}, InvalidValueError, "at least 1"),
        ({"chunk_size": 2.5}, InvalidTypeError, "chunk_size must be an int"),
        ({"head_weight": "W"}, InvalidValueError, "give chunk_size"),
        ({"chunk_size": 4, "reduction": "none"}, InvalidValueError, "reduction='none'"),
        ({"chunk_size": 4, "label_smoothing": 0.1}, InvalidValueError, "label smoothing"),
    ],
)
def test_chunking_options_are_checked(options, error, match) -> None:
    with pytest.raises(error, match=match):
        losses.CrossEntropyLoss(class_axis=-1, **options)

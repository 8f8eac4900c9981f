"""The reference's loss blocks: every option's value against torch, and gradients through ORT's training API.

The programs follow the reference's own tests (see ``tests/support/reference.py``), run through
``onnxblocks.compat`` and checked numerically.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.reference import (
    Session,
    assert_grads,
    infer,
    loss_block,
    loss_run,
    make_labels,
    probability_target,
    regression_target,
    save_block_files,
    twice,
)

from onnxblocks.compat import onnxblock

# ------------------------------------------------------------------ losses: values (every option) and gradients
CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 1.5], dtype=np.float32)
POS_WEIGHT = np.array([3.0, 0.5, 1.0, 2.0], dtype=np.float32)

LOSS_CASES = {
    "mse-mean": ("MSELoss", {}, regression_target, lambda: torch.nn.MSELoss()),
    "mse-sum": (
        "MSELoss",
        {"reduction": "sum"},
        regression_target,
        lambda: torch.nn.MSELoss(reduction="sum"),
    ),
    "mse-none": (
        "MSELoss",
        {"reduction": "none"},
        regression_target,
        lambda: torch.nn.MSELoss(reduction="none"),
    ),
    "l1-mean": ("L1Loss", {}, regression_target, lambda: torch.nn.L1Loss()),
    "l1-sum": (
        "L1Loss",
        {"reduction": "sum"},
        regression_target,
        lambda: torch.nn.L1Loss(reduction="sum"),
    ),
    "l1-none": (
        "L1Loss",
        {"reduction": "none"},
        regression_target,
        lambda: torch.nn.L1Loss(reduction="none"),
    ),
    "ce-mean": ("CrossEntropyLoss", {}, make_labels, lambda: torch.nn.CrossEntropyLoss()),
    "ce-weight": (
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT},
        make_labels,
        lambda: torch.nn.CrossEntropyLoss(weight=torch.from_numpy(CLASS_WEIGHT)),
    ),
    "ce-ignore": (
        "CrossEntropyLoss",
        {"ignore_index": -100},
        lambda: make_labels(with_ignored=True),
        lambda: torch.nn.CrossEntropyLoss(ignore_index=-100),
    ),
    "ce-weight-ignore-sum": (
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT, "ignore_index": -100, "reduction": "sum"},
        lambda: make_labels(with_ignored=True),
        lambda: torch.nn.CrossEntropyLoss(
            weight=torch.from_numpy(CLASS_WEIGHT), ignore_index=-100, reduction="sum"
        ),
    ),
    "ce-weight-ignore-mean": (
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT, "ignore_index": -100},
        lambda: make_labels(with_ignored=True),
        lambda: torch.nn.CrossEntropyLoss(weight=torch.from_numpy(CLASS_WEIGHT), ignore_index=-100),
    ),
    "ce-none": (
        "CrossEntropyLoss",
        {"reduction": "none"},
        make_labels,
        lambda: torch.nn.CrossEntropyLoss(reduction="none"),
    ),
    "bce-mean": ("BCEWithLogitsLoss", {}, probability_target, lambda: torch.nn.BCEWithLogitsLoss()),
    "bce-weight": (
        "BCEWithLogitsLoss",
        {"weight": CLASS_WEIGHT},
        probability_target,
        lambda: torch.nn.BCEWithLogitsLoss(weight=torch.from_numpy(CLASS_WEIGHT)),
    ),
    "bce-pos-weight-sum": (
        "BCEWithLogitsLoss",
        {"pos_weight": POS_WEIGHT, "reduction": "sum"},
        probability_target,
        lambda: torch.nn.BCEWithLogitsLoss(
            pos_weight=torch.from_numpy(POS_WEIGHT), reduction="sum"
        ),
    ),
    "bce-both-none": (
        "BCEWithLogitsLoss",
        {"weight": CLASS_WEIGHT, "pos_weight": POS_WEIGHT, "reduction": "none"},
        probability_target,
        lambda: torch.nn.BCEWithLogitsLoss(
            weight=torch.from_numpy(CLASS_WEIGHT),
            pos_weight=torch.from_numpy(POS_WEIGHT),
            reduction="none",
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(LOSS_CASES))
def test_loss_value_matches_torch(net, case):
    loss_name, options, target_fn, torch_loss = LOSS_CASES[case]
    block = loss_block(onnxblock.ForwardBlock, loss_name, options)
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    model = block.to_model_proto()
    target = target_fn()
    feeds = {model.graph.input[0].name: net.x.numpy(), model.graph.input[1].name: target.numpy()}
    (loss,) = infer(model, feeds, [model.graph.output[0].name])
    with torch.no_grad():
        expected = twice(
            lambda model, loss, x: loss(model(x), target), net.torch, torch_loss(), net.x
        )
    assert loss.shape == expected.value.shape
    expected.check(loss, name=case)


@pytest.mark.parametrize("case", sorted(c for c in LOSS_CASES if not c.endswith("none")))
def test_loss_gradients_match_torch_in_the_training_api(tmp_path, net, case):
    loss_name, options, target_fn, torch_loss = LOSS_CASES[case]
    block = loss_block(onnxblock.TrainingBlock, loss_name, options)
    for name in net.params:
        block.requires_grad(name)
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    session = Session.of(save_block_files(tmp_path, block))
    target = target_fn()
    (loss,) = session.train(net.x.numpy(), target.numpy())
    expected = loss_run(net.torch, (net.x,), target, torch_loss())
    expected[0].check(loss, name="loss")
    assert_grads(session, expected)
    (eval_loss,) = session.eval(net.x.numpy(), target.numpy())
    expected[0].check(eval_loss, name="eval loss")

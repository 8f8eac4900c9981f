"""The reference's optimizers (AdamW, SGD, clipping) against their formulas, through ORT's training API.

The programs follow the reference's own tests (see ``tests/support/reference.py``), run through
``onnxblocks.compat`` and checked numerically.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support.reference import (
    Session,
    hf_adamw_step,
    infer,
    loss_block,
    make_labels,
    regression_target,
    save_block_files,
)

from onnxblocks.compat import artifacts, onnxblock


# ------------------------------------------------------------------ optimizers
def _clip(grads: dict[str, np.ndarray], max_norm: float | None) -> dict[str, np.ndarray]:
    if max_norm is None:
        return grads
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
    scale = min(1.0, max_norm / (norm + 1e-6))
    return {n: g * scale for n, g in grads.items()}


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("clip", [None, 0.05])
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_custom_optimizer_block(tmp_path, net, kind, clip):
    betas, eps, weight_decay, lr = (0.8, 0.95), 1e-3, 0.25, 0.01
    clip_grad = onnxblock.optim.ClipGradNorm(clip) if clip else None
    if kind == "AdamW":
        optimizer = onnxblock.optim.AdamW(betas=betas, eps=eps, weight_decay=weight_decay, clip_grad=clip_grad)
    else:
        optimizer = onnxblock.optim.SGD(clip_grad=clip_grad)
    art = artifacts.generate_artifacts(
        net.onnx,
        requires_grad=net.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optimizer,
        artifact_directory=tmp_path,
    )
    optimizer_model = onnx.load(art.optimizer_model)
    nodes = {n.op_type: n for n in optimizer_model.graph.node}
    if kind == "AdamW":
        attrs = _attributes(nodes["AdamWOptimizer"])
        assert attrs["alpha"] == pytest.approx(betas[0]) and attrs["beta"] == pytest.approx(betas[1])
        assert attrs["epsilon"] == pytest.approx(eps) and attrs["weight_decay"] == pytest.approx(weight_decay)
        assert (attrs["adam_mode"], attrs["correct_bias"]) == (1, 1)  # the reference's Hugging Face AdamW
    else:
        assert "SGDOptimizerV2" in nodes
    assert ("InplaceClipGradNorm" in nodes) is bool(clip)
    if clip:
        assert _attributes(nodes["InplaceClipGradNorm"])["max_norm"] == pytest.approx(clip)

    session = Session.of(art)
    session.optimizer.set_learning_rate(lr)
    w = {n: p.detach().numpy().astype(np.float64) for n, p in net.torch.named_parameters()}
    m = {n: np.zeros_like(a) for n, a in w.items()}
    v = {n: np.zeros_like(a) for n, a in w.items()}
    labels = make_labels()
    for t in (1, 2):
        session.train(net.x.numpy(), labels.numpy())
        grads = _clip({n: session.grad(n).astype(np.float64) for n in net.params}, clip)
        session.step()
        for n in net.params:
            if kind == "AdamW":
                w[n], m[n], v[n] = hf_adamw_step(w[n], grads[n], m[n], v[n], t, lr, *betas, eps, weight_decay)
            else:
                w[n] = w[n] - lr * grads[n]
            np.testing.assert_allclose(session.param(n), w[n], rtol=1e-5, atol=1e-6, err_msg=f"{n} at step {t}")


def test_optimizer_block_in_an_empty_base(tmp_path, net):
    """The reference's low-level pattern: build the optimizer in ``empty_base`` and take ``accessor.model``."""
    block = loss_block(onnxblock.TrainingBlock, "MSELoss", {})
    for name in net.params:
        block.requires_grad(name)
    with onnxblock.base(net.onnx):
        _ = block(net.onnx.graph.output[0].name)
    optimizer = onnxblock.optim.AdamW()
    with onnxblock.empty_base() as accessor:
        output_name = optimizer(block.parameters())
        optimizer_model = accessor.model
    assert output_name in [o.name for o in optimizer_model.graph.output]
    # the model runs on its own, fed as the reference's execution test feeds it
    target = regression_target()
    model = copy.deepcopy(net.torch)
    torch.nn.functional.mse_loss(model(net.x), target).backward()
    feeds = {
        "learning_rate": np.full(1, 0.01, np.float32),
        "step": np.full(1, 1, np.int64),
        "params": [],
        "gradients": [],
        "first_order_moments": [],
        "second_order_moments": [],
    }
    for _, p in model.named_parameters():
        feeds["params"].append(p.detach().numpy().copy())
        feeds["gradients"].append(p.grad.numpy().copy())
        feeds["first_order_moments"].append(np.zeros_like(feeds["params"][-1]))
        feeds["second_order_moments"].append(np.zeros_like(feeds["params"][-1]))
    params = [a.copy() for a in feeds["params"]]
    (updated,) = infer(optimizer_model, feeds, [output_name])
    assert bool(np.asarray(updated).reshape(-1)[0])
    for before, after, g in zip(params, feeds["params"], feeds["gradients"], strict=True):  # updated in place
        expected, _, _ = hf_adamw_step(before.astype(np.float64), g, 0.0, 0.0, 1, 0.01, 0.9, 0.999, 1e-6, 0.0)
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
    # and in the training API, beside the block's training model
    session = Session.of(save_block_files(tmp_path, block, optimizer_model))
    session.optimizer.set_learning_rate(0.01)
    session.train(net.x.numpy(), target.numpy())
    session.step()
    for name, expected in zip(net.params, feeds["params"], strict=True):
        np.testing.assert_allclose(session.param(name), expected, rtol=1e-5, atol=1e-6)

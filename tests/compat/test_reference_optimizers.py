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
from support.numerics import assert_close
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
    """Clip by the global norm, in the gradients' dtype."""
    if max_norm is None:
        return grads
    norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
    real = norm.dtype.type
    scale = min(real(1.0), real(max_norm) / (norm + real(1e-6)))
    return {n: g * scale for n, g in grads.items()}


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("clip", [None, 0.05])
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_custom_optimizer_block(tmp_path, net, kind, clip):
    betas, eps, weight_decay, lr = (0.8, 0.95), 1e-3, 0.25, 0.01
    clip_grad = onnxblock.optim.ClipGradNorm(clip) if clip else None
    if kind == "AdamW":
        optimizer = onnxblock.optim.AdamW(
            betas=betas, eps=eps, weight_decay=weight_decay, clip_grad=clip_grad
        )
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
        hyper = [attrs["alpha"], attrs["beta"], attrs["epsilon"], attrs["weight_decay"]]
        assert (
            np.float32(hyper).tolist() == np.float32([*betas, eps, weight_decay]).tolist()
        )  # float attributes
        assert (attrs["adam_mode"], attrs["correct_bias"]) == (
            1,
            1,
        )  # the reference's Hugging Face AdamW
    else:
        assert "SGDOptimizerV2" in nodes
    assert ("InplaceClipGradNorm" in nodes) is bool(clip)
    if clip:
        assert np.float32(_attributes(nodes["InplaceClipGradNorm"])["max_norm"]) == np.float32(clip)

    session = Session.of(art)
    session.optimizer.set_learning_rate(lr)
    # the formulas in float32 and in float64 on the session's gradients; the floor: |w| plus the updates summed
    start = {n: p.detach().numpy() for n, p in net.torch.named_parameters()}
    w = {
        dtype: {n: a.astype(dtype) for n, a in start.items()} for dtype in (np.float32, np.float64)
    }
    m = {dtype: {n: np.zeros_like(a) for n, a in w[dtype].items()} for dtype in w}
    v = {dtype: {n: np.zeros_like(a) for n, a in w[dtype].items()} for dtype in w}
    scale = {n: np.abs(a.astype(np.float64)) for n, a in start.items()}
    labels = make_labels()
    for t in (1, 2):
        session.train(net.x.numpy(), labels.numpy())
        grads = {
            dtype: _clip({n: session.grad(n).astype(dtype) for n in net.params}, clip)
            for dtype in w
        }
        session.step()
        for n in net.params:
            before64 = w[np.float64][n]
            for dtype, ws in w.items():
                if kind == "AdamW":
                    ws[n], m[dtype][n], v[dtype][n] = hf_adamw_step(
                        ws[n],
                        grads[dtype][n],
                        m[dtype][n],
                        v[dtype][n],
                        t,
                        lr,
                        *betas,
                        eps,
                        weight_decay,
                    )
                else:
                    ws[n] = ws[n] - dtype(lr) * grads[dtype][n]
            scale[n] = scale[n] + np.abs(w[np.float64][n] - before64)
            want, want64 = w[np.float32][n], w[np.float64][n]
            assert_close(
                session.param(n), want, want64, rtol=1e-5, scale=scale[n], name=f"{n} at step {t}"
            )


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
    model64 = copy.deepcopy(net.torch).double()
    torch.nn.functional.mse_loss(model64(net.x.double()), target.double()).backward()
    grads64 = [p.grad.numpy() for p in model64.parameters()]
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
    # one step of the formula in float32 on torch's float32 gradients, and in float64 on its float64 ones
    hyper = (1, 0.01, 0.9, 0.999, 1e-6, 0.0)
    want = [
        hf_adamw_step(p, g, 0.0, 0.0, *hyper)[0]
        for p, g in zip(params, feeds["gradients"], strict=True)
    ]
    want64 = [
        hf_adamw_step(p.astype(np.float64), g, 0.0, 0.0, *hyper)[0]
        for p, g in zip(params, grads64, strict=True)
    ]
    scales = [np.abs(p) + np.abs(p - w) for p, w in zip(params, want64, strict=True)]
    (updated,) = infer(optimizer_model, feeds, [output_name])
    assert bool(np.asarray(updated).reshape(-1)[0])
    for i, after in enumerate(feeds["params"]):  # updated in place
        assert_close(after, want[i], want64[i], rtol=1e-5, scale=scales[i], name=f"parameter {i}")
    # and in the training API, beside the block's training model
    session = Session.of(save_block_files(tmp_path, block, optimizer_model))
    session.optimizer.set_learning_rate(0.01)
    session.train(net.x.numpy(), target.numpy())
    session.step()
    for i, name in enumerate(net.params):
        assert_close(session.param(name), want[i], want64[i], rtol=1e-5, scale=scales[i], name=name)

"""Optimizers in standard ops (onnxblocks.portable.optimizer) against the training build and torch.

Over several steps with random gradients and a changing learning rate:

* the portable optimizer model equals the training build's ``AdamWOptimizer`` /
  ``SGDOptimizerV2`` (+ ``InplaceClipGradNorm``) kernels at rtol 1e-6;
* and ``torch.optim.AdamW`` / ``torch.optim.SGD`` (+ ``torch.nn.utils.clip_grad_norm_``)
  at rtol 1e-5, run in float32 and in float64; Hugging Face mode against its update rule written in torch.

Comparisons go through ``support.numerics``: the floor of each step's parameter is its operands'
magnitude, ``|previous value| + |update|`` of the reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support.numerics import assert_close

import onnxblocks
from onnxblocks import optim
from onnxblocks._core.contracts import (
    FIRST_ORDER_MOMENTS,
    PARAMS,
    SECOND_ORDER_MOMENTS,
    updated_name,
)
from onnxblocks._core.ort import onnxruntime
from onnxblocks.errors import PortabilityError
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.optimizer import portable_optimizer_model, read_optimizer

SHAPES = [(3, 4), (5,), (2, 3, 2), (1,)]
STEPS = 6
LRS = [1e-2, 2e-2, 5e-3, 1e-2, 3e-2, 1e-3]


def _params() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _gradients(step: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return [(scale * rng.standard_normal(s)).astype(np.float32) for s in SHAPES]


def _optimizer_model(block: onnxblocks.Block) -> onnx.ModelProto:
    trainable = [onnx.numpy_helper.from_array(p, f"p{i}") for i, p in enumerate(_params())]
    with onnxblocks.empty_base():
        block((trainable, []))
    return block.to_model_proto()  # type: ignore[attr-defined]


def _session(model: onnx.ModelProto):
    return onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _with_updated_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The training build's optimizer model, also returning the update node's updated sequences."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    (update,) = [n for n in out.graph.node if n.op_type in ("AdamWOptimizer", "SGDOptimizerV2")]
    names = [PARAMS, FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS][
        : 3 if update.op_type == "AdamWOptimizer" else 1
    ]
    update.output.extend(f"kernel.{n}" for n in names)
    out.graph.output.extend(
        helper.make_tensor_sequence_value_info(f"kernel.{n}", 1, None) for n in names
    )
    return out


def _run_training_build(
    model: onnx.ModelProto, adamw: bool, grad_scale: float
) -> list[list[np.ndarray]]:
    session = _session(_with_updated_outputs(model))
    params = _params()
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    history = []
    for step in range(STEPS):
        # the kernels update their inputs in place, and numpy inputs are not copied: feed copies
        feeds = _feeds(step, _copies(params), _copies(m1), _copies(m2), adamw, grad_scale)
        outputs = session.run(None, feeds)
        params = _copies(outputs[1])
        if adamw:
            m1, m2 = _copies(outputs[2]), _copies(outputs[3])
        history.append(params)
    return history


def _copies(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in arrays]


def _feeds(step: int, params: list, m1: list, m2: list, adamw: bool, grad_scale: float) -> dict:
    """The optimizer model's inputs at ``step`` (the second moments for AdamW only)."""
    feeds = {
        "learning_rate": np.array([LRS[step]], np.float32),
        "step": np.array([step + 1], np.int64),
        "params": params,
        "gradients": _gradients(step, grad_scale),
        "first_order_moments": m1,
    }
    if adamw:
        feeds["second_order_moments"] = m2
    return feeds


def _run_portable(model: onnx.ModelProto, adamw: bool, grad_scale: float) -> list[list[np.ndarray]]:
    portable = portable_optimizer_model(model, len(SHAPES))
    assert non_portable_ops(portable) == []
    session = _session(portable)
    names = [o.name for o in session.get_outputs()]
    assert (
        names
        == (
            [updated_name(n) for n in (PARAMS, FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS)][
                : 3 if adamw else 1
            ]
        )
    )
    params = _params()
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    history = []
    for step in range(STEPS):
        outputs = session.run(None, _feeds(step, params, m1, m2, adamw, grad_scale))
        params = outputs[0]
        if adamw:
            m1, m2 = outputs[1], outputs[2]
        history.append(params)
    return history


def _hf_adamw_step(
    p, g, m1, m2, lr, step, betas, eps, decay
):  # Hugging Face's AdamW, written in torch
    m1.mul_(betas[0]).add_(g, alpha=1 - betas[0])
    m2.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    step_size = lr * (1 - betas[1] ** step) ** 0.5 / (1 - betas[0] ** step)
    p.addcdiv_(m1, m2.sqrt().add_(eps), value=-step_size)
    p.add_(p, alpha=-lr * decay)


def _run_torch(
    kind: str, mode: str, decay: float, clip: float | None, grad_scale: float, dtype=torch.float32
) -> list[list[np.ndarray]]:
    params = [torch.from_numpy(p.copy()).to(dtype).requires_grad_() for p in _params()]
    betas, eps = (0.9, 0.999), 1e-8
    opt = None
    if kind == "sgd":
        opt = torch.optim.SGD(params, lr=LRS[0])
    elif mode == "torch":
        opt = torch.optim.AdamW(params, lr=LRS[0], betas=betas, eps=eps, weight_decay=decay)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    history = []
    for step in range(STEPS):
        for p, g in zip(params, _gradients(step, grad_scale), strict=True):
            p.grad = torch.from_numpy(g).to(dtype)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        if opt is not None:
            for group in opt.param_groups:
                group["lr"] = LRS[step]
            opt.step()
        else:
            with torch.no_grad():
                for p, (m1, m2) in zip(params, moments, strict=True):
                    _hf_adamw_step(p, p.grad, m1, m2, LRS[step], step + 1, betas, eps, decay)
        history.append([p.detach().numpy().copy() for p in params])
    return history


CASES = [
    ("adamw", "torch", 0.01, None),
    ("adamw", "torch", 0.0, None),
    ("adamw", "torch", 0.1, 0.5),
    ("adamw", "hf", 0.01, None),
    ("adamw", "hf", 0.0, 1.0),
    ("sgd", "", 0.0, None),
    ("sgd", "", 0.0, 0.3),
]


def _block(kind: str, mode: str, decay: float, clip: float | None) -> onnxblocks.Block:
    if kind == "sgd":
        return optim.SGD(clip_grad=clip)
    return optim.AdamW(weight_decay=decay, mode=mode, clip_grad=clip)


@pytest.mark.parametrize(("kind", "mode", "decay", "clip"), CASES, ids=str)
@pytest.mark.parametrize("grad_scale", [1.0, 1e-3], ids=["grads1", "grads1e-3"])
def test_portable_optimizer_equals_the_training_build(kind, mode, decay, clip, grad_scale):
    model = _optimizer_model(_block(kind, mode, decay, clip))
    expected = _run_training_build(model, kind == "adamw", grad_scale)
    got = _run_portable(model, kind == "adamw", grad_scale)
    # two float32 implementations: no float64 truth
    _compare(got, expected, None, rtol=1e-6)


def _compare(got, expected, expected64, rtol: float) -> None:
    """Each step's parameters; the floor is the reference's |previous value| + |update| of that step."""
    reference = expected64 if expected64 is not None else expected
    previous = _params()
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        e64 = expected64[step] if expected64 is not None else [None] * len(e)
        for i, (ep, gp, ep64) in enumerate(zip(e, g, e64, strict=True)):
            scale = np.abs(previous[i]) + np.abs(
                np.subtract(reference[step][i], previous[i], dtype=np.float64)
            )
            assert_close(gp, ep, ep64, rtol=rtol, scale=scale, name=f"step {step + 1}, param {i}")
        previous = reference[step]


def _torch_references(kind, mode, decay, clip) -> tuple[list, list]:
    """torch's parameter history in float32 and in float64."""
    return tuple(
        _run_torch(kind, mode, decay, clip, 1.0, dtype) for dtype in (torch.float32, torch.float64)
    )


@pytest.mark.parametrize(("kind", "mode", "decay", "clip"), CASES, ids=str)
def test_portable_optimizer_equals_torch(kind, mode, decay, clip):
    model = _optimizer_model(_block(kind, mode, decay, clip))
    expected, expected64 = _torch_references(kind, mode, decay, clip)
    got = _run_portable(model, kind == "adamw", 1.0)
    _compare(got, expected, expected64, rtol=1e-5)


def test_clipping_actually_clips_in_these_cases():
    norms = [np.sqrt(sum(float((g**2).sum()) for g in _gradients(s))) for s in range(STEPS)]
    assert min(norms) > 1.0  # every clipped case above scales its gradients


def test_read_optimizer_reads_the_block():
    spec = read_optimizer(
        _optimizer_model(optim.AdamW(betas=(0.8, 0.99), eps=1e-6, mode="hf", clip_grad=2.0))
    )
    assert (spec.kind, spec.max_norm) == ("adamw", 2.0)
    assert (
        spec.attributes["alpha"] == np.float32(0.8) and spec.attributes["adam_mode"] == 1
    )  # a float32 attribute
    assert read_optimizer(_optimizer_model(optim.SGD())).kind == "sgd"


def test_an_unknown_optimizer_model_is_refused_with_a_remedy():
    model = _optimizer_model(optim.SGD())
    model.graph.node.append(helper.make_node("Relu", ["learning_rate"], ["r"]))
    with pytest.raises(PortabilityError, match=r"onnxblocks\.optim .*portable=False"):
        portable_optimizer_model(model, len(SHAPES))


# ------------------------------------------------------------------ the multi-tensor (flat) layout
def _per_tensor_model(model: onnx.ModelProto, flat_limit: int) -> onnx.ModelProto:
    """``optimizer_model`` (one input and output per tensor) with ``flat_limit`` for the flat buffers."""
    import onnx_ir as ir

    from onnxblocks.portable import optimizer as portable_optimizer
    from onnxblocks.portable import updates

    params = [
        ir.Value(name=f"p{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(list(s)))
        for i, s in enumerate(SHAPES)
    ]
    saved = updates.FLAT_LIMIT
    updates.FLAT_LIMIT = flat_limit
    try:
        return portable_optimizer.optimizer_model(model, params)
    finally:
        updates.FLAT_LIMIT = saved


def _run_per_tensor(model: onnx.ModelProto, adamw: bool) -> list[list[np.ndarray]]:
    session = _session(model)
    params = _params()
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    history = []
    for step in range(STEPS):
        feeds = {
            "learning_rate": np.array([LRS[step]], np.float32),
            "step": np.array([step + 1], np.int64),
        }
        for i, g in enumerate(_gradients(step)):
            feeds |= {f"p{i}": params[i], f"p{i}_grad": g, f"p{i}.exp_avg": m1[i]}
            if adamw:
                feeds[f"p{i}.exp_avg_sq"] = m2[i]
        got = dict(
            zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True)
        )
        params = [got[f"p{i}.out"] for i in range(len(SHAPES))]
        if adamw:
            m1 = [got[f"p{i}.exp_avg.out"] for i in range(len(SHAPES))]
            m2 = [got[f"p{i}.exp_avg_sq.out"] for i in range(len(SHAPES))]
        history.append(params)
    return history


def _count(model: onnx.ModelProto, op: str) -> int:
    return sum(n.op_type == op for n in model.graph.node)


@pytest.mark.parametrize(("kind", "mode", "decay", "clip"), CASES, ids=str)
def test_flat_buffers_give_the_per_tensor_update_bit_for_bit(kind, mode, decay, clip):
    model = _optimizer_model(_block(kind, mode, decay, clip))
    flat, per_tensor = _per_tensor_model(model, 1 << 16), _per_tensor_model(model, 0)
    assert non_portable_ops(flat) == []
    # one update over the concatenated tensors instead of one per tensor
    one_per_update = (
        "Div" if kind == "adamw" else "Sub"
    )  # AdamW: m1 / (sqrt(m2) + eps); SGD: p - lr * g
    assert _count(per_tensor, one_per_update) - _count(flat, one_per_update) == len(SHAPES) - 1
    assert _count(flat, "Concat") == (4 if kind == "adamw" else 2)
    got, expected = (
        _run_per_tensor(flat, kind == "adamw"),
        _run_per_tensor(per_tensor, kind == "adamw"),
    )
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        for i, (ep, gp) in enumerate(zip(e, g, strict=True)):
            np.testing.assert_array_equal(gp, ep, err_msg=f"step {step + 1}, param {i}")
            assert gp.shape == SHAPES[i]
    _compare(got, *_torch_references(kind, mode, decay, clip), rtol=1e-5)


@pytest.mark.parametrize(("kind", "mode", "decay", "clip"), CASES, ids=str)
def test_optimizer_graphs_hold_no_unused_or_duplicate_constants(kind, mode, decay, clip):
    """Stock onnxruntime warns "Removing initializer ..." for a constant nothing reads or one it merges."""
    model = _optimizer_model(_block(kind, mode, decay, clip))
    for portable in (_per_tensor_model(model, 1 << 16), _per_tensor_model(model, 0)):
        read = {i for n in portable.graph.node for i in n.input}
        constants = [n for n in portable.graph.node if n.op_type == "Constant"]
        assert [n.output[0] for n in constants if n.output[0] not in read] == []
        scalars = [onnx.numpy_helper.to_array(n.attribute[0].t) for n in constants]
        scalars = [(a.dtype.str, a.tobytes()) for a in scalars if a.ndim == 0]
        assert len(scalars) == len(set(scalars))

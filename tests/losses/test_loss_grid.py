"""Every built-in loss, option, score dtype and label layout trains on both backends, or is refused at generation.

One cell is one loss configuration on a one-matrix model (``x @ W``, cast to the
score dtype; float64 cells multiply in float64): scores in float32, float64, float16 or bfloat16; class-index labels
in int64 or int32, batched ``[N, C]``, ``[N, C, d]``, class-last ``[N, T, C]`` or
unbatched ``[C]``, with ``ignore_index``, ``weight``, ``label_smoothing`` and
every reduction (``"none"`` is summed, so that it is a trainable scalar). Each
cell's artifacts are generated once per backend:

* the training build's artifacts train here (Python 3.11, onnxruntime-training 1.19.2), and so do the
  portable artifacts, on that build's inference kernels;
* the portable artifacts train on stock onnxruntime in the Python 3.13 worker
  (``support/loss_grid_worker.py``; every cell in one worker run), by ``train_step``
  and by the fused step model.

Both give torch's loss and gradient of ``W`` by support.numerics' rule (float64 cells:
within 1e-12 of torch's float64 loss, and the gradient within one float32 rounding of
torch's float64 gradient), or generation raises an ``OnnxBlocksError`` naming the op and the dtype
(bfloat16: ONNX Runtime has no bfloat16 CPU kernels for the ops of any loss).
Every label ignored under ``"mean"`` gives NaN with a zero gradient, as torch.

The grid covers each option in each dtype and layout, with reductions and label
dtypes rotated over the cells rather than fully crossed (one generation per cell).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.loss_grid import run_grid_worker
from support.loss_reference import class_denominator, class_operand, loss_scale
from support.numerics import assert_close, assert_equal

import onnxblocks
from onnxblocks import losses
from onnxblocks.artifacts import OptimType
from onnxblocks.blocks.block import Block
from onnxblocks.errors import OnnxBlocksError
from onnxblocks.losses._base import reduce_all
from onnxblocks.runtime import TrainingSession

pytestmark = pytest.mark.filterwarnings(
    "ignore:reduction. 'mean' divides the total loss:UserWarning"
)

C, F, N, D = 5, 3, 4, 3  # classes, features, batch, extra dim (d or T)
IGNORE = -100
WEIGHT = [0.5, 2.0, 1.0, 3.0, 0.25]
DTYPES = {
    "float32": (TensorProto.FLOAT, torch.float32),
    "float64": (TensorProto.DOUBLE, torch.float64),
    "float16": (TensorProto.FLOAT16, torch.float16),
    "bfloat16": (TensorProto.BFLOAT16, torch.bfloat16),
}
#: (loss rtol, gradient rtol) against torch in the score dtype, by score dtype (support.numerics adds the
#: float64 reference's rule and the floor). float64 cells are held to float64 instead (FLOAT64_RTOL).
TOLERANCES = {"float32": (1e-5, 1e-4), "float16": (1e-2, 3e-2)}
#: a float64 loss is within this of torch's float64 loss (plus the float64 floor), on every backend
FLOAT64_RTOL = 1e-12
#: a float64 cell's float32 gradient of W: the float64 gradient (within FLOAT64_RTOL) rounded to float32 once
FLOAT64_GRAD_RTOL = 2.0**-24 + FLOAT64_RTOL
REFUSED_DTYPES = {"bfloat16"}
LAYOUTS = ("NC", "NCd", "last", "unbatched")
REDUCTIONS = ("mean", "sum", "none")
CLASS_OPTIONS: tuple[dict[str, Any], ...] = (
    {},
    {"ignore_index": IGNORE},
    {"weight": WEIGHT},
    {"label_smoothing": 0.1},
    {"weight": WEIGHT, "ignore_index": IGNORE, "label_smoothing": 0.2},
)
POINTWISE: tuple[tuple[str, dict[str, Any]], ...] = (
    ("MSELoss", {}),
    ("L1Loss", {}),
    ("HuberLoss", {"delta": 0.5}),
    ("SmoothL1Loss", {"beta": 0.5}),
    ("BCEWithLogitsLoss", {}),
    ("BCEWithLogitsLoss", {"weight": WEIGHT, "pos_weight": [2.0, 1.0, 0.5, 1.5, 3.0]}),
    ("KLDivLoss", {}),
    ("KLDivLoss", {"log_target": True}),
)


@dataclass(frozen=True)
class Cell:
    """One loss configuration."""

    loss: str
    dtype: str
    reduction: str
    layout: str = "NC"
    labels: str = "int64"  # class losses: int64 / int32; others: "target"
    options: dict = field(default_factory=dict, hash=False)
    all_ignored: bool = False

    @property
    def id(self) -> str:
        opts = ",".join(f"{k}={'w' if isinstance(v, list) else v}" for k, v in self.options.items())
        extra = "-all_ignored" if self.all_ignored else ""
        return (
            f"{self.loss}[{opts}]-{self.dtype}-{self.layout}-{self.labels}-{self.reduction}{extra}"
        )

    @property
    def classes(self) -> bool:
        return self.loss in ("CrossEntropyLoss", "NLLLoss")


def _cells() -> list[Cell]:
    cells = []
    for (d, dtype), (k, layout) in itertools.product(enumerate(DTYPES), enumerate(LAYOUTS)):
        for name in ("CrossEntropyLoss", "NLLLoss"):
            for i, options in enumerate(CLASS_OPTIONS):
                if name == "NLLLoss" and "label_smoothing" in options:
                    options = {k: v for k, v in options.items() if k != "label_smoothing"}
                    if not options:
                        continue
                reduction = REDUCTIONS[(i + k + d) % 3]
                labels = ("int64", "int32")[(i + k + d) % 2]
                cells.append(Cell(name, dtype, reduction, layout, labels, options))
        for name in (
            "CrossEntropyLoss",
            "NLLLoss",
        ):  # every label ignored, "mean": NaN, zero gradient
            cells.append(
                Cell(
                    name, dtype, "mean", layout, "int64", {"ignore_index": IGNORE}, all_ignored=True
                )
            )
    for (d, dtype), (i, (name, options)) in itertools.product(
        enumerate(DTYPES), enumerate(POINTWISE)
    ):
        for reduction in REDUCTIONS if dtype == "float32" else (REDUCTIONS[(i + d) % 3],):
            cells.append(Cell(name, dtype, reduction, "NC", "target", options))
    cells.append(Cell("KLDivLoss", "float32", "batchmean", "NC", "target", {}))
    cells.append(Cell("KLDivLoss", "float64", "batchmean", "NC", "target", {"log_target": True}))
    return cells


CELLS = _cells()


# ------------------------------------------------------------------ the model, the data, torch
def _shapes(layout: str) -> tuple[list, list[int]]:
    """``(x shape, labels shape)`` of a layout (with a symbolic batch where there is one)."""
    return {
        "NC": (["N", F], [N]),
        "NCd": (["N", D, F], [N, D]),
        "last": (["N", D, F], [N, D]),
        "unbatched": ([F], []),
    }[layout]


def _model(cell: Cell):
    """``x @ W`` cast to the score dtype; float64 cells cast ``x`` and ``W`` first and multiply in float64.

    A float32 product cast to float64 would carry float32 rounding into the float64 loss, rounding that ONNX
    Runtime's kernel and torch's do differently (one ulp of a score is 2.4e-7 absolute): the loss would be
    compared with torch at float32 precision, not at float64's. ``W`` stays float32 (the training build
    accumulates float32 gradients only), so its gradient is the float64 gradient rounded once, by Cast's.
    """
    elem = DTYPES[cell.dtype][0]
    x_shape, _ = _shapes(cell.layout)
    w = numpy_helper.from_array(_weights(), "W")
    if elem == TensorProto.DOUBLE:
        nodes = [
            helper.make_node("Cast", ["x"], ["x64"], to=elem),
            helper.make_node("Cast", ["W"], ["W64"], to=elem),
            helper.make_node("MatMul", ["x64", "W64"], ["z"]),
        ]
    else:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["z"])]
    last = "z"
    if cell.layout == "NCd":
        nodes.append(helper.make_node("Transpose", ["z"], ["zt"], perm=[0, 2, 1]))
        last = "zt"
    if elem not in (TensorProto.FLOAT, TensorProto.DOUBLE):
        nodes.append(helper.make_node("Cast", [last], ["scores"], to=elem))
    else:
        nodes.append(helper.make_node("Identity", [last], ["scores"]))
    out_shape = {"NC": ["N", C], "NCd": ["N", C, D], "last": ["N", D, C], "unbatched": [C]}[
        cell.layout
    ]
    graph = helper.make_graph(
        nodes,
        "grid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("scores", elem, out_shape)],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights() -> np.ndarray:
    """The model's ``W`` (float32, as the model stores it)."""
    return np.random.default_rng(0).standard_normal((F, C)).astype(np.float32)


class GridLoss(Block):
    """The cell's loss; int32 labels as a graph input of that type; ``"none"`` summed into a scalar."""

    def __init__(self, cell: Cell) -> None:
        super().__init__()
        self.cell = cell

    def build(self, scores: str):
        cell, acc = self.cell, self.accessor
        options = dict(cell.options)
        if cell.classes:
            if cell.layout == "last":
                options["class_axis"] = -1
            if cell.labels == "int32":
                dims = {"NC": ["N"], "NCd": ["N", D], "last": ["N", D], "unbatched": []}[
                    cell.layout
                ]
                acc.add_input("labels", TensorProto.INT32, dims)
            value = getattr(losses, cell.loss)(reduction=cell.reduction, **options)(
                scores, "labels"
            )
        else:
            value = getattr(losses, cell.loss)(reduction=cell.reduction, **options)(
                scores, "target"
            )
        if cell.reduction == "none":
            value = reduce_all(acc, "ReduceSum", value)
        return value


def _data(cell: Cell) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(cell.id.encode()))
    x_shape, label_shape = _shapes(cell.layout)
    x = rng.standard_normal([N if d == "N" else d for d in x_shape]).astype(np.float32)
    if cell.classes:
        labels = rng.integers(0, C, size=label_shape).astype(np.int64)
        if "ignore_index" in cell.options:
            labels = (
                np.where(rng.random(label_shape) < 0.3, IGNORE, labels) if label_shape else labels
            )
            if cell.all_ignored:
                labels = np.full(label_shape, IGNORE, np.int64)
            elif label_shape:
                labels.reshape(-1)[0] = IGNORE  # at least one ignored
        return [x, labels.astype(np.int32 if cell.labels == "int32" else np.int64)]
    score_shape = {"NC": (N, C)}[cell.layout]
    target = rng.random(score_shape) if cell.loss != "KLDivLoss" else rng.dirichlet(np.ones(C), N)
    if cell.options.get("log_target"):
        target = np.log(target)
    np_dtype = (
        helper.tensor_dtype_to_np_dtype(DTYPES[cell.dtype][0])
        if cell.dtype != "bfloat16"
        else np.float32
    )
    return [x, target.astype(np_dtype)]


@dataclass(frozen=True)
class Reference:
    """torch's loss (``"none"`` summed) and gradient of ``W``, each in the dtype torch gives it."""

    loss: np.ndarray
    grad: np.ndarray
    #: the magnitude of the loss's operands (:func:`_loss_scale`), for the comparison's floor
    scale: float


def _torch(cell: Cell, inputs: list[np.ndarray], *, float64: bool = False) -> Reference:
    """torch's loss and gradient of ``W``: as the cell's model computes them, or everything in float64.

    As the model: ``W`` is a float32 leaf, ``x @ W`` is float32 (float64 in float64 cells) and is cast to the
    score dtype. With ``float64``, ``W`` is a float64 leaf and every step is float64: the float64 reference.
    """
    dtype = torch.float64 if float64 else DTYPES[cell.dtype][1]
    weights = _weights().astype(np.float64) if float64 else _weights()
    w = torch.tensor(weights, requires_grad=True)
    x = torch.from_numpy(inputs[0])
    z = x.double() @ w.double() if float64 or cell.dtype == "float64" else x @ w
    if cell.layout == "NCd":
        z = z.permute(0, 2, 1)
    scores = z.to(dtype)
    options = dict(cell.options)
    if cell.classes:
        if cell.layout == "last":
            scores = scores.permute(0, 2, 1)
        if "weight" in options:
            options["weight"] = torch.tensor(options["weight"], dtype=dtype)
        options.setdefault("ignore_index", IGNORE)
        labels = torch.from_numpy(inputs[1].astype(np.int64))
        fn = (
            torch.nn.functional.cross_entropy
            if cell.loss == "CrossEntropyLoss"
            else torch.nn.functional.nll_loss
        )

        def loss_of(reduction: str) -> torch.Tensor:
            return fn(scores, labels, reduction=reduction, **options)

        target = None
    else:
        target = torch.from_numpy(inputs[1]).to(dtype)
        for key in ("weight", "pos_weight"):
            if key in options:
                options[key] = torch.tensor(options[key], dtype=dtype)

        def loss_of(reduction: str) -> torch.Tensor:
            return getattr(torch.nn, cell.loss)(reduction=reduction, **options)(scores, target)

    loss = loss_of(cell.reduction)
    if cell.reduction == "none":
        loss = loss.sum()
    loss.backward()
    with torch.no_grad():
        scale = _loss_scale(
            cell, inputs, loss_of("none").detach().double(), scores.detach().double(), target
        )
    return Reference(loss.detach().numpy(), w.grad.numpy(), scale)


def _loss_scale(cell: Cell, inputs: list[np.ndarray], each: torch.Tensor, scores, target) -> float:
    """The magnitude of the loss's operands (support.loss_reference), for the comparison's floor."""
    options = cell.options
    each64 = each.numpy()
    if cell.classes:
        operand = class_operand(scores.numpy(), C, options.get("weight"))
        denominator = class_denominator(inputs[1], options.get("weight"), IGNORE)
    else:
        weight = max(options.get("weight", [1.0])) * max(1.0, *options.get("pos_weight", [1.0]))
        operand = weight * (float(scores.abs().max()) + float(target.abs().max()))
        denominator = N if cell.reduction == "batchmean" else each64.size
    reduction = "sum" if cell.reduction == "none" else cell.reduction  # "none" cells are summed
    return float(loss_scale(each64, reduction, operand, denominator))


# ------------------------------------------------------------------ running the grid
@dataclass
class Outcome:
    refused: str | None = None
    expected: Reference | None = None
    expected64: Reference | None = None
    training: tuple[np.ndarray, np.ndarray] | None = None
    portable_here: tuple[np.ndarray, np.ndarray] | None = None
    portable: dict | None = None


def _generate(cell: Cell, directory: Path, portable: bool) -> None:
    onnxblocks.generate_artifacts(
        _model(cell),
        requires_grad=["W"],
        loss=GridLoss(cell),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=portable,
    )


@pytest.fixture(scope="module")
def grid(request, tmp_path_factory, portable_python) -> dict[str, Outcome]:
    """Every selected cell: generated, trained here, then (one worker run) on stock onnxruntime."""
    root = tmp_path_factory.mktemp("loss_grid")
    selected = {
        item.callspec.params["cell"].id
        for item in request.session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("cell"), Cell)
    }
    outcomes: dict[str, Outcome] = {}
    tasks = []
    for n, cell in enumerate(c for c in CELLS if c.id in selected):
        outcome = outcomes[cell.id] = Outcome()
        inputs = _data(cell)
        try:
            _generate(cell, root / f"{n}-training", portable=False)
            _generate(cell, root / f"{n}-portable", portable=True)
        except OnnxBlocksError as exc:
            outcome.refused = f"{type(exc).__name__}: {exc}"
            continue
        outcome.expected = _torch(cell, inputs)
        outcome.expected64 = _torch(cell, inputs, float64=True)
        session = TrainingSession(root / f"{n}-training")
        loss = session.train_step(*inputs)[0]
        outcome.training = (np.asarray(loss), session.gradients()["W"])
        session = TrainingSession(
            root / f"{n}-portable"
        )  # on the training build's inference kernels
        loss = session.train_step(*inputs)[0]
        outcome.portable_here = (np.asarray(loss), session.gradients()["W"])
        np.savez(root / f"{n}.npz", **{f"x{i}": a for i, a in enumerate(inputs)})
        tasks.append(
            {
                "id": cell.id,
                "directory": str(root / f"{n}-portable"),
                "data": str(root / f"{n}.npz"),
            }
        )
    answer = run_grid_worker(portable_python, {"cells": tasks})
    for cell_id, result in answer["cells"].items():
        outcomes[cell_id].portable = result
    return outcomes


def _check(cell: Cell, outcome: Outcome, backend: str, loss: Any, grad: Any) -> None:
    """The backend's loss and gradient of ``W`` against torch's, by support.numerics' rule.

    float64 cells: the loss within FLOAT64_RTOL of torch's float64 loss (plus the float64 floor from the
    operands), and the float32 gradient of ``W`` within one rounding to float32 of torch's float64 gradient,
    so a float32 step anywhere in the float64 gradient path shows (it moves elements past that rounding:
    ReduceMean's float32 1/N did, by up to 0.75 ulp). Other dtypes: within the dtype's rtol of torch in that
    dtype, or within the rounding torch's own result has against its float64 twin.
    """
    assert outcome.expected is not None and outcome.expected64 is not None
    want, want64 = outcome.expected, outcome.expected64
    if cell.dtype == "float64":
        assert_close(
            np.asarray(loss, np.float64),
            want64.loss,
            rtol=FLOAT64_RTOL,
            scale=want64.scale,
            name=f"loss, {backend}",
        )
        if grad is not None:
            got = np.asarray(
                grad, np.float64
            )  # exactly the float32 values, compared at float64's floor
            assert_close(got, want64.grad, rtol=FLOAT64_GRAD_RTOL, name=f"gradient of W, {backend}")
        return
    loss_rtol, grad_rtol = TOLERANCES[cell.dtype]
    assert_close(
        loss, want.loss, want64.loss, rtol=loss_rtol, scale=want64.scale, name=f"loss, {backend}"
    )
    if grad is not None:
        # computed from the scores' gradient, in the score dtype, and returned in W's float32: compared as such
        score_dtype = np.float16 if cell.dtype == "float16" else np.float32
        got, expected = np.asarray(grad).astype(score_dtype), want.grad.astype(score_dtype)
        assert_close(got, expected, want64.grad, rtol=grad_rtol, name=f"gradient of W, {backend}")


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_loss_cell_trains_on_both_backends_or_is_refused_at_generation(grid, cell):
    outcome = grid[cell.id]
    if cell.dtype in REFUSED_DTYPES:
        assert outcome.refused is not None, "bfloat16 generation should be refused (no CPU kernels)"
        assert cell.dtype in outcome.refused, outcome.refused
        return
    assert outcome.refused is None, outcome.refused
    assert (
        outcome.expected is not None
        and outcome.training is not None
        and outcome.portable is not None
    )
    assert outcome.portable_here is not None
    assert "error" not in outcome.portable, outcome.portable.get("trace", outcome.portable)
    assert outcome.portable["backend"] == "portable"
    if cell.all_ignored:
        assert np.isnan(outcome.expected.loss)
        assert_equal(
            outcome.expected.grad, np.zeros_like(outcome.expected.grad), name="torch's gradient"
        )
    portable_loss = np.float64(outcome.portable["loss"])  # JSON carries every float64 digit
    for backend, loss, grad in (
        ("training build", outcome.training[0], outcome.training[1]),
        (
            "portable, onnxruntime-training 1.19.2",
            outcome.portable_here[0],
            outcome.portable_here[1],
        ),
        ("stock onnxruntime (portable)", portable_loss, outcome.portable["gradients"]["W"]),
        ("stock onnxruntime (fused step)", np.float64(outcome.portable["fused_loss"]), None),
    ):
        _check(cell, outcome, backend, loss, grad)

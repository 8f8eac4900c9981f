"""The loss library against torch.nn: values for every option, gradients through ORT, and errors."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.onnx_models import run_model

import onnxblocks
from onnxblocks import losses
from onnxblocks.errors import UnknownNameError

pytestmark = pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss:UserWarning")

RNG_SEED = 1234
RTOL, ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
C = 5  # classes
CLASS_WEIGHT = [0.5, 2.0, 1.0, 3.0, 0.25]


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    """One loss configuration, its torch twin, and the data it is fed."""

    id: str
    make: Any  # () -> onnxblocks loss
    torch_loss: Any  # () -> torch.nn loss
    kind: str  # "regression" | "probability" | "log_prob" | "classes"
    shape: tuple[int, ...] = (4, C)
    class_axis: int = 1
    options: dict = field(default_factory=dict)


def _opts_id(name: str, opts: dict) -> str:
    return name + "[" + ",".join(f"{k}={'w' if isinstance(v, list) else v}" for k, v in opts.items()) + "]"


def _cases() -> list[Case]:
    cases = []
    reductions = ("mean", "sum", "none")
    for reduction in reductions:
        for name, kw in [("MSELoss", {}), ("L1Loss", {})]:
            opts = {"reduction": reduction, **kw}
            cases.append(
                Case(
                    _opts_id(name, opts),
                    lambda n=name, o=opts: getattr(losses, n)(**o),
                    lambda n=name, o=opts: getattr(torch.nn, n)(**o),
                    "regression",
                    (4, 3, 2),
                )
            )
        for delta in (1.0, 0.5, 2.0):
            opts = {"reduction": reduction, "delta": delta}
            cases.append(
                Case(
                    _opts_id("HuberLoss", opts),
                    lambda o=opts: losses.HuberLoss(**o),
                    lambda o=opts: torch.nn.HuberLoss(**o),
                    "regression",
                    (4, 3, 2),
                )
            )
        for beta in (1.0, 0.3, 0.0):
            opts = {"reduction": reduction, "beta": beta}
            cases.append(
                Case(
                    _opts_id("SmoothL1Loss", opts),
                    lambda o=opts: losses.SmoothL1Loss(**o),
                    lambda o=opts: torch.nn.SmoothL1Loss(**o),
                    "regression",
                    (4, 3, 2),
                )
            )
        for weight, pos_weight in itertools.product((None, CLASS_WEIGHT), (None, [1.5, 0.5, 3.0, 1.0, 2.0])):
            opts = {"reduction": reduction, "weight": weight, "pos_weight": pos_weight}
            cases.append(
                Case(
                    _opts_id("BCEWithLogitsLoss", opts),
                    lambda o=opts: losses.BCEWithLogitsLoss(**o),
                    lambda o=opts: torch.nn.BCEWithLogitsLoss(
                        **{k: v if k == "reduction" else _tensor_or_none(v) for k, v in o.items()}
                    ),
                    "probability",
                    (3, 2, C),
                )
            )
    for reduction, log_target in itertools.product(("mean", "sum", "none", "batchmean"), (False, True)):
        opts = {"reduction": reduction, "log_target": log_target}
        cases.append(
            Case(
                _opts_id("KLDivLoss", opts),
                lambda o=opts: losses.KLDivLoss(**o),
                lambda o=opts: torch.nn.KLDivLoss(**o),
                "log_prob",
                (4, C),
            )
        )
    layouts = [("NC", (6, C), 1), ("NCd1d2", (3, C, 2, 3), 1), ("BTV", (2, 3, C), -1)]
    for (layout, shape, axis), reduction, weight, ignore_index in itertools.product(
        layouts, reductions, (None, CLASS_WEIGHT), (None, 1)
    ):
        for smoothing in (0.0, 0.2):
            opts = {
                "reduction": reduction,
                "weight": weight,
                "ignore_index": ignore_index,
                "label_smoothing": smoothing,
            }
            torch_opts = {
                **opts,
                "ignore_index": -100 if ignore_index is None else ignore_index,
                "weight": _tensor_or_none(weight),
            }
            cases.append(
                Case(
                    _opts_id(f"CrossEntropyLoss-{layout}", opts),
                    lambda o=opts, a=axis: losses.CrossEntropyLoss(**o, class_axis=a),
                    lambda o=torch_opts: torch.nn.CrossEntropyLoss(**o),
                    "classes",
                    shape,
                    axis,
                )
            )
        opts = {"reduction": reduction, "weight": weight, "ignore_index": ignore_index}
        torch_opts = {
            **opts,
            "ignore_index": -100 if ignore_index is None else ignore_index,
            "weight": _tensor_or_none(weight),
        }
        cases.append(
            Case(
                _opts_id(f"NLLLoss-{layout}", opts),
                lambda o=opts, a=axis: losses.NLLLoss(**o, class_axis=a),
                lambda o=torch_opts: torch.nn.NLLLoss(**o),
                "classes_log_prob",
                shape,
                axis,
            )
        )
    return cases


def _tensor_or_none(values: Any) -> torch.Tensor | None:
    return None if values is None else torch.tensor(values, dtype=torch.float32)


CASES = _cases()


# ------------------------------------------------------------------ helpers
def _data(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(input, target or labels) for a case, as numpy."""
    x = rng.standard_normal(case.shape).astype(np.float32) * 2
    if case.kind == "regression":
        return x, rng.standard_normal(case.shape).astype(np.float32) * 2
    if case.kind == "probability":
        target = rng.uniform(0, 1, case.shape).astype(np.float32)
        target.flat[::3] = 0.0
        return x, target
    if case.kind == "log_prob":
        log_q = torch.log_softmax(torch.from_numpy(x), -1).numpy()
        p = rng.uniform(0, 1, case.shape).astype(np.float32)
        p.flat[::4] = 0.0  # zeros exercise the 0 * log(0) = 0 convention
        p /= p.sum(-1, keepdims=True)
        if case.options.get("log_target") or "log_target=True" in case.id:
            p = np.log(p + 0.1).astype(np.float32)
        return log_q, p
    axis = case.class_axis % len(case.shape)
    labels_shape = case.shape[:axis] + case.shape[axis + 1 :]
    labels = rng.integers(0, case.shape[axis], labels_shape).astype(np.int64)
    labels.flat[0] = 1  # at least one label hits ignore_index=1
    if case.kind == "classes_log_prob":
        x = torch.log_softmax(torch.from_numpy(x), axis).numpy()
    return x, labels


def _torch_value(case: Case, x: np.ndarray, target: np.ndarray) -> np.ndarray:
    tx, tt = torch.from_numpy(x), torch.from_numpy(target)
    if case.class_axis == -1:  # torch wants the classes on axis 1
        tx = tx.movedim(-1, 1)
    return case.torch_loss()(tx, tt).numpy()


def _build(loss: Any, shape: tuple, input_name: str = "x") -> tuple[onnx.ModelProto, str]:
    """A model whose input ``x`` goes through ``loss``; the loss is the only output."""
    with onnxblocks.empty_base() as acc:
        acc.add_input(input_name, TensorProto.FLOAT, list(shape))
        out = loss(input_name)
        acc.set_outputs([out])
    return acc.finish(), out


def _target_name(case: Case) -> str:
    return "labels" if case.kind.startswith("classes") else "target"


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_loss_matches_torch(case: Case) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x, target = _data(case, rng)
    model, _ = _build(case.make(), case.shape)
    (got,) = run_model(model, {"x": x, _target_name(case): target})
    expected = _torch_value(case, x, target)
    assert got.shape == expected.shape
    if "reduction=none" not in case.id:
        assert got.shape == ()
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weight", [None, CLASS_WEIGHT])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("layout", [((6, C), 1), ((2, 3, C), -1)])
def test_cross_entropy_probability_labels(reduction, weight, smoothing, layout) -> None:
    """An existing float value shaped like the logits holds class probabilities (torch's soft targets)."""
    shape, axis = layout
    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal(shape).astype(np.float32)
    p = rng.uniform(0, 1, shape).astype(np.float32)
    p /= p.sum(axis, keepdims=True)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, list(shape))
        acc.add_input("probs", TensorProto.FLOAT, list(shape))
        out = losses.CrossEntropyLoss(weight=weight, reduction=reduction, label_smoothing=smoothing, class_axis=axis)(
            "x", "probs"
        )
        acc.set_outputs([out])
    (got,) = run_model(acc.finish(), {"x": x, "probs": p})
    tx, tp = torch.from_numpy(x), torch.from_numpy(p)
    if axis == -1:
        tx, tp = tx.movedim(-1, 1), tp.movedim(-1, 1)
    expected = torch.nn.CrossEntropyLoss(
        weight=_tensor_or_none(weight), reduction=reduction, label_smoothing=smoothing
    )(tx, tp).numpy()
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_cross_entropy_symbolic_class_dim_and_middle_axis() -> None:
    """A symbolic class dim (number of classes computed at run time) and a class axis in the middle."""
    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal((2, 3, C, 4)).astype(np.float32)
    labels = rng.integers(0, C, (2, 3, 4)).astype(np.int64)
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, ["B", "T", "V", 4])
        out = losses.CrossEntropyLoss(label_smoothing=0.1, class_axis=2)("x")
        acc.set_outputs([out])
        assert acc.shape_of("labels") == ["B", "T", 4]
    (got,) = run_model(acc.finish(), {"x": x, "labels": labels})
    expected = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(
        torch.from_numpy(x).movedim(2, 1), torch.from_numpy(labels)
    )
    np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL)


def test_cross_entropy_unbatched_scores() -> None:
    """1-D scores ``[C]`` with a scalar label, as torch."""
    x = np.random.default_rng(RNG_SEED).standard_normal(C).astype(np.float32)
    model, _ = _build(losses.CrossEntropyLoss(label_smoothing=0.1), (C,))
    (got,) = run_model(model, {"x": x, "labels": np.array(3, dtype=np.int64)})
    expected = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(torch.from_numpy(x), torch.tensor(3))
    np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL)


SYMBOLIC_CASES = [
    (
        "KLDiv-batchmean",
        lambda: losses.KLDivLoss(reduction="batchmean"),
        lambda: torch.nn.KLDivLoss(reduction="batchmean"),
        "log_prob",
        1,
    ),
    (
        "CE-fused-class-last",
        lambda: losses.CrossEntropyLoss(class_axis=-1, reduction="none"),
        lambda: torch.nn.CrossEntropyLoss(reduction="none"),
        "classes",
        -1,
    ),
    (
        "CE-smoothing-class-last",
        lambda: losses.CrossEntropyLoss(weight=CLASS_WEIGHT, ignore_index=1, label_smoothing=0.1, class_axis=-1),
        lambda: torch.nn.CrossEntropyLoss(weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1, label_smoothing=0.1),
        "classes",
        -1,
    ),
    ("NLL", lambda: losses.NLLLoss(ignore_index=1), lambda: torch.nn.NLLLoss(ignore_index=1), "classes_log_prob", 1),
]


@pytest.mark.parametrize("rank_known", [True, False], ids=["symbolic-dims", "unknown-rank"])
@pytest.mark.parametrize(
    ("make", "torch_make", "kind", "axis"), [c[1:] for c in SYMBOLIC_CASES], ids=[c[0] for c in SYMBOLIC_CASES]
)
def test_symbolic_and_unknown_shapes(make, torch_make, kind, axis, rank_known) -> None:
    """Sizes known only at run time (batch, classes, even the rank of the scores) are computed in the graph."""
    shape = (2, 3, C) if axis == -1 else (4, C)
    case = Case("symbolic", make, torch_make, kind, shape, axis)
    x, target = _data(case, np.random.default_rng(RNG_SEED))
    name = _target_name(case)
    feeds = {"x": x, name: target}
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, ["d0", "d1", "d2"][: len(shape)])
        scores = "x"
        if not rank_known:  # Reshape to a shape given at run time: inference cannot know the rank
            acc.add_input("new_shape", TensorProto.INT64, ["rank"])
            scores = acc.op("Reshape", ["x", "new_shape"])
            assert acc.shape_of(scores) is None
            elem = TensorProto.FLOAT if name == "target" else TensorProto.INT64
            acc.add_input(name, elem, ["t0", "t1", "t2"][: target.ndim])
            feeds["new_shape"] = np.array(shape, dtype=np.int64)
        out = make()(scores)
        acc.set_outputs([out])
    (got,) = run_model(acc.finish(), feeds)
    np.testing.assert_allclose(got, _torch_value(case, x, target), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("loss_cls", [losses.MSELoss, losses.CrossEntropyLoss])
def test_cannot_derive_target_of_unknown_rank(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [4, C])
        acc.add_input("new_shape", TensorProto.INT64, ["rank"])
        scores = acc.op("Reshape", ["x", "new_shape"])
        with pytest.raises(ValueError, match=r"cannot create the (target|labels) input.*rank .*unknown.*add_input"):
            loss_cls()(scores)


DOUBLE_CASES = [
    (
        "BCEWithLogitsLoss",
        lambda: losses.BCEWithLogitsLoss(pos_weight=[2.0] * C),
        lambda: torch.nn.BCEWithLogitsLoss(pos_weight=torch.full((C,), 2.0, dtype=torch.float64)),
        "probability",
    ),
    ("HuberLoss", lambda: losses.HuberLoss(delta=0.5), lambda: torch.nn.HuberLoss(delta=0.5), "regression"),
    (
        "KLDivLoss",
        lambda: losses.KLDivLoss(reduction="batchmean"),
        lambda: torch.nn.KLDivLoss(reduction="batchmean"),
        "log_prob",
    ),
    (
        "CrossEntropyLoss",
        lambda: losses.CrossEntropyLoss(weight=CLASS_WEIGHT, label_smoothing=0.1),
        lambda: torch.nn.CrossEntropyLoss(weight=torch.tensor(CLASS_WEIGHT, dtype=torch.float64), label_smoothing=0.1),
        "classes",
    ),
]


@pytest.mark.parametrize(
    ("make", "torch_make", "kind"), [c[1:] for c in DOUBLE_CASES], ids=[c[0] for c in DOUBLE_CASES]
)
def test_double_precision(make, torch_make, kind) -> None:
    """Constants (weights, 0.5, 1 ...) take the input's dtype, so float64 models stay float64."""
    case = Case("double", make, torch_make, kind, (4, C))
    x, target = _data(case, np.random.default_rng(RNG_SEED))
    x = x.astype(np.float64)
    target = target.astype(np.float64) if target.dtype == np.float32 else target
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.DOUBLE, [4, C])
        out = make()("x")
        acc.set_outputs([out])
        assert acc.elem_type(out) == TensorProto.DOUBLE
    (got,) = run_model(acc.finish(), {"x": x, _target_name(case): target})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _torch_value(case, x, target), rtol=1e-12, atol=1e-12)


def test_weighted_sum_of_two_losses_in_one_line() -> None:
    rng = np.random.default_rng(RNG_SEED)
    a, b, t1, t2 = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4))
    with onnxblocks.empty_base() as acc:
        acc.add_input("a", TensorProto.FLOAT, ["N", 3])
        acc.add_input("b", TensorProto.FLOAT, ["N", 3])
        total = 0.4 * losses.MSELoss()("a", "t1") + 0.6 * losses.L1Loss()("b", "t2")
        acc.set_outputs([total])
    (got,) = run_model(acc.finish(), {"a": a, "b": b, "t1": t1, "t2": t2})
    expected = 0.4 * np.mean((a - t1) ** 2) + 0.6 * np.mean(np.abs(b - t2))
    assert got.shape == ()
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ inputs
TARGET_LOSSES = [
    losses.MSELoss,
    losses.L1Loss,
    losses.HuberLoss,
    losses.SmoothL1Loss,
    losses.BCEWithLogitsLoss,
    losses.KLDivLoss,
]
CLASS_LOSSES = [losses.CrossEntropyLoss, losses.NLLLoss]


def _graph_input(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    return next(i for i in model.graph.input if i.name == name)


def _dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("loss_cls", TARGET_LOSSES)
def test_default_target_input(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.DOUBLE, ["batch", 3])
        loss_cls()("y")
    target = _graph_input(acc.model, "target")
    assert target.type.tensor_type.elem_type == TensorProto.DOUBLE
    assert _dims(target) == ["batch", 3]


@pytest.mark.parametrize("loss_cls", CLASS_LOSSES)
@pytest.mark.parametrize(
    ("shape", "axis", "labels_shape"),
    [
        (["N", C], 1, ["N"]),
        (["N", C, "H", 7], 1, ["N", "H", 7]),
        (["B", "T", 50], -1, ["B", "T"]),
    ],
)
def test_default_labels_input(loss_cls, shape, axis, labels_shape) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, shape)
        loss_cls(class_axis=axis)("y")
    labels = _graph_input(acc.model, "labels")
    assert labels.type.tensor_type.elem_type == TensorProto.INT64
    assert _dims(labels) == labels_shape


@pytest.mark.parametrize("loss_cls", TARGET_LOSSES + CLASS_LOSSES)
def test_existing_input_is_reused(loss_cls) -> None:
    """Two losses on one target create the input once; a named existing input is used as it is."""
    rng = np.random.default_rng(RNG_SEED)
    is_class = loss_cls in CLASS_LOSSES
    name = "labels" if is_class else "target"
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, ["N", C])
        acc.add_input("z", TensorProto.FLOAT, ["N", C])
        first = loss_cls()("y")
        second = loss_cls()("z")
        total = first + second
        acc.set_outputs([total])
    model = acc.finish()
    assert [i.name for i in model.graph.input] == ["y", "z", name]
    y, z = rng.standard_normal((2, 3, C)).astype(np.float32)
    if loss_cls in (losses.NLLLoss, losses.KLDivLoss):
        y, z = (torch.log_softmax(torch.from_numpy(v), 1).numpy() for v in (y, z))
    target = rng.integers(0, C, 3) if is_class else rng.uniform(0, 1, (3, C)).astype(np.float32)
    (got,) = run_model(model, {"y": y, "z": z, name: target})
    torch_loss = getattr(torch.nn, loss_cls.__name__)()
    expected = sum(torch_loss(torch.from_numpy(v), torch.from_numpy(target)) for v in (y, z))
    np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL)


def test_labels_may_be_any_existing_value() -> None:
    """Labels computed in the graph (here: an int32 Cast of an input) are used without a new input."""
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, ["N", C])
        acc.add_input("raw", TensorProto.FLOAT, ["N"])
        labels = acc.op("Cast", ["raw"], to=TensorProto.INT32)
        out = losses.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1)("y", labels)
        acc.set_outputs([out])
    model = acc.finish()
    assert [i.name for i in model.graph.input] == ["y", "raw"]
    y = np.random.default_rng(0).standard_normal((4, C)).astype(np.float32)
    raw = np.array([0, 2, 4, 1], dtype=np.float32)
    (got,) = run_model(model, {"y": y, "raw": raw})
    expected = torch.nn.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1)(
        torch.from_numpy(y), torch.from_numpy(raw).long()
    )
    np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("loss_cls", TARGET_LOSSES + CLASS_LOSSES)
def test_integer_input_is_a_type_error(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("counts", TensorProto.INT64, ["N", C])
        with pytest.raises(TypeError, match=r"'counts' has dtype int64.*Cast\(onnx.TensorProto.FLOAT\)"):
            loss_cls()("counts")


@pytest.mark.parametrize("loss_cls", CLASS_LOSSES)
def test_labels_of_wrong_shape(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("logits", TensorProto.FLOAT, [4, C, 3])
        acc.add_input("labels", TensorProto.INT64, [4, C])
        with pytest.raises(
            ValueError,
            match=r"labels 'labels' have shape \[4, 5\].*'logits' of shape "
            r"\[4, 5, 3\] need labels of shape \[4, 3\]",
        ):
            loss_cls()("logits")


def test_labels_of_wrong_dtype() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("logits", TensorProto.FLOAT, [4, C])
        acc.add_input("labels", TensorProto.FLOAT, [4])
        with pytest.raises(TypeError, match=r"labels 'labels' have dtype float.*int64"):
            losses.CrossEntropyLoss()("logits")


def test_target_of_other_dtype() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, [4, C])
        acc.add_input("t", TensorProto.DOUBLE, [4, C])
        with pytest.raises(TypeError, match=r"target 't' has dtype double but input 'y' has dtype float"):
            losses.MSELoss()("y", "t")


def test_weight_of_wrong_length() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, [4, C])
        with pytest.raises(ValueError, match=r"weight has 2 values but scores 'y' .* have 5 classes"):
            losses.CrossEntropyLoss(weight=[1.0, 2.0])("y")


def test_class_axis_out_of_range() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, [4, C])
        with pytest.raises(ValueError, match=r"class_axis=2 is out of range"):
            losses.NLLLoss(class_axis=2)("y")


@pytest.mark.parametrize("loss_cls", TARGET_LOSSES + CLASS_LOSSES)
def test_unknown_reduction(loss_cls) -> None:
    with pytest.raises(ValueError, match=r"unknown reduction 'avg'. Use one of 'mean', 'sum', 'none'"):
        loss_cls(reduction="avg")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: losses.HuberLoss(delta=0.0), "delta must be positive"),
        (lambda: losses.SmoothL1Loss(beta=-1.0), "beta must be >= 0"),
        (lambda: losses.CrossEntropyLoss(label_smoothing=1.5), r"label_smoothing must be in \[0, 1\]"),
        (lambda: losses.CrossEntropyLoss(weight=[[1.0]]), "weight must be 1-D"),
        (lambda: losses.BCEWithLogitsLoss(pos_weight="abc"), "pos_weight must be a list or numpy array"),
    ],
)
def test_bad_options(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_input_name() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("output", TensorProto.FLOAT, [4, C])
        with pytest.raises(UnknownNameError, match="'outptu'.*Did you mean 'output'"):
            losses.MSELoss()("outptu")


# ------------------------------------------------------------------ gradients
def _linear_model(x_shape: list, out_features: int, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """``y = x @ W + b`` with W, b as initializers; returns the model and the parameter arrays."""
    rng = np.random.default_rng(seed)
    params = {
        "W": rng.standard_normal((x_shape[-1], out_features)).astype(np.float32) * 0.5,
        "b": rng.standard_normal(out_features).astype(np.float32) * 0.5,
    }
    y_shape = [*x_shape[:-1], out_features]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), params


def _ort_gradients(model: onnx.ModelProto, loss_name: str, params: dict, feeds: dict) -> dict:
    """Move the parameters to graph inputs, build the gradient graph with ORT and run it."""
    from onnxruntime.capi import _pybind_state as C_

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        if init.name in params:
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    kept = [i for i in model.graph.initializer if i.name not in params]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    builder = C_.GradientGraphBuilder(
        model.SerializeToString(), {loss_name}, set(params), loss_name, C_.SessionOptions()
    )
    builder.build()
    grad_model = onnx.load_from_string(builder.get_model())
    names = [f"{p}_grad" for p in params]
    values = run_model(grad_model, {**feeds, **params}, names)
    return dict(zip(params, values, strict=True))


GRADIENT_CASES = [
    ("MSELoss", lambda: losses.MSELoss(), lambda: torch.nn.MSELoss(), "regression", 1),
    ("L1Loss", lambda: losses.L1Loss(reduction="sum"), lambda: torch.nn.L1Loss(reduction="sum"), "regression", 1),
    ("HuberLoss", lambda: losses.HuberLoss(delta=0.7), lambda: torch.nn.HuberLoss(delta=0.7), "regression", 1),
    ("SmoothL1Loss", lambda: losses.SmoothL1Loss(beta=0.4), lambda: torch.nn.SmoothL1Loss(beta=0.4), "regression", 1),
    (
        "BCEWithLogitsLoss",
        lambda: losses.BCEWithLogitsLoss(weight=CLASS_WEIGHT, pos_weight=CLASS_WEIGHT[::-1]),
        lambda: torch.nn.BCEWithLogitsLoss(
            weight=_tensor_or_none(CLASS_WEIGHT), pos_weight=_tensor_or_none(CLASS_WEIGHT[::-1])
        ),
        "probability",
        1,
    ),
    (
        "KLDivLoss",
        lambda: losses.KLDivLoss(reduction="batchmean"),
        lambda: torch.nn.KLDivLoss(reduction="batchmean"),
        "probability",
        1,
    ),
    (
        "KLDivLoss-log_target",
        lambda: losses.KLDivLoss(log_target=True),
        lambda: torch.nn.KLDivLoss(log_target=True),
        "regression",
        1,
    ),
    (
        "CrossEntropyLoss-fused",
        lambda: losses.CrossEntropyLoss(weight=CLASS_WEIGHT, ignore_index=1),
        lambda: torch.nn.CrossEntropyLoss(weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1),
        "classes",
        1,
    ),
    (
        "CrossEntropyLoss-BTV-fused",
        lambda: losses.CrossEntropyLoss(class_axis=-1),
        lambda: torch.nn.CrossEntropyLoss(),
        "classes",
        -1,
    ),
    (
        "CrossEntropyLoss-smoothing",
        lambda: losses.CrossEntropyLoss(weight=CLASS_WEIGHT, ignore_index=1, label_smoothing=0.2),
        lambda: torch.nn.CrossEntropyLoss(weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1, label_smoothing=0.2),
        "classes",
        1,
    ),
    (
        "CrossEntropyLoss-BTV-smoothing",
        lambda: losses.CrossEntropyLoss(label_smoothing=0.2, class_axis=-1, reduction="sum"),
        lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum"),
        "classes",
        -1,
    ),
    (
        "NLLLoss",
        lambda: losses.NLLLoss(weight=CLASS_WEIGHT, ignore_index=1),
        lambda: torch.nn.NLLLoss(weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1),
        "classes",
        1,
    ),
    ("NLLLoss-BTV", lambda: losses.NLLLoss(class_axis=-1), lambda: torch.nn.NLLLoss(), "classes", -1),
]


@pytest.mark.parametrize(
    ("make", "torch_make", "kind", "axis"), [c[1:] for c in GRADIENT_CASES], ids=[c[0] for c in GRADIENT_CASES]
)
def test_gradient_matches_torch(make, torch_make, kind, axis) -> None:
    """ORT's gradient builder differentiates the loss; W/b gradients of a linear layer equal torch.autograd's."""
    rng = np.random.default_rng(RNG_SEED)
    x_shape = [2, 3, 6] if axis == -1 else [6, 4]
    model, params = _linear_model(x_shape, C)
    x = rng.standard_normal(x_shape).astype(np.float32)
    y_shape = [*x_shape[:-1], C]
    if kind == "classes":
        name, target = "labels", rng.integers(0, C, y_shape[:-1]).astype(np.int64)
        target.flat[0] = 1
    elif kind == "probability":
        name, target = "target", rng.uniform(0, 1, y_shape).astype(np.float32)
    else:
        name, target = "target", rng.standard_normal(y_shape).astype(np.float32)
    with onnxblocks.base(model) as acc:
        loss = make()("y")
        acc.set_outputs([loss])
    grads = _ort_gradients(acc.finish(), loss, params, {"x": x, name: target})

    tw, tb = (torch.tensor(params[k], requires_grad=True) for k in ("W", "b"))
    ty = torch.from_numpy(x) @ tw + tb
    if axis == -1:
        ty = ty.movedim(-1, 1)
    torch_make()(ty, torch.from_numpy(target)).backward()
    np.testing.assert_allclose(grads["W"], tw.grad.numpy(), rtol=GRAD_RTOL, atol=GRAD_ATOL)
    np.testing.assert_allclose(grads["b"], tb.grad.numpy(), rtol=GRAD_RTOL, atol=GRAD_ATOL)

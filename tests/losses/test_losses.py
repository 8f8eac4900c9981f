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
from support.loss_reference import class_denominator, class_operand, loss_scale
from support.numerics import assert_close
from support.onnx_models import run_model

import onnxblocks
from onnxblocks import losses
from onnxblocks.errors import InvalidTypeError, InvalidValueError, OnnxBlocksError, UnknownNameError

pytestmark = pytest.mark.filterwarnings(
    "ignore:reduction. 'mean' divides the total loss:UserWarning"
)

RNG_SEED = 1234
#: relative bounds against torch in float32 (support.numerics adds the float64 reference's rule and the floor)
RTOL = 1e-5
GRAD_RTOL = 1e-4
#: a float64 loss against torch's float64 loss
FLOAT64_RTOL = 1e-12
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
    return (
        name
        + "["
        + ",".join(f"{k}={'w' if isinstance(v, list) else v}" for k, v in opts.items())
        + "]"
    )


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
        for weight, pos_weight in itertools.product(
            (None, CLASS_WEIGHT), (None, [1.5, 0.5, 3.0, 1.0, 2.0])
        ):
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
    for reduction, log_target in itertools.product(
        ("mean", "sum", "none", "batchmean"), (False, True)
    ):
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


@dataclass(frozen=True)
class Reference:
    """torch's loss on the test's data, in float32 and in float64, and the magnitude of its operands."""

    loss32: np.ndarray
    loss64: np.ndarray
    scale: Any

    def __add__(self, other: Reference) -> Reference:
        return Reference(
            self.loss32 + other.loss32, self.loss64 + other.loss64, self.scale + other.scale
        )


def _reference(make_torch: Any, x: np.ndarray, target: np.ndarray, axis: int = 1) -> Reference:
    """torch's loss (``make_torch()``) of ``x`` and ``target`` in float32 and in float64 (the module's
    weights converted by ``.float()``, ``.double()``), with the classes of ``x`` on ``axis`` moved to axis 1.
    """

    def run(module: Any, dtype: torch.dtype) -> np.ndarray:
        tx, tt = torch.from_numpy(x).to(dtype), torch.from_numpy(target)
        if tt.is_floating_point():
            tt = tt.to(dtype)
        if x.ndim > 1 and axis % x.ndim != 1:
            tx = tx.movedim(axis, 1)
            tt = tt.movedim(axis, 1) if tt.shape == x.shape else tt
        return module(tx, tt).detach().numpy()

    module64 = make_torch().double()
    loss32, loss64 = run(make_torch().float(), torch.float32), run(module64, torch.float64)
    reduction, module64.reduction = module64.reduction, "none"
    each = run(module64, torch.float64)
    weight = getattr(module64, "weight", None)
    weight = None if weight is None else weight.numpy()
    if isinstance(module64, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)):
        operand = class_operand(x, x.shape[axis] if x.ndim > 1 else x.shape[0], weight)
        labels = not np.issubdtype(target.dtype, np.floating)
        denominator = (
            class_denominator(target, weight, module64.ignore_index) if labels else each.size
        )
    else:
        pos_weight = getattr(module64, "pos_weight", None)
        largest = 1.0 if weight is None else float(np.max(np.abs(weight)))
        largest *= 1.0 if pos_weight is None else max(1.0, float(pos_weight.abs().max()))
        operand = largest * float(np.max(np.abs(x)) + np.max(np.abs(target)))
        denominator = x.shape[0] if reduction == "batchmean" else each.size
    return Reference(loss32, loss64, loss_scale(each, reduction, operand, denominator))


def _assert_matches(got: np.ndarray, reference: Reference, name: str = "loss") -> None:
    """A float32 loss against torch's: within RTOL of torch's float32 loss, or of its float64 twin's rounding."""
    assert_close(
        got, reference.loss32, reference.loss64, rtol=RTOL, scale=reference.scale, name=name
    )


def _torch_reference(case: Case, x: np.ndarray, target: np.ndarray) -> Reference:
    return _reference(case.torch_loss, x, target, case.class_axis)


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
    expected = _torch_reference(case, x, target)
    assert got.shape == expected.loss32.shape
    if "reduction=none" not in case.id:
        assert got.shape == ()
    _assert_matches(got, expected)


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
        out = losses.CrossEntropyLoss(
            weight=weight, reduction=reduction, label_smoothing=smoothing, class_axis=axis
        )("x", "probs")
        acc.set_outputs([out])
    (got,) = run_model(acc.finish(), {"x": x, "probs": p})
    expected = _reference(
        lambda: torch.nn.CrossEntropyLoss(
            weight=_tensor_or_none(weight), reduction=reduction, label_smoothing=smoothing
        ),
        x,
        p,
        axis,
    )
    _assert_matches(got, expected)


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
    _assert_matches(
        got, _reference(lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1), x, labels, 2)
    )


def test_cross_entropy_unbatched_scores() -> None:
    """1-D scores ``[C]`` with a scalar label, as torch."""
    x = np.random.default_rng(RNG_SEED).standard_normal(C).astype(np.float32)
    model, _ = _build(losses.CrossEntropyLoss(label_smoothing=0.1), (C,))
    label = np.array(3, dtype=np.int64)
    (got,) = run_model(model, {"x": x, "labels": label})
    _assert_matches(
        got, _reference(lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1), x, label)
    )


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
        lambda: losses.CrossEntropyLoss(
            weight=CLASS_WEIGHT, ignore_index=1, label_smoothing=0.1, class_axis=-1
        ),
        lambda: torch.nn.CrossEntropyLoss(
            weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1, label_smoothing=0.1
        ),
        "classes",
        -1,
    ),
    (
        "NLL",
        lambda: losses.NLLLoss(ignore_index=1),
        lambda: torch.nn.NLLLoss(ignore_index=1),
        "classes_log_prob",
        1,
    ),
]


@pytest.mark.parametrize("rank_known", [True, False], ids=["symbolic-dims", "unknown-rank"])
@pytest.mark.parametrize(
    ("make", "torch_make", "kind", "axis"),
    [c[1:] for c in SYMBOLIC_CASES],
    ids=[c[0] for c in SYMBOLIC_CASES],
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
    _assert_matches(got, _torch_reference(case, x, target))


@pytest.mark.parametrize("loss_cls", [losses.MSELoss, losses.CrossEntropyLoss])
def test_cannot_derive_target_of_unknown_rank(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("x", TensorProto.FLOAT, [4, C])
        acc.add_input("new_shape", TensorProto.INT64, ["rank"])
        scores = acc.op("Reshape", ["x", "new_shape"])
        with pytest.raises(
            ValueError, match=r"cannot create the (target|labels) input.*rank .*unknown.*add_input"
        ):
            loss_cls()(scores)


DOUBLE_CASES = [
    (
        "BCEWithLogitsLoss",
        lambda: losses.BCEWithLogitsLoss(pos_weight=[2.0] * C),
        lambda: torch.nn.BCEWithLogitsLoss(pos_weight=torch.full((C,), 2.0, dtype=torch.float64)),
        "probability",
    ),
    (
        "HuberLoss",
        lambda: losses.HuberLoss(delta=0.5),
        lambda: torch.nn.HuberLoss(delta=0.5),
        "regression",
    ),
    (
        "KLDivLoss",
        lambda: losses.KLDivLoss(reduction="batchmean"),
        lambda: torch.nn.KLDivLoss(reduction="batchmean"),
        "log_prob",
    ),
    (
        "CrossEntropyLoss",
        lambda: losses.CrossEntropyLoss(weight=CLASS_WEIGHT, label_smoothing=0.1),
        lambda: torch.nn.CrossEntropyLoss(
            weight=torch.tensor(CLASS_WEIGHT, dtype=torch.float64), label_smoothing=0.1
        ),
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
    expected = _torch_reference(case, x, target)
    assert_close(got, expected.loss64, rtol=FLOAT64_RTOL, scale=expected.scale, name="float64 loss")


def test_weighted_sum_of_two_losses_in_one_line() -> None:
    rng = np.random.default_rng(RNG_SEED)
    a, b, t1, t2 = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4))
    with onnxblocks.empty_base() as acc:
        acc.add_input("a", TensorProto.FLOAT, ["N", 3])
        acc.add_input("b", TensorProto.FLOAT, ["N", 3])
        total = 0.4 * losses.MSELoss()("a", "t1") + 0.6 * losses.L1Loss()("b", "t2")
        acc.set_outputs([total])
    (got,) = run_model(acc.finish(), {"a": a, "b": b, "t1": t1, "t2": t2})
    expected = np.float32(0.4) * np.mean((a - t1) ** 2) + np.float32(0.6) * np.mean(np.abs(b - t2))
    a, b, t1, t2 = (v.astype(np.float64) for v in (a, b, t1, t2))
    expected64 = 0.4 * np.mean((a - t1) ** 2) + 0.6 * np.mean(np.abs(b - t2))
    scale = 0.4 * np.mean((np.abs(a) + np.abs(t1)) ** 2) + 0.6 * np.mean(np.abs(b) + np.abs(t2))
    assert got.shape == ()
    assert_close(got, expected, expected64, rtol=RTOL, scale=scale)


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
    torch_loss = getattr(torch.nn, loss_cls.__name__)
    _assert_matches(got, _reference(torch_loss, y, target) + _reference(torch_loss, z, target))


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
    expected = _reference(
        lambda: torch.nn.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1),
        y,
        raw.astype(np.int64),
    )
    _assert_matches(got, expected)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("loss_cls", TARGET_LOSSES + CLASS_LOSSES)
def test_integer_input_is_a_type_error(loss_cls) -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("counts", TensorProto.INT64, ["N", C])
        with pytest.raises(
            TypeError, match=r"'counts' has dtype int64.*Cast\(onnx.TensorProto.FLOAT\)"
        ):
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
        with pytest.raises(
            TypeError, match=r"target 't' has dtype double but input 'y' has dtype float"
        ):
            losses.MSELoss()("y", "t")


@pytest.mark.parametrize("loss_cls", TARGET_LOSSES + CLASS_LOSSES)
def test_unknown_reduction(loss_cls) -> None:
    with pytest.raises(
        ValueError, match=r"unknown reduction 'avg'. Use one of 'mean', 'sum', 'none'"
    ):
        loss_cls(reduction="avg")


NAN = float("nan")
#: (id, the loss, the scores' shape, labels' dtype (None: the loss makes its own), error, what the message names)
BAD_OPTIONS: list[tuple[str, Any, list, int | None, type, list[str]]] = [
    # elementwise weights must broadcast against the logits without growing them (checked at build)
    ("BCE-pos_weight-length", lambda: losses.BCEWithLogitsLoss(pos_weight=[1.0, 2.0, 3.0]), ["N", C], None,
     InvalidValueError, ["pos_weight has 3 values", "5 classes"]),
    ("BCE-weight-length", lambda: losses.BCEWithLogitsLoss(weight=[1.0] * 4), [4, C], None,
     InvalidValueError, ["weight has 4 values", "5 classes"]),
    ("BCE-weight-batch-dim", lambda: losses.BCEWithLogitsLoss(weight=np.ones((2, C))), [4, C], None,
     InvalidValueError, ["weight has shape [2, 5]", "[4, 5]", "4 on axis 0"]),
    ("BCE-pos_weight-rank", lambda: losses.BCEWithLogitsLoss(pos_weight=np.ones((1, 1, C))), [4, C], None,
     InvalidValueError, ["pos_weight has shape [1, 1, 5]", "[4, 5]", "at most 2 dims"]),
    ("BCE-pos_weight-not-numbers", lambda: losses.BCEWithLogitsLoss(pos_weight="abc"), [4, C], None,
     InvalidValueError, ["pos_weight", "str"]),
    # class weights: one per class, on whichever axis holds the classes
    ("CE-weight-length", lambda: losses.CrossEntropyLoss(weight=[1.0, 2.0]), [4, C], None,
     InvalidValueError, ["weight has 2 values", "5 classes", "axis 1"]),
    ("NLL-weight-length-class-last", lambda: losses.NLLLoss(weight=[1.0] * 6, class_axis=-1), [2, 3, C], None,
     InvalidValueError, ["weight has 6 values", "5 classes", "axis 2"]),
    ("CE-weight-2d", lambda: losses.CrossEntropyLoss(weight=[[1.0]]), [4, C], None,
     InvalidValueError, ["weight must be 1-D", "[1, 1]"]),
    # label smoothing in [0, 1]
    ("CE-label_smoothing-above", lambda: losses.CrossEntropyLoss(label_smoothing=1.5), [4, C], None,
     InvalidValueError, ["label_smoothing", "[0, 1]", "1.5"]),
    ("CE-label_smoothing-negative", lambda: losses.CrossEntropyLoss(label_smoothing=-0.1), [4, C], None,
     InvalidValueError, ["label_smoothing", "[0, 1]", "-0.1"]),
    ("CE-label_smoothing-nan", lambda: losses.CrossEntropyLoss(label_smoothing=NAN), [4, C], None,
     InvalidValueError, ["label_smoothing", "nan"]),
    ("CE-label_smoothing-str", lambda: losses.CrossEntropyLoss(label_smoothing="0.1"), [4, C], None,
     InvalidTypeError, ["label_smoothing", "str", "'0.1'"]),
    # ignore_index: an int that the labels' dtype holds
    ("CE-ignore_index-beyond-int32", lambda: losses.CrossEntropyLoss(ignore_index=2**40), [4, C], TensorProto.INT32,
     InvalidValueError, ["ignore_index=1099511627776", "int32", "2147483647"]),
    ("NLL-ignore_index-beyond-int64", lambda: losses.NLLLoss(ignore_index=2**70), [4, C], None,
     InvalidValueError, [f"ignore_index={2**70}", "int64", "9223372036854775807"]),
    ("CE-ignore_index-float", lambda: losses.CrossEntropyLoss(ignore_index=1.5), [4, C], None,
     InvalidTypeError, ["ignore_index", "float", "1.5"]),
    ("NLL-ignore_index-bool", lambda: losses.NLLLoss(ignore_index=True), [4, C], None,
     InvalidTypeError, ["ignore_index", "bool"]),
    ("CE-class_axis-bool", lambda: losses.CrossEntropyLoss(class_axis=True), [4, C], None,
     InvalidTypeError, ["class_axis", "bool"]),
    ("NLL-class_axis-out-of-range", lambda: losses.NLLLoss(class_axis=2), [4, C], None,
     InvalidValueError, ["class_axis=2", "[4, 5]", "[-2, 1]"]),
    # reductions each loss knows
    ("MSE-reduction", lambda: losses.MSELoss(reduction="avg"), [4, C], None,
     InvalidValueError, ["reduction 'avg'", "'mean', 'sum', 'none'"]),
    ("Huber-reduction-batchmean", lambda: losses.HuberLoss(reduction="batchmean"), [4, C], None,
     InvalidValueError, ["reduction 'batchmean'", "'mean', 'sum', 'none'"]),
    ("KLDiv-reduction", lambda: losses.KLDivLoss(reduction="avg"), [4, C], None,
     InvalidValueError, ["reduction 'avg'", "'batchmean'"]),
    # delta > 0, beta >= 0, real numbers
    ("Huber-delta-zero", lambda: losses.HuberLoss(delta=0.0), [4, C], None,
     InvalidValueError, ["delta must be positive", "0.0"]),
    ("Huber-delta-negative", lambda: losses.HuberLoss(delta=-1.0), [4, C], None,
     InvalidValueError, ["delta must be positive", "-1.0"]),
    ("Huber-delta-nan", lambda: losses.HuberLoss(delta=NAN), [4, C], None,
     InvalidValueError, ["delta must be positive", "nan"]),
    ("Huber-delta-str", lambda: losses.HuberLoss(delta="1"), [4, C], None,
     InvalidTypeError, ["delta must be a real number", "'1'"]),
    ("SmoothL1-beta-negative", lambda: losses.SmoothL1Loss(beta=-0.5), [4, C], None,
     InvalidValueError, ["beta must be >= 0", "-0.5"]),
    ("SmoothL1-beta-nan", lambda: losses.SmoothL1Loss(beta=NAN), [4, C], None,
     InvalidValueError, ["beta must be >= 0", "nan"]),
    ("KLDiv-log_target-str", lambda: losses.KLDivLoss(log_target="yes"), [4, C], None,
     InvalidTypeError, ["log_target", "'yes'"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "shape", "labels", "error", "names"),
    [c[1:] for c in BAD_OPTIONS],
    ids=[c[0] for c in BAD_OPTIONS],
)
def test_bad_option_is_refused_by_the_loss_naming_it(make, shape, labels, error, names) -> None:
    """An option of the wrong kind, range or shape is refused when the loss is made or built, never by a node.

    The error is an OnnxBlocksError of the builtin class that fits (ValueError, TypeError) and its message
    names the option, its value (or length, or shape) and what it must fit.
    """
    with onnxblocks.empty_base() as acc:
        acc.add_input("y", TensorProto.FLOAT, shape)
        if labels is not None:
            acc.add_input("labels", labels, shape[:1])
        with pytest.raises(error) as caught:
            make()("y")
    assert isinstance(caught.value, OnnxBlocksError)
    message = str(caught.value)
    missing = [name for name in names if name not in message]
    assert not missing, f"the message does not name {missing}: {message}"


def test_unknown_input_name() -> None:
    with onnxblocks.empty_base() as acc:
        acc.add_input("output", TensorProto.FLOAT, [4, C])
        with pytest.raises(UnknownNameError, match="'outptu'.*Did you mean 'output'"):
            losses.MSELoss()("outptu")


# ------------------------------------------------------------------ gradients
def _linear_model(
    x_shape: list, out_features: int, seed: int = 0, dtype: Any = np.float32
) -> tuple[onnx.ModelProto, dict]:
    """``y = x @ W + b`` with W, b as initializers of ``dtype``; returns the model and the parameter arrays."""
    rng = np.random.default_rng(seed)
    params = {
        "W": (rng.standard_normal((x_shape[-1], out_features)).astype(np.float32) * 0.5).astype(
            dtype
        ),
        "b": (rng.standard_normal(out_features).astype(np.float32) * 0.5).astype(dtype),
    }
    y_shape = [*x_shape[:-1], out_features]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", elem, x_shape)],
        [helper.make_tensor_value_info("y", elem, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), params


def _ort_gradients(model: onnx.ModelProto, loss_name: str, params: dict, feeds: dict) -> dict:
    """Move the parameters to graph inputs, build the gradient graph with ORT and run it."""
    from onnxruntime.capi import _pybind_state as C_

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        if init.name in params:
            model.graph.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    kept = [i for i in model.graph.initializer if i.name not in params]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    seed = loss_name
    if (
        next(o for o in model.graph.output if o.name == loss_name).type.tensor_type.elem_type
        != TensorProto.FLOAT
    ):
        # ORT's builder seeds a float32 1; a float64 loss is seeded through a float32 Cast, as onnxblocks does
        seed = f"{loss_name}_float"
        model.graph.node.append(helper.make_node("Cast", [loss_name], [seed], to=TensorProto.FLOAT))
        model.graph.output.append(helper.make_tensor_value_info(seed, TensorProto.FLOAT, []))
    builder = C_.GradientGraphBuilder(
        model.SerializeToString(), {seed}, set(params), seed, C_.SessionOptions()
    )
    builder.build()
    grad_model = onnx.load_from_string(builder.get_model())
    names = [f"{p}_grad" for p in params]
    values = run_model(grad_model, {**feeds, **params}, names)
    return dict(zip(params, values, strict=True))


GRADIENT_CASES = [
    ("MSELoss", lambda: losses.MSELoss(), lambda: torch.nn.MSELoss(), "regression", 1),
    (
        "L1Loss",
        lambda: losses.L1Loss(reduction="sum"),
        lambda: torch.nn.L1Loss(reduction="sum"),
        "regression",
        1,
    ),
    (
        "HuberLoss",
        lambda: losses.HuberLoss(delta=0.7),
        lambda: torch.nn.HuberLoss(delta=0.7),
        "regression",
        1,
    ),
    (
        "SmoothL1Loss",
        lambda: losses.SmoothL1Loss(beta=0.4),
        lambda: torch.nn.SmoothL1Loss(beta=0.4),
        "regression",
        1,
    ),
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
        lambda: torch.nn.CrossEntropyLoss(
            weight=_tensor_or_none(CLASS_WEIGHT), ignore_index=1, label_smoothing=0.2
        ),
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
    (
        "NLLLoss-BTV",
        lambda: losses.NLLLoss(class_axis=-1),
        lambda: torch.nn.NLLLoss(),
        "classes",
        -1,
    ),
]


def _gradient_data(kind: str, axis: int) -> tuple[list, np.ndarray, str, np.ndarray]:
    """``(x shape, x, target name, target)`` of a gradient case (float32 data)."""
    rng = np.random.default_rng(RNG_SEED)
    x_shape = [2, 3, 6] if axis == -1 else [6, 4]
    x = rng.standard_normal(x_shape).astype(np.float32)
    y_shape = [*x_shape[:-1], C]
    if kind == "classes":
        name, target = "labels", rng.integers(0, C, y_shape[:-1]).astype(np.int64)
        target.flat[0] = 1
    elif kind == "probability":
        name, target = "target", rng.uniform(0, 1, y_shape).astype(np.float32)
    else:
        name, target = "target", rng.standard_normal(y_shape).astype(np.float32)
    return x_shape, x, name, target


@pytest.mark.parametrize(
    ("make", "torch_make", "kind", "axis"),
    [c[1:] for c in GRADIENT_CASES],
    ids=[c[0] for c in GRADIENT_CASES],
)
def test_gradient_matches_torch(make, torch_make, kind, axis) -> None:
    """ORT's gradient builder differentiates the loss; W/b gradients of a linear layer equal torch.autograd's."""
    x_shape, x, name, target = _gradient_data(kind, axis)
    model, params = _linear_model(x_shape, C)
    with onnxblocks.base(model) as acc:
        loss = make()("y")
        acc.set_outputs([loss])
    grads = _ort_gradients(acc.finish(), loss, params, {"x": x, name: target})

    expected, expected64 = (
        _torch_gradients(torch_make, params, x, target, axis, dtype) for dtype in DTYPES
    )
    for name in ("W", "b"):
        assert_close(
            grads[name],
            expected[name],
            expected64[name],
            rtol=GRAD_RTOL,
            name=f"gradient of {name}",
        )


DTYPES = (torch.float32, torch.float64)


def _torch_gradients(
    torch_make, params: dict, x: np.ndarray, target: np.ndarray, axis: int, dtype
) -> dict:
    """torch.autograd's gradients of the linear layer's W and b, everything (weights of the loss too) in dtype."""
    tw, tb = (torch.tensor(params[k], dtype=dtype, requires_grad=True) for k in ("W", "b"))
    ty = torch.from_numpy(x).to(dtype) @ tw + tb
    if axis == -1:
        ty = ty.movedim(-1, 1)
    tt = torch.from_numpy(target)
    torch_make().to(dtype)(ty, tt.to(dtype) if tt.is_floating_point() else tt).backward()
    return {"W": tw.grad.numpy(), "b": tb.grad.numpy()}


@pytest.mark.parametrize(
    ("make", "torch_make", "kind", "axis"),
    [c[1:] for c in GRADIENT_CASES],
    ids=[c[0] for c in GRADIENT_CASES],
)
def test_float64_gradient_is_float64(make, torch_make, kind, axis) -> None:
    """In a float64 model the loss's gradient is computed in float64: within FLOAT64_RTOL of torch's.

    No step of the gradient may round to float32 (ONNX Runtime's ReduceMean gradient scales by a float32 1/N,
    which is why a float64 "mean" is ReduceSum / N).
    """
    x_shape, x, name, target = _gradient_data(kind, axis)
    model, params = _linear_model(x_shape, C, dtype=np.float64)
    feeds = {
        "x": x.astype(np.float64),
        name: target.astype(np.float64) if target.dtype == np.float32 else target,
    }
    with onnxblocks.base(model) as acc:
        loss = make()("y")
        acc.set_outputs([loss])
    grads = _ort_gradients(acc.finish(), loss, params, feeds)
    expected = _torch_gradients(torch_make, params, x, target, axis, torch.float64)
    for param in ("W", "b"):
        assert grads[param].dtype == np.float64
        assert_close(
            grads[param], expected[param], rtol=FLOAT64_RTOL, name=f"float64 gradient of {param}"
        )

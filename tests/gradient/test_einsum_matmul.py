"""Einsum rewritten as MatMul (``einsum_as_matmul``): values and gradients against torch, and no large intermediate.

Each case is an ``Einsum`` over graph inputs, differentiated by ``build_vjp_graph`` (the rewrite runs before ONNX
Runtime's gradient builder) and run two ways: as built, on the training build's kernels, and lowered to standard
ops (``lower_training_ops``, the portable path). Both must give torch's output and input gradients (float32 and
float64 references, ``support.numerics``).

The family: contractions of one to three operands (matrix products, several contracted letters, dot products,
outer products, sums), batch letters, letters repeated within one operand (diagonals, traces), ``...`` with
broadcasting, implicit outputs, scalar operands, sizes of 1, static and symbolic dims (a name per axis, so equal
sizes are not known equal; sizes of 1 stay static, as torch's exporters leave them); the fixed cases below and a
seeded random draw.

The size check: every tensor of the forward and backward graph (shapes inferred on the lowered graph) has at most
as many elements as the largest operand or the output, for one or two operands without broadcasting; the two
equations of ORTModule's ``test_gradient_correctness_einsum`` that took 24 GB are checked at their full size.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support.numerics import assert_close

from onnxblocks._core.ort import onnxruntime
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.gradient.einsum import parse_equation
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops

RTOL = 1e-5

FIXED = [
    ("sec,sm->ecm", [(6, 4, 3), (6, 5)]),  # ORTModule's equations, small
    ("sec,ecm->sm", [(6, 4, 3), (4, 3, 5)]),
    ("bi,ij->bj", [(3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("bijk,jkl->bil", [(2, 3, 4, 5), (4, 5, 6)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    (",ij->ji", [(), (2, 3)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iij,jk->ik", [(3, 3, 2), (2, 5)]),
    ("bii->bi", [(2, 3, 3)]),
    ("iii->", [(3, 3, 3)]),
    ("ijij->ij", [(2, 3, 2, 3)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...i,i", [(3, 1, 4), (4,)]),
    ("b...,b->b", [(3, 2, 2), (3,)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("bij,k->bk", [(2, 3, 4), (5,)]),
    ("bi,oij,bj->bo", [(3, 4), (2, 4, 5), (3, 5)]),
    ("bi,ij,jk->bk", [(3, 4), (4, 5), (5, 2)]),
    ("ab,bc,cd->", [(1, 2), (2, 1), (1, 3)]),
    ("ij,jk->ik", [(3, 1), (4, 5)]),  # a contracted letter broadcast from size 1
    ("...j,...j->j", [(3, 1, 2), (4, 2)]),  # ``...`` broadcast, then summed
]


def _random_cases(count: int, seed: int = 20261201) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Seeded equations: repeated letters, shared and lone letters, ``...`` with size-1 broadcasting, implicit outputs."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        pool = "abcdefg"[: int(rng.integers(2, 7))]
        sizes = {c: int(rng.choice([1, 2, 3, 4])) for c in pool}
        ellipsis = (
            [int(rng.choice([2, 3])) for _ in range(int(rng.integers(1, 3)))]
            if rng.random() < 0.3
            else None
        )
        terms, shapes = [], []
        for _ in range(int(rng.integers(1, 4))):
            letters = "".join(rng.choice(list(pool), size=int(rng.integers(0, 4))))
            shape = [sizes[c] for c in letters]
            if ellipsis is not None and rng.random() < 0.7:
                own = ellipsis[int(rng.integers(0, len(ellipsis))) :]
                own = [1 if rng.random() < 0.3 else d for d in own]
                at = int(rng.integers(0, len(letters) + 1))
                letters = letters[:at] + "..." + letters[at:]
                shape = shape[:at] + own + shape[at:]
            terms.append(letters)
            shapes.append(tuple(shape))
        used = sorted({c for t in terms for c in t if c.isalpha()})
        if rng.random() < 0.3:
            equation = ",".join(terms)
        else:
            out = [c for c in rng.permutation(used) if rng.random() < 0.5]
            if any("..." in t for t in terms):
                at = int(rng.integers(0, len(out) + 1))
                out = [*out[:at], "...", *out[at:]]
            equation = ",".join(terms) + "->" + "".join(out)
        if math.prod(math.prod(s) for s in shapes) == 0 or not used:
            continue
        cases.append((equation, shapes))
    return cases


CASES = [pytest.param(e, s, id=f"fixed-{e}") for e, s in FIXED] + [
    pytest.param(e, s, id=f"random{i}-{e}") for i, (e, s) in enumerate(_random_cases(40))
]


def _model(equation: str, shapes, symbolic: bool) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [
        helper.make_tensor_value_info(
            n,
            onnx.TensorProto.FLOAT,
            [f"{n}_d{j}" if symbolic and d != 1 else d for j, d in enumerate(s)],
        )
        for n, s in zip(names, shapes, strict=True)
    ]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    graph = helper.make_graph(
        [node], "einsum", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _torch(equation: str, arrays, grad, dtype):
    xs = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    y = torch.einsum(equation, *xs)
    y.backward(torch.tensor(grad, dtype=dtype))
    return [y.detach().numpy(), *(x.grad.numpy() for x in xs)]


def _run(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize(("equation", "shapes"), CASES)
def test_einsum_gradients_match_torch(equation, shapes, symbolic):
    rng = np.random.default_rng(zlib.crc32(f"{equation} {symbolic}".encode()))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    out_shape = torch.einsum(equation, *(torch.from_numpy(a) for a in arrays)).shape
    grad = rng.standard_normal(tuple(out_shape)).astype(np.float32)
    names = [f"x{i}" for i in range(len(shapes))]
    vjp = build_vjp_graph(_model(equation, shapes, symbolic), requires_grad=names)
    assert vjp.rewrites["einsum_as_matmul"] == 1
    assert "Einsum" not in {n.op_type for n in vjp.model.graph.node}
    lowered = onnx.ModelProto()
    lowered.CopyFrom(vjp.model)
    lower_training_ops(lowered)
    assert not non_portable_ops(lowered), [op for _, op, _ in non_portable_ops(lowered)]

    expected = _torch(equation, arrays, grad, torch.float32)
    expected64 = _torch(equation, arrays, grad, torch.float64)
    scale = _torch(equation, [np.abs(a) for a in arrays], np.abs(grad), torch.float64)
    feeds = dict(zip(names, arrays, strict=True)) | {vjp.output_grads[0]: grad}
    for backend, model in (("training build", vjp.model), ("portable", lowered)):
        got = _run(model, feeds)
        for i, name in enumerate(["y", *(f"{n}_grad" for n in names)]):
            assert_close(
                got[name],
                expected[i],
                expected64[i],
                rtol=RTOL,
                scale=scale[i],
                name=f"{backend} {equation} {name}",
            )
    if not symbolic and len(shapes) <= 2 and not _broadcasts(equation, shapes):
        limit = max(math.prod(s) for s in [*shapes, tuple(out_shape)])
        size, name = _largest_computed(lowered, feeds)
        assert size <= limit, (
            f"{name} has {size} elements; the operands and the output at most {limit}"
        )


def _broadcasts(equation: str, shapes) -> bool:
    """Whether one letter (after expanding ``...``) has size 1 in one operand and more in another."""
    parsed = parse_equation(equation, [len(s) for s in shapes])
    assert parsed is not None
    sizes: dict[str, set[int]] = {}
    for letters, shape in zip(parsed[0], shapes, strict=True):
        for c, d in zip(letters, shape, strict=True):
            sizes.setdefault(c, set()).add(d)
    return any(len(s) > 1 for s in sizes.values())


def _largest_tensor(model: onnx.ModelProto) -> tuple[int, str]:
    """The element count and name of the largest float tensor of ``model`` (shapes inferred; all must be known)."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    largest = (0, "")
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tensor = info.type.tensor_type
        if tensor.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        assert tensor.HasField("shape") and None not in dims, f"{info.name}: shape not inferred"
        largest = max(largest, (math.prod(dims), info.name))  # type: ignore[arg-type]
    return largest


def _largest_computed(model: onnx.ModelProto, feeds) -> tuple[int, str]:
    """The element count and name of the largest float tensor ``model`` computes on ``feeds`` (every value run)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        probe.graph.output.extend(
            helper.make_empty_tensor_value_info(n) for n in node.output if n and n not in outputs
        )
    got = _run(probe, feeds)
    return max((v.size, k) for k, v in got.items() if v.dtype.kind == "f")


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("sec,sm->ecm", [(1024, 64, 32), (1024, 768)]),
        ("sec,ecm->sm", [(1024, 64, 32), (64, 32, 768)]),
    ],
)
def test_ortmodule_equations_at_full_size_keep_every_tensor_small(equation, shapes):
    """The graphs that allocated 6 GiB per tensor (s=1024, e=64, c=32, m=768): no tensor above 2M elements now."""
    vjp = build_vjp_graph(_model(equation, shapes, symbolic=False), requires_grad=["x0", "x1"])
    lowered = onnx.ModelProto()
    lowered.CopyFrom(vjp.model)
    lower_training_ops(lowered)
    size, name = _largest_tensor(lowered)
    assert size <= 1024 * 64 * 32, f"{name} has {size} elements"
    assert "MatMul" in {n.op_type for n in vjp.model.graph.node} | {
        n.op_type for n in lowered.graph.node
    }


@pytest.mark.parametrize(
    ("equation", "ranks", "expected"),
    [
        ("ii->i", [2], (["ii"], "i")),
        ("ii", [2], (["ii"], "")),
        ("iij,jk", [3, 2], (["iij", "jk"], "k")),
        (",ij->ji", [0, 2], (["", "ij"], "ji")),
        ("...i,i", [3, 1], (["ABi", "i"], "AB")),
        ("ij->ii", [2], None),  # an output letter twice
        ("ij,jk->ik", [2], None),  # two operands, one rank
        ("ijk->ij", [2], None),  # more letters than the rank
    ],
)
def test_parse_equation_with_diagonals_and_scalars(equation, ranks, expected):
    assert parse_equation(equation, ranks) == expected

"""OrtModule against the behaviours ONNX Runtime's own ORTModule API tests check, on the CPU, against torch eager.

Written from a reading of upstream's ``orttraining_test_ortmodule_api.py`` (no code copied): each
test here checks one behaviour it checks, numerically where it compares with torch (outputs and
every gradient by ``support.numerics``: rtol ``RTOL`` of eager float32, or eager float32's own
rounding against a float64 twin of the module fed the same calls, plus the floor). Tests of ORTModule internals (its execution manager, graph
builder, DebugOptions files), of CUDA devices and of fp16 autocast have no counterpart.
"""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import pytest
import torch
from support.numerics import assert_close, assert_equal

from onnxblocks.torch import ExportError, OrtModule

RTOL = 1e-5


class Float64Twin(torch.nn.Module):
    """A float64 copy of an eager module, called as the eager one is: floating tensors are cast to float64 on
    the way in. It computes the float64 reference of ``support.numerics`` beside the float32 one."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(module).double()

    def forward(self, *args, **kwargs):
        def cast(value):
            return (
                value.double()
                if isinstance(value, torch.Tensor) and value.is_floating_point()
                else value
            )

        args, kwargs = torch.utils._pytree.tree_map(cast, (args, kwargs))
        return self.module(*args, **kwargs)


_TWINS: dict[int, Float64Twin] = {}


def _twin(eager: torch.nn.Module) -> Float64Twin:
    """The float64 twin :func:`_pair` made for ``eager``."""
    return _TWINS[id(eager)]


def _close(a, b, b64, what=""):
    """``support.numerics.assert_close`` of ours ``a`` against eager ``b`` and its float64 twin's ``b64``."""
    if a is None or b is None:
        assert a is None and b is None and b64 is None, f"{what}: {a is None} vs {b is None}"
        return
    assert_close(a, b, b64, rtol=RTOL, name=what)


def _grads_match(
    wrapped: OrtModule, eager: torch.nn.Module, reset: bool = True, scales=None
) -> None:
    """Every parameter's gradient, ours against eager's and its twin's; ``scales`` the floors where known."""
    ours, theirs64 = dict(wrapped.named_parameters()), dict(_twin(eager).module.named_parameters())
    for name, p in eager.named_parameters():
        a, b, b64 = ours[name].grad, p.grad, theirs64[name].grad
        if a is not None and b is not None:
            assert_close(
                a, b, b64, rtol=RTOL, scale=(scales or {}).get(name), name=f"gradient of {name}"
            )
        else:
            _close(a, b, b64, f"gradient of {name}")
        if reset:
            ours[name].grad, p.grad, theirs64[name].grad = None, None, None


def _pair(module: torch.nn.Module) -> tuple[OrtModule, torch.nn.Module]:
    """The wrapped module and the eager one (its float64 twin made now, from the same weights: :func:`_twin`)."""
    _TWINS[id(module)] = Float64Twin(module)
    return OrtModule(copy.deepcopy(module)), module


class MLP(torch.nn.Module):
    def __init__(self, d_in=12, hidden=16, d_out=5):
        super().__init__()
        self.fc1, self.relu, self.fc2 = (
            torch.nn.Linear(d_in, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, d_out),
        )

    def forward(self, input1):
        return self.fc2(self.relu(self.fc1(input1)))


class TwoInputs(MLP):
    def forward(self, input1, input2):
        return self.fc2(self.relu(self.fc1(input1 + input2)))


class VarArgs(MLP):
    def forward(self, *inputs):
        return self.fc2(self.relu(self.fc1(torch.stack(inputs).sum(0))))


class Keywords(MLP):
    def forward(self, x=None, y=None, z=None):
        return self.fc2(self.relu(self.fc1(torch.stack([x, y, z]).sum(0))))


class Optional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([-1.0, 1.0]))

    def forward(self, x, y=None, z=None):
        if z is not None:
            return self.a.mean() + x + 4 * z
        if y is not None:
            return self.a.mean() + 3 * y
        return self.a.mean() + x


# ------------------------------------------------------------------ calling conventions
@pytest.mark.parametrize("cls", [MLP, TwoInputs, Keywords, Optional])
def test_forward_keeps_the_module_signature(cls):
    module = cls()
    assert inspect.signature(OrtModule(module).forward) == inspect.signature(module.forward)


@pytest.mark.parametrize(
    "call",
    [
        "m(one)", "m(x=one)", "m(one, None, None)", "m(one, None, z=None)", "m(one, None)", "m(x=one, y=one)",
        "m(y=one, x=one)", "m(y=one, z=None, x=one)", "m(one, None, z=one)", "m(x=one, z=one)", "m(one, z=one)",
        "m(one, z=one, y=one)", "m(one, one, one)", "m(one, None, one)", "m(z=one, x=one, y=one)",
        "m(z=one, x=one, y=None)",
    ],
)  # fmt: skip
def test_positional_keyword_and_none_arguments(call):
    one = torch.tensor([1.0])  # read by eval
    m = Optional()
    expected = eval(call)
    expected.sum().backward()
    eager = m
    m, one = Optional().double(), one.double()  # the float64 reference
    eval(call).sum().backward()
    eager64, one = m, one.float()
    m = OrtModule(Optional())
    first, again = eval(call), eval(call)
    assert first.item() == again.item() == expected.item()
    first.sum().backward()
    _close(m.a.grad, eager.a.grad, eager64.a.grad, "a's gradient")


@pytest.mark.parametrize(
    ("cls", "count", "keywords"),
    [(TwoInputs, 2, False), (VarArgs, 3, False), (Keywords, 3, True), (MLP, 1, False)],
)
def test_argument_styles_match_eager(cls, count, keywords):
    torch.manual_seed(0)
    wrapped, eager = _pair(cls())
    xs = [torch.randn(6, 12) for _ in range(count)]
    for model in (wrapped, eager, _twin(eager)):
        out = model(**dict(zip("xyz", xs, strict=False))) if keywords else model(*xs)
        out.pow(2).sum().backward()
    _grads_match(wrapped, eager)


def test_keyword_only_arguments():
    class KeywordOnly(MLP):
        def forward(self, input1, *, scale, shift=None):
            out = self.fc2(self.relu(self.fc1(input1))) * scale
            return out if shift is None else out + shift

    torch.manual_seed(0)
    wrapped, eager = _pair(KeywordOnly())
    assert inspect.signature(wrapped.forward) == inspect.signature(eager.forward)
    x, scale = torch.randn(3, 12), torch.randn(3, 1, requires_grad=True)
    grads = []
    for model, dtype in (
        (wrapped, torch.float32),
        (eager, torch.float32),
        (_twin(eager), torch.float64),
    ):
        s = scale.detach().to(dtype, copy=True).requires_grad_(True)
        (model(x, scale=s).sum() + model(x, scale=s, shift=torch.ones(5)).pow(2).sum()).backward()
        grads.append(s.grad)
    _close(*grads, "the scale's gradient")
    _grads_match(wrapped, eager)


def test_string_argument_is_part_of_the_signature():
    class Greeter(torch.nn.Module):
        def forward(self, x, word):
            return x * (2 if word.lower() == "hello" else 3)

    m = OrtModule(Greeter())
    x = torch.ones(2)
    assert m(x, "hello").tolist() == [2.0, 2.0] and m(x, "bye").tolist() == [3.0, 3.0]


# ------------------------------------------------------------------ input gradients
@pytest.mark.parametrize(
    ("x1_grad", "x2_grad"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_input_gradients_as_required(x1_grad, x2_grad):
    class Dependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(12, 16), torch.nn.Linear(16, 5)

        def forward(self, input1, input2):
            out1 = torch.softmax(self.fc1(input1 + input2), dim=1)
            return out1, self.fc2(out1)

    torch.manual_seed(0)
    wrapped, eager = _pair(Dependent())
    base = [torch.randn(6, 12), torch.randn(6, 12)]
    got = []
    for model, dtype in (
        (wrapped, torch.float32),
        (eager, torch.float32),
        (_twin(eager), torch.float64),
    ):
        xs = [
            b.to(dtype, copy=True).requires_grad_(g)
            for b, g in zip(base, (x1_grad, x2_grad), strict=True)
        ]
        model(*xs)[1].sum().backward()
        got.append(xs)
    for a, b, b64 in zip(*got, strict=True):
        _close(a.grad, b.grad, b64.grad, "input gradient")
    _grads_match(wrapped, eager)


def test_input_requires_grad_changing_between_calls():
    torch.manual_seed(0)
    wrapped, eager = _pair(MLP())
    x = torch.randn(4, 12)
    wrapped(x).sum().backward()
    assert x.grad is None
    y = x.clone().requires_grad_(True)
    wrapped(y).sum().backward()
    y_ref, y64 = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    eager(y_ref).sum().backward()
    eager(x).sum().backward()
    _twin(eager)(y64).sum().backward()
    _twin(eager)(x).sum().backward()
    _close(y.grad, y_ref.grad, y64.grad, "y's gradient")
    _grads_match(wrapped, eager)


def test_input_that_already_holds_a_gradient_accumulates():
    torch.manual_seed(0)
    wrapped, eager = _pair(MLP())
    base = torch.randn(4, 12)
    xs = [base.clone().requires_grad_(True) for _ in range(2)] + [
        base.double().requires_grad_(True)
    ]
    for x, model in zip(xs, (wrapped, eager, _twin(eager)), strict=True):
        x.grad = torch.ones_like(x)
        model(x).sum().backward()
    _close(*(x.grad for x in xs), "x's gradient, added to the one it held")


def test_only_the_outputs_used_give_gradients():
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(12, 5), torch.nn.Linear(12, 5)

        def forward(self, a, b):
            x = a + b
            return torch.relu(torch.softmax(self.fc1(x), 1)), torch.relu(
                torch.softmax(self.fc2(x), 1)
            )

    torch.manual_seed(0)
    wrapped, eager = _pair(TwoHeads())
    a, b = torch.randn(4, 12), torch.randn(4, 12)
    for model in (wrapped, eager, _twin(eager)):
        model(a, b)[0].sum().backward()
    assert wrapped.module.fc2.weight.grad is None  # as torch: not a zero tensor
    # each row of a softmax sums to one: fc1's gradient is zero in exact arithmetic, made of terms s_i (g_i and
    # sum_j s_j g_j, g = 1) that cancel; its floor is the magnitude of those terms through fc1
    with torch.no_grad():
        x = (a + b).double()
        terms = 2 * torch.softmax(_twin(eager).module.fc1(x), 1)
    _grads_match(
        wrapped,
        eager,
        scales={"fc1.weight": (terms.T @ x.abs()).numpy(), "fc1.bias": terms.sum(0).numpy()},
    )


# ------------------------------------------------------------------ outputs
def test_non_differentiable_outputs_in_the_middle():
    class Masks(MLP):
        def forward(self, input1):
            out1 = self.relu(self.fc1(input1))
            out2 = self.fc2(out1)
            return out1, torch.gt(out1, 0.01).long(), out2, torch.lt(out2, 0.02).long()

    torch.manual_seed(0)
    wrapped, eager = _pair(Masks())
    x = torch.randn(6, 12)
    outs = [model(x) for model in (wrapped, eager, _twin(eager))]
    for model_out in outs:
        model_out[2].sum().backward()
    for i, (a, b, b64) in enumerate(zip(*outs, strict=True)):
        assert a.dtype == b.dtype
        _close(a, b, b64, f"output {i}")
    assert not outs[0][1].requires_grad and outs[0][2].requires_grad
    _grads_match(wrapped, eager)


@pytest.mark.parametrize("use_both", [False, True])
def test_the_same_tensor_returned_twice(use_both):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(12, 4)

        def forward(self, x):
            out = self.fc1(x)
            return out, out

    torch.manual_seed(0)
    wrapped, eager = _pair(Twice())
    x = torch.randn(3, 12)
    for model in (wrapped, eager, _twin(eager)):
        out, again = model(x)
        assert out is again
        loss = out.sum() + ((2 * again).sum() if use_both else 0)
        loss.backward()
    _grads_match(wrapped, eager)


def test_inputs_returned_unchanged_keep_their_gradient():
    class Bypass(MLP):
        def forward(self, input1, bypass):
            return self.fc2(self.relu(self.fc1(input1))).view(bypass.size()[0], -1), bypass

    class Chained(MLP):
        def forward(self, input1, mask):
            return self.fc2(self.relu(self.fc1(input1))), mask

    torch.manual_seed(0)
    wrapped, eager = _pair(Bypass())
    grads = []
    for model, dtype in (
        (wrapped, torch.float32),
        (eager, torch.float32),
        (_twin(eager), torch.float64),
    ):
        x1, x2 = (
            torch.ones(*shape, dtype=dtype, requires_grad=True) for shape in ((4, 12), (4, 3))
        )
        y1, y2 = model(x1, x2)
        assert y2 is x2
        (y1.sum() + y2.sum()).backward()
        grads.append((x1.grad, x2.grad))
    _close(grads[0][0], grads[1][0], grads[2][0], "x1's gradient")
    _close(grads[0][1], grads[1][1], grads[2][1], "x2's gradient (returned unchanged)")
    _grads_match(wrapped, eager)
    first, second = OrtModule(Chained()), OrtModule(Chained())
    mask = torch.zeros(1)
    x = torch.randn(4, 12)
    prediction, out_mask = second(x, first(x, mask)[1])
    assert out_mask is mask
    prediction.sum().backward()


def test_a_module_that_computes_nothing():
    class Stateless(torch.nn.Module):
        def forward(self, x):
            return x

    x = torch.randn(3, requires_grad=True)
    assert OrtModule(Stateless())(x) is x


def test_none_among_the_outputs():
    class WithNone(MLP):
        def forward(self, input1):
            return self.fc1(input1), None, {"a": None, "b": self.fc2(self.relu(self.fc1(input1)))}

    torch.manual_seed(0)
    wrapped, eager = _pair(WithNone())
    x = torch.randn(3, 12)
    for model in (wrapped, eager, _twin(eager)):
        out, nothing, rest = model(x)
        assert nothing is None and rest["a"] is None
        (out.sum() + rest["b"].sum()).backward()
    _grads_match(wrapped, eager)


Named = namedtuple("Named", "loss logits hidden_states")


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor
    hidden_states: torch.Tensor | None = None


@pytest.mark.parametrize(
    "kind", [dict, OrderedDict, Named, Output, "dict_of_tuples", "tuple_of_tuples"]
)
def test_structured_outputs(kind):
    class Structured(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList(torch.nn.Linear(12, 3) for _ in range(3))

        def forward(self, a, b, c):
            o = [h(x) for h, x in zip(self.heads, (a, b, c), strict=True)]
            if kind == "dict_of_tuples":
                return {"loss": (o[0], o[1], o[2])}
            if kind == "tuple_of_tuples":
                return (o[0], o[1]), o[2]
            if kind in (dict, OrderedDict):
                return kind([("loss", o[0]), ("logits", o[1]), ("hidden_states", o[2])])
            return kind(o[0], o[1], o[2])

    torch.manual_seed(0)
    wrapped, eager = _pair(Structured())
    xs = [torch.randn(4, 12) for _ in range(3)]
    outs = [model(*xs) for model in (wrapped, eager, _twin(eager))]
    assert type(outs[0]) is type(outs[1])
    for out in outs:
        leaves = torch.utils._pytree.tree_leaves(out)
        sum(leaf.sum() * (i + 1) for i, leaf in enumerate(leaves)).backward()
    leaves = [torch.utils._pytree.tree_leaves(out) for out in outs]
    for i, (a, b, b64) in enumerate(zip(*leaves, strict=True)):
        _close(a, b, b64, f"output leaf {i}")
    _grads_match(wrapped, eager)


def test_custom_class_output_is_refused_naming_it():
    class Custom:
        def __init__(self, out):
            self.out = out

    class Net(MLP):
        def forward(self, input1):
            return Custom(self.fc1(input1))

    with pytest.raises(ExportError, match="returns a Custom"):
        OrtModule(Net())(torch.randn(2, 12))


def test_in_place_update_of_an_output_its_gradient_reads_is_caught():
    class Soft(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(12, 4)

        def forward(self, x):
            return torch.softmax(self.fc(x), dim=1)

    for model in (Soft(), OrtModule(Soft())):
        y = model(torch.randn(3, 12, requires_grad=True))
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


# ------------------------------------------------------------------ several calls and modules
def test_nested_and_overlapping_forward_backward_calls():
    torch.manual_seed(0)
    wrapped, eager = _pair(MLP())
    xs = [torch.randn(4, 12) for _ in range(2)]
    pending = {}
    runs = (
        ("ort", wrapped, torch.float32),
        ("eager", eager, torch.float32),
        ("64", _twin(eager), torch.float64),
    )
    for name, model, dtype in runs:
        ins = [x.to(dtype, copy=True).requires_grad_(True) for x in xs]
        first = model(ins[0]).sum()
        second = model(ins[1]).sum()
        second.backward()
        first.backward()
        pending[name] = ins
    for i, (a, b, b64) in enumerate(
        zip(pending["ort"], pending["eager"], pending["64"], strict=True)
    ):
        _close(a.grad, b.grad, b64.grad, f"input {i}'s gradient")
    _grads_match(wrapped, eager)


def test_modules_chained_shared_and_mixed_with_torch():
    torch.manual_seed(0)
    backbone, head1, head2, plain = MLP(12, 16, 12), MLP(12, 8, 3), MLP(12, 8, 3), MLP(12, 8, 12)
    ref = [backbone, head1, head2, plain]
    ort = [_pair(m)[0] for m in (backbone, head1, head2)] + [copy.deepcopy(plain)]
    ref64 = [_twin(m) for m in ref[:3]] + [Float64Twin(plain)]
    x1, x2 = torch.randn(5, 12), torch.randn(5, 12)
    for b, h1, h2, p in (ort, ref, ref64):
        h1(b(x1)).sum().backward()
        h2(torch.sin(b(x2)) + torch.cos(p(x1))).sum().backward()
    for a, b in zip(ort[:3], ref[:3], strict=True):
        _grads_match(a, b)
    params = zip(
        ort[3].named_parameters(), plain.parameters(), ref64[3].module.parameters(), strict=True
    )
    for (n, a), b, b64 in params:
        _close(a.grad, b.grad, b64.grad, n)


def test_forward_only_calls_and_batch_sizes_that_change():
    torch.manual_seed(0)
    wrapped, eager = _pair(MLP())
    for n in (7, 1, 33, 7):
        x = torch.randn(n, 12)
        with torch.no_grad():
            _close(wrapped(x), eager(x), _twin(eager)(x), f"output of a batch of {n}")
        for model in (wrapped, eager, _twin(eager)):
            model(x).sum().backward()
        _grads_match(wrapped, eager)
    assert wrapped.exports == 1  # one export serves every batch size


def test_sequential_holding_an_ort_module_trains():
    torch.manual_seed(0)
    inner = torch.nn.Linear(3, 1)
    model = torch.nn.Sequential(OrtModule(copy.deepcopy(inner)), torch.nn.Flatten(0, 1))
    reference64 = torch.nn.Sequential(Float64Twin(inner), torch.nn.Flatten(0, 1))
    reference = torch.nn.Sequential(inner, torch.nn.Flatten(0, 1))
    x = torch.linspace(-3, 3, 50).unsqueeze(-1).pow(torch.tensor([1, 2, 3]))
    y = torch.sin(x[:, 0])
    for m, target in ((model, y), (reference, y), (reference64, y.double())):
        optimizer = torch.optim.SGD(m.parameters(), lr=1e-3)
        for _ in range(20):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(m(x), target).backward()
            optimizer.step()
    params = zip(
        model.named_parameters(), reference.parameters(), reference64.parameters(), strict=True
    )
    for (n, a), b, b64 in params:
        _close(a, b, b64, n)


# ------------------------------------------------------------------ parameters and buffers
@pytest.mark.parametrize("unused", ["begin", "middle", "end"])
def test_unused_parameters_and_buffers(unused):
    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = (
                torch.nn.Linear(12, 8),
                torch.nn.Linear(12 if unused == "begin" else 8, 8),
                (torch.nn.Linear(8, 8)),
            )
            self.register_buffer("buffer", torch.ones(8))

        def forward(self, x):
            if unused == "begin":
                return torch.relu(self.fc2(x)) + self.buffer
            if unused == "middle":
                return self.fc3(torch.relu(self.fc1(x))) + self.buffer
            return torch.relu(self.fc1(x)) + self.buffer

    torch.manual_seed(0)
    wrapped, eager = _pair(Unused())
    x = torch.randn(4, 12)
    for model in (wrapped, eager, _twin(eager)):
        model(x).sum().backward()
    _grads_match(wrapped, eager)


def test_frozen_part_of_the_model():
    torch.manual_seed(0)
    module = MLP()
    module.fc1.requires_grad_(False)
    wrapped, eager = _pair(module)
    x = torch.randn(4, 12)
    for model in (wrapped, eager, _twin(eager)):
        model(x).sum().backward()
    assert wrapped.module.fc1.weight.grad is None
    _grads_match(wrapped, eager)


def test_buffers_registered_on_the_wrapper_are_listed():
    m = OrtModule(MLP())
    m.register_buffer("extra", torch.zeros(3))
    names = [n for n, _ in m.named_buffers()]
    assert "extra" in names and [n for n, _ in m.named_parameters()] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]


# ------------------------------------------------------------------ gradients of specific ops
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_embedding_gradient(padding_idx):
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(16, 8, padding_idx=padding_idx)
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.linear(self.embedding(x))

    torch.manual_seed(0)
    wrapped, eager = _pair(Embed())
    for _ in range(3):
        x = torch.randint(0, 16, (24,))
        x[:3] = 1
        for model in (wrapped, eager, _twin(eager)):
            model(x).sum().backward()
        _grads_match(wrapped, eager)


def test_cross_entropy_inside_the_module_with_padding_and_ignored_index():
    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(16, 12, padding_idx=1)

        def forward(self, x, positions):
            out = torch.transpose(self.embedding(x), 0, 1)
            return torch.nn.functional.cross_entropy(out, positions, ignore_index=out.size(1))

    torch.manual_seed(0)
    wrapped, eager = _pair(Loss())
    x = torch.randint(0, 16, (10,))
    positions = torch.randint(0, 10, (12,))
    positions[0] = 10  # ignored
    for model in (wrapped, eager, _twin(eager)):
        model(x, positions).backward()
    _grads_match(wrapped, eager)


@pytest.mark.parametrize("pool", ["max", "avg", "adaptive"])
def test_pooling_gradients(pool):
    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1, bias=False)
            self.pool = {
                "max": torch.nn.MaxPool2d(3, stride=2, padding=1),
                "avg": torch.nn.AvgPool2d(3, stride=2, padding=1),
                "adaptive": torch.nn.AdaptiveAvgPool2d((3, 4)),
            }[pool]

        def forward(self, x):
            return self.pool(self.conv(x))

    torch.manual_seed(0)
    wrapped, eager = _pair(Pool())
    x = torch.randn(2, 3, 24, 24, dtype=torch.float64).float()
    for model in (wrapped, eager, _twin(eager)):
        model(x).sum().backward()
    _grads_match(wrapped, eager)


def test_argmax_of_bytes_and_unfold():
    class Unfold(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 12)

        def forward(self, x):
            dtype = self.linear.weight.dtype  # float32; float64 in the float64 twin
            scaled = x.argmax(-1).to(dtype) * x.argmax().to(dtype)
            return self.linear(scaled).unfold(dimension=1, size=5, step=3)

    torch.manual_seed(0)
    wrapped, eager = _pair(Unfold())
    x = torch.randint(0, 100, (4, 16, 8), dtype=torch.uint8)
    for model in (wrapped, eager, _twin(eager)):
        model(x).sum().backward()
    _grads_match(wrapped, eager)


@pytest.mark.parametrize(("offset", "dims"), [(-1, (0, 1)), (0, (0, 2)), (1, (1, 2)), (0, (2, 0))])
def test_diagonal_input_gradient(offset, dims):
    class Diagonal(torch.nn.Module):
        def forward(self, x):
            return torch.diagonal(x, offset, *dims)

    x = torch.rand(4, 6, 5)
    grads = []
    for model in (OrtModule(Diagonal()), Diagonal()):
        xi = x.clone().requires_grad_(True)
        (
            model(xi) * torch.arange(1.0, 1.0 + model(x).numel()).reshape(model(x).shape)
        ).sum().backward()
        grads.append(xi.grad)
    assert_equal(*grads, name="x's gradient")  # the weights put back on the diagonal, exact


def test_triangular_mask():
    class Triu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(10, 10)

        def forward(self, x):
            y = self.fc1(x)
            return y * torch.ones_like(y).triu(diagonal=1) + y * torch.triu(torch.ones_like(y))

    torch.manual_seed(0)
    wrapped, eager = _pair(Triu())
    x = torch.ones(1, 10, 10)
    for model in (wrapped, eager, _twin(eager)):
        assert list(model(x).shape) == [1, 10, 10]
        model(x).sum().backward()
    _grads_match(wrapped, eager)

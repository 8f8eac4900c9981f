"""apply_lora: the adapter branch's numbers, the targets per exporter and weight layout, and the refusals."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from support.numerics import assert_close
from support.onnx_models import run_model
from support.reference64 import to64

from onnxblocks.errors import InvalidTypeError, InvalidValueError
from onnxblocks.peft import LoraConfig, apply_lora, lora_info
from onnxblocks.peft.transform import initial_adapters

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((6, 8)).astype(
    np.float32
)  # enc.fc1: [out, in] behind a Transpose (TorchScript)
W2 = RNG.standard_normal((6, 5)).astype(np.float32)  # enc.fc2: [in, out], folded (onnx::MatMul_7)
W3 = RNG.standard_normal((4, 5)).astype(np.float32)  # enc.fc3: Gemm transB=1, [out, in]
B3 = RNG.standard_normal(4).astype(np.float32)
WH = RNG.standard_normal((4, 3)).astype(
    np.float32
)  # head: no scope, weight named head.weight, [in, out]
X = RNG.standard_normal((2, 8)).astype(np.float32)


def _model(dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """Four Linear layers as the exporters write them (TorchScript scopes; the last without one)."""
    nodes = [
        helper.make_node(
            "Transpose", ["enc.fc1.weight"], ["t1"], name="/enc/fc1/Transpose", perm=[1, 0]
        ),
        helper.make_node("MatMul", ["x", "t1"], ["h1"], name="/enc/fc1/MatMul"),
        helper.make_node("Relu", ["h1"], ["r1"], name="/enc/act/Relu"),
        helper.make_node("MatMul", ["r1", "onnx::MatMul_7"], ["h2"], name="/enc/fc2/MatMul"),
        helper.make_node(
            "Gemm", ["h2", "enc.fc3.weight", "enc.fc3.bias"], ["h3"], name="/enc/fc3/Gemm", transB=1
        ),
        helper.make_node("MatMul", ["h3", "head.weight"], ["y"], name="node_7"),
    ]
    inits = {
        "enc.fc1.weight": W1,
        "onnx::MatMul_7": W2,
        "enc.fc3.weight": W3,
        "enc.fc3.bias": B3,
        "head.weight": WH,
    }
    tensors = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    if dtype != onnx.TensorProto.FLOAT:
        tensors[0] = numpy_helper.from_array(W1.astype(np.float16), "enc.fc1.weight")
    graph = helper.make_graph(
        nodes,
        "four",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_branches_add_x_at_a_t_b_t_times_scale_on_every_layout():
    model = _model()
    before = model.SerializeToString()
    config = LoraConfig(
        r=2, lora_alpha=3, target_modules=["fc1", "fc2", "fc3", "head"], init_lora_weights=False
    )
    out = apply_lora(model, config, seed=7)
    assert model.SerializeToString() == before  # the caller's model is not changed
    info = lora_info(out)
    assert info is not None and info.config == config
    layouts = {
        m: (t.weight, t.weight_layout, t.in_features, t.out_features)
        for m, t in info.targets.items()
    }
    assert layouts == {
        "enc.fc1": ("enc.fc1.weight", "out_in", 8, 6),
        "enc.fc2": ("onnx::MatMul_7", "in_out", 6, 5),
        "enc.fc3": ("enc.fc3.weight", "out_in", 5, 4),
        "head": ("head.weight", "in_out", 4, 3),
    }
    values = _initializers(out)
    assert all(values[t.lora_A].shape == (2, t.in_features) for t in info.targets.values())
    assert all(values[t.lora_B].shape == (t.out_features, 2) for t in info.targets.values())

    def expected(dtype):
        """The adapted model in NumPy's ``dtype``."""
        v = {n: a.astype(dtype) for n, a in values.items()}
        x, w1, w2, w3, b3, wh = (a.astype(dtype) for a in (X, W1, W2, W3, B3, WH))
        lora = {m: v[t.lora_A].T @ v[t.lora_B].T * dtype(3 / 2) for m, t in info.targets.items()}
        h1 = x @ w1.T + x @ lora["enc.fc1"]
        r1 = np.maximum(h1, 0)
        h2 = r1 @ w2 + r1 @ lora["enc.fc2"]
        h3 = h2 @ w3.T + b3 + h2 @ lora["enc.fc3"]
        return h3 @ wh + h3 @ lora["head"]

    (got,) = run_model(out, {"x": X})
    assert_close(got, expected(np.float32), expected(np.float64), rtol=1e-5)
    assert {o.name for o in out.graph.output} == {"y"}


def test_initial_adapters_follow_peft():
    """A is U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a=sqrt(5)), B zero; seeded."""
    config = LoraConfig(r=64, target_modules=["fc1"])
    a, b = initial_adapters(config, 400, 3, np.random.default_rng(0))
    assert a.shape == (64, 400) and a.dtype == np.float32 and not b.any() and b.shape == (3, 64)
    assert np.abs(a).max() <= 1 / 20 and np.abs(a).max() > 0.99 / 20
    torch_a = torch.empty(64, 400)
    torch.nn.init.kaiming_uniform_(torch_a, a=5**0.5)
    assert abs(float(torch_a.std()) - float(a.std())) < 0.05 * float(
        a.std()
    )  # the same distribution
    gaussian, _ = initial_adapters(
        LoraConfig(r=4, init_lora_weights="gaussian"), 4000, 3, np.random.default_rng(0)
    )
    assert abs(float(gaussian.std()) - 0.25) < 0.01
    one = apply_lora(_model(), LoraConfig(target_modules=["fc1"]), seed=1)
    two = apply_lora(_model(), LoraConfig(target_modules=["fc1"]), seed=1)
    other = apply_lora(_model(), LoraConfig(target_modules=["fc1"]), seed=2)
    name = "enc.fc1.lora_A.weight"
    assert np.array_equal(_initializers(one)[name], _initializers(two)[name])
    assert not np.array_equal(_initializers(one)[name], _initializers(other)[name])
    (got,) = run_model(one, {"x": X})
    (base,) = run_model(_model(), {"x": X})
    np.testing.assert_array_equal(got, base)  # B = 0: the adapted model starts as the base


def test_regex_and_exclude_modules_follow_peft_matching():
    regex = lora_info(apply_lora(_model(), LoraConfig(target_modules=r"enc\.fc[12]")))
    assert regex is not None and list(regex.targets) == ["enc.fc1", "enc.fc2"]
    excluded = lora_info(
        apply_lora(_model(), LoraConfig(target_modules=["fc1", "fc2"], exclude_modules=["fc2"]))
    )
    assert excluded is not None and list(excluded.targets) == ["enc.fc1"]


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        (["nothing"], r"target_modules=\['nothing'\] matches no module.*enc.fc1"),
        (["act"], r"'enc.act'.*not a Linear layer"),
        (["enc"], r"'enc'.*not a Linear layer"),
        (None, r"target_modules=None: name the modules.*enc.fc1"),
    ],
)
def test_targets_that_cannot_be_adapted_are_refused(targets, match):
    with pytest.raises(InvalidValueError, match=match):
        apply_lora(_model(), LoraConfig(target_modules=targets))


def test_regex_matching_nothing_is_refused():
    with pytest.raises(InvalidValueError, match=r"target_modules='fc\[12\]' matches no module"):
        apply_lora(_model(), LoraConfig(target_modules=r"fc[12]"))


def test_other_refusals():
    with pytest.raises(InvalidValueError, match="float32"):
        apply_lora(_model(onnx.TensorProto.FLOAT16), LoraConfig(target_modules=["fc1"]))
    once = apply_lora(_model(), LoraConfig(target_modules=["fc1"]))
    with pytest.raises(InvalidValueError, match="already carries LoRA adapters"):
        apply_lora(once, LoraConfig(target_modules=["fc2"]))
    with pytest.raises(InvalidTypeError, match="ModelProto"):
        apply_lora("model.onnx", LoraConfig(target_modules=["fc1"]))  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="LoraConfig"):
        apply_lora(_model(), {"r": 8})  # type: ignore[arg-type]
    twice = _model()
    twice.graph.node.append(
        helper.make_node("MatMul", ["y", "head.weight"], ["z"], name="/enc/fc1/MatMul_1")
    )
    with pytest.raises(InvalidValueError, match=r"'enc.fc1' is applied by 2 nodes"):
        apply_lora(twice, LoraConfig(target_modules=["fc1"]))


class _Projections(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = torch.nn.Linear(8, 6, bias=False)
        self.v_proj = torch.nn.Linear(6, 4)
        self.out = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.out(torch.relu(self.v_proj(torch.relu(self.q_proj(x)))))


@pytest.mark.parametrize("exporter", ["ts-folded", "ts", "dynamo"])
def test_targets_from_each_exporter_and_the_adapted_output(exporter):
    """TorchScript with constant folding names the weights onnx::MatMul_N, [in, out]: the scopes name the modules."""
    module = _Projections()
    x = torch.randn(2, 5, 8)
    if exporter == "dynamo":
        model = torch.onnx.export(
            module, (x,), dynamo=True, input_names=["x"], output_names=["y"]
        ).model_proto
    else:
        f = io.BytesIO()
        torch.onnx.export(
            module,
            (x,),
            f,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            do_constant_folding=exporter != "ts",
        )
        model = onnx.load_from_string(f.getvalue())
    out = apply_lora(
        model,
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    info = lora_info(out)
    assert info is not None and list(info.targets) == ["q_proj", "v_proj"]
    widths = {m: (t.in_features, t.out_features) for m, t in info.targets.items()}
    assert widths == {"q_proj": (8, 6), "v_proj": (6, 4)}
    if exporter == "ts-folded":
        assert all(
            t.weight.startswith("onnx::MatMul") and t.weight_layout == "in_out"
            for t in info.targets.values()
        )
    values = _initializers(out)

    def expected(module, x):
        """The adapted module in torch, in the dtype of ``module`` and ``x``."""
        v = {n: torch.from_numpy(a).to(x.dtype) for n, a in values.items()}
        with torch.no_grad():
            h = torch.relu(
                module.q_proj(x)
                + x @ (v["q_proj.lora_A.weight"].T @ v["q_proj.lora_B.weight"].T) * 2
            )
            lora_v = v["v_proj.lora_A.weight"].T @ v["v_proj.lora_B.weight"].T
            return module.out(torch.relu(module.v_proj(h) + h @ lora_v * 2)).numpy()

    (got,) = run_model(out, {"x": x.numpy()})
    assert_close(got, expected(module, x), expected(to64(module), x.double()), rtol=1e-5)


def test_dynamo_namespace_metadata_names_the_module_without_name_scopes():
    """The dynamo exporter's ``namespace`` metadata (module path: class / ... / op) is read too."""
    model = _model()
    for i, node in enumerate(model.graph.node):
        node.name = f"node_{i}"  # no TorchScript scopes
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    gemm.metadata_props.add(
        key="namespace",
        value=": M/enc: Enc/enc.fc3: torch.nn.modules.linear.Linear/linear: aten.linear.default",
    )
    info = lora_info(apply_lora(model, LoraConfig(target_modules=["fc3", "head"])))
    assert info is not None and list(info.targets) == [
        "enc.fc3",
        "head",
    ]  # head: from its weight's name


def test_all_linear_is_every_linear_layer_but_the_output_layer():
    """PEFT's ``all-linear``: the record names the modules it stood for, as PEFT's saved config does."""
    info = lora_info(
        apply_lora(_model(), LoraConfig(target_modules="all-linear", exclude_modules=["fc2"]))
    )
    assert info is not None and list(info.targets) == [
        "enc.fc1",
        "enc.fc3",
    ]  # head: its result is the output
    assert info.config.target_modules == ("enc.fc1", "enc.fc3")
    f = io.BytesIO()
    torch.onnx.export(
        _Projections(),
        (torch.randn(2, 5, 8),),
        f,
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
    )
    info = lora_info(
        apply_lora(onnx.load_from_string(f.getvalue()), LoraConfig(target_modules="ALL-LINEAR"))
    )
    assert info is not None and list(info.targets) == [
        "q_proj",
        "v_proj",
    ]  # out: MatMul + bias Add = the output


def test_linear_nodes_without_a_module_name_are_named_when_targets_match_nothing():
    model = _model()
    for i, node in enumerate(model.graph.node):
        node.name = (
            f"node_{i}"  # no scopes: fc1 and fc3 keep their weights' names, fc2's is onnx::MatMul_7
        )
    with pytest.raises(
        InvalidValueError,
        match=r"1 Linear nodes carry no module name.*'node_3' \(weight 'onnx::MatMul_7'\)",
    ):
        apply_lora(model, LoraConfig(target_modules=["fc2"]))

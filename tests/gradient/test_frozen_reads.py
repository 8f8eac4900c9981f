"""Values without a gradient that several nodes read, or that repeat another constant: generation and gradients.

ONNX Runtime's gradient builders for (Simplified)LayerNormalization and BatchNormalization write
``<input>_grad`` for every input, trained or not, and its optimizer merges the ``Identity`` readers of an
initializer the folded TorchScript export shared (the norm weights of a fresh LLaMA) and equal constants (the
zero biases of batch norms): two nodes then defined one gradient ("Duplicate definition of name (<p>_grad)").
``onnxblocks.gradient.frozen_reads`` gives every reader of such a value a graph input of its own while ONNX
Runtime builds the gradient.

The family: LLaMA (RMSNorm, rotary tables) with LoRA and with frozen norms and embedding, GPT-2 with its tied
embedding frozen, a conv net whose batch norms have a frozen bias or scale (as frozen_params or left constant),
and three LayerNorms sharing one frozen scale and one constant bias through Identity nodes; each model from
TorchScript with constant folding (the defaults), without it, and dynamo. Generation succeeds, and the
gradients of the trained parameters after one step match torch's (float32, with a float64 reference).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support import hf_families
from support.export_cache import shared_export
from support.numerics import assert_close
from support.peft_parity import peft_model
from support.user_exports import EXPORTS, export, initializers
from torch import nn

from onnxblocks import losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

#: gradients are sums over a few hundred products: float32 rounding, with float64 deciding (support.numerics)
RTOL = 1e-4


def _session_gradients(
    directory, batch, parameters: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    session = TrainingSession(directory)
    if parameters:
        session.set_parameters(parameters)
    session.train_step(*batch)
    return session.gradients()


def _torch_gradients(model: nn.Module, inputs, loss, trained, dtype) -> dict[str, np.ndarray]:
    """The gradients of the parameters named in ``trained`` after one forward/backward of ``model`` in ``dtype``."""
    model = copy.deepcopy(model).to(dtype).train()
    named = dict(model.named_parameters())
    for name, param in named.items():
        param.requires_grad_(name in trained)
    args = [
        torch.from_numpy(v).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v)
        for v in inputs.values()
    ]
    loss(model(*args)).backward()
    return {n: named[n].grad.numpy() for n in trained}


def _compare(
    actual: dict[str, np.ndarray], torch_names: dict[str, tuple[str, bool]], model, inputs, loss
):
    trained = set(torch_names)
    expected = _torch_gradients(model, inputs, loss, trained, torch.float32)
    expected64 = _torch_gradients(model, inputs, loss, trained, torch.float64)
    for name, (onnx_name, transposed) in torch_names.items():
        grad = actual[onnx_name].T if transposed else actual[onnx_name]
        assert_close(grad, expected[name], expected64[name], rtol=RTOL, name=name)


# ------------------------------------------------------------------ LLaMA, GPT-2
CELLS = [("llama", e, m) for e in EXPORTS for m in ("lora", "frozen")] + [
    ("gpt2", e, "frozen") for e in EXPORTS
]
#: what trains in the "frozen" cells; the norms and the embeddings are frozen_params
ATTENTION = (
    "self_attn.q_proj.",
    "self_attn.k_proj.",
    "self_attn.v_proj.",
    "self_attn.o_proj.",
    "attn.c_attn.",
)
FROZEN = ("norm.weight", "embed_tokens.", "wte.", "wpe.", "ln_1.", "ln_2.", "ln_f.")


@pytest.mark.parametrize(
    ("name", "how", "mode"),
    [pytest.param(*c, id="-".join(c)) for c in CELLS],
)
def test_language_models_with_frozen_norms_and_embeddings_train_like_torch(
    name, how, mode, tmp_path
):
    family = hf_families.make(name)
    model = shared_export((__name__, name, how), lambda: export(family.model, family.inputs, how))
    batch = [*family.inputs.values(), family.target]
    loss = lambda out: hf_families.torch_loss(family, out)  # noqa: E731
    if mode == "lora":
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        artifacts = generate_artifacts(
            model, loss=hf_families.onnxblocks_loss(family), optimizer=OptimType.AdamW, artifact_directory=tmp_path,
            lora=config,
        )  # fmt: skip
        info = lora_info(artifacts.training_model)
        rng = np.random.default_rng(3)
        adapters = {
            n: (0.3 * rng.standard_normal(v.shape)).astype(np.float32)
            for n, v in TrainingSession(artifacts.directory).parameters().items()
        }
        actual = _session_gradients(artifacts.directory, batch, adapters)
        torch_model = peft_model(family, info, adapters)
        names = {}
        for module, target in info.targets.items():
            names[f"{module}.lora_A.default.weight"] = (target.lora_A, False)
            names[f"{module}.lora_B.default.weight"] = (target.lora_B, False)
        _compare(actual, names, torch_model, family.inputs, loss)
        return
    trained = initializers(
        model, family.model, lambda n: any(p in n for p in ATTENTION) and n.endswith("weight")
    )
    held = initializers(model, family.model, lambda n: any(p in n for p in FROZEN), required=False)
    frozen = sorted({o for o, _ in held.values()})
    artifacts = generate_artifacts(
        model, requires_grad=sorted({o for o, _ in trained.values()}), frozen_params=frozen,
        loss=hf_families.onnxblocks_loss(family), optimizer=OptimType.AdamW, artifact_directory=tmp_path,
    )  # fmt: skip
    assert set(artifacts.frozen_params) == set(frozen)
    _compare(
        _session_gradients(artifacts.directory, batch), trained, family.model, family.inputs, loss
    )


# ------------------------------------------------------------------ batch norms
class ConvNet(nn.Module):
    """Three conv + batch-norm blocks: their fresh scales (ones) and biases (zeros) are equal constants.

    The convolutions have no bias: a batch norm in training mode cancels it (its gradient is rounding noise).
    """

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(3 if i == 0 else 4, 4, 3, padding=1, bias=False) for i in range(3)
        )
        self.norms = nn.ModuleList(nn.BatchNorm2d(4) for _ in range(3))
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = torch.relu(norm(conv(x)))
        return self.fc(x.mean((2, 3)))


BN_CELLS = [
    pytest.param(
        f,
        left,
        how,
        id=f"{f}-{left}-{how}",
    )
    for f, left in [("bias", "frozen_params"), ("bias", "constant"), ("weight", "constant")]
    for how in EXPORTS[:3]  # dynamo's optimizer folds training batch norms into the convolutions
]


@pytest.mark.parametrize(("frozen", "left", "how"), BN_CELLS)
def test_batch_norms_with_a_frozen_bias_or_scale_train_like_torch(how, frozen, left, tmp_path):
    torch.manual_seed(0)
    net = ConvNet().train()
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    target = rng.integers(0, 3, (2,)).astype(np.int64)
    # the same seeded net in every cell: one export per exporter
    model = shared_export(
        (__name__, "convnet", how), lambda: export(net, inputs, how, training=True)
    )
    params = {i.name for i in model.graph.initializer}
    kept = [
        n for n, _ in net.named_parameters() if not (n.startswith("norms.") and n.endswith(frozen))
    ]
    assert set(kept) <= params, f"the export renamed parameters: {sorted(set(kept) - params)}"
    still = [n for n, _ in net.named_parameters() if n not in kept]
    artifacts = generate_artifacts(
        model, requires_grad=kept, frozen_params=still if left == "frozen_params" else None,
        loss=losses.CrossEntropyLoss(), optimizer=OptimType.AdamW, artifact_directory=tmp_path,
    )  # fmt: skip
    actual = _session_gradients(artifacts.directory, [inputs["x"], target])
    loss = lambda out: nn.functional.cross_entropy(out, torch.from_numpy(target))  # noqa: E731
    _compare(actual, {n: (n, False) for n in kept}, net, inputs, loss)


# ------------------------------------------------------------------ three norms, one frozen scale
def test_three_layer_norms_sharing_a_frozen_scale_and_a_constant_bias_train_like_torch(tmp_path):
    """Two readers were handled by an Identity per reader, which ONNX Runtime merges again for three."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    s = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h0"]),
        helper.make_node("Identity", ["b"], ["b1"]),
        helper.make_node("Identity", ["b"], ["b2"]),
        helper.make_node("LayerNormalization", ["h0", "s", "b"], ["h1"]),
        helper.make_node("LayerNormalization", ["h1", "s", "b1"], ["h2"]),
        helper.make_node("LayerNormalization", ["h2", "s", "b2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w", w), ("s", s), ("b", b))]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 6])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [vi("x")], [vi("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    artifacts = generate_artifacts(
        model, requires_grad=["w"], frozen_params=["s"], loss=losses.MSELoss(), optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
    )  # fmt: skip
    training = onnx.load(artifacts.training_model)
    inputs = [i.name for i in training.graph.input]
    assert not [n for n in inputs if ".alias" in n], (
        inputs
    )  # the aliases are gone, the inputs documented
    x = rng.standard_normal((3, 6)).astype(np.float32)
    t = rng.standard_normal((3, 6)).astype(np.float32)
    actual = _session_gradients(artifacts.directory, [x, t])

    def gradient(dtype):
        wt = torch.from_numpy(w).to(dtype).requires_grad_()
        st, bt = torch.from_numpy(s).to(dtype), torch.from_numpy(b).to(dtype)
        h = torch.from_numpy(x).to(dtype) @ wt
        for _ in range(3):
            h = nn.functional.layer_norm(h, (6,), st, bt)
        nn.functional.mse_loss(h, torch.from_numpy(t).to(dtype)).backward()
        return wt.grad.numpy()

    assert_close(actual["w"], gradient(torch.float32), gradient(torch.float64), rtol=RTOL, name="w")

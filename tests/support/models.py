"""Tiny torch models of four families and their ONNX exports, shared by the training tests.

Families: an MLP, a CNN (Conv, BatchNorm, ReLU, MaxPool, Dropout), a GPT-style
transformer (token + position Embedding, LayerNorm, causal self-attention, GELU)
and a GRU. Each is exported with both torch exporters:

* ``"torchscript"``: ``torch.onnx.export(..., dynamo=False, do_constant_folding=False)``
* ``"dynamo"``: ``torch.onnx.export(..., dynamo=True, optimize=False)`` (with the
  default optimisations the dynamo exporter folds and merges initializers).

plus onnxscript-authored versions of the MLP and the GPT block. Exports are
cached per process so a test session exports each model once.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnxscript import FLOAT, INT64, script
from onnxscript import opset17 as op

from support.torch_export import export_onnx

OPSET = 17


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 4, hidden: int = 8, d_out: int = 3) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    def __init__(self, dropout: float = 0.0, classes: int = 3) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.MaxPool2d(2)
        self.drop = torch.nn.Dropout(dropout)
        self.fc = torch.nn.Linear(4 * 3 * 3, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(torch.flatten(h, 1)))


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.register_buffer(
            "mask", torch.tril(torch.ones(block, block, dtype=torch.bool)), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        hd = d // self.heads
        q = q.reshape(b, t, self.heads, hd).transpose(1, 2)
        k = k.reshape(b, t, self.heads, hd).transpose(1, 2)
        v = v.reshape(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / hd**0.5)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class GPT(torch.nn.Module):
    """One transformer block with token/position embeddings; returns logits ``[B*T, vocab]``."""

    def __init__(self, vocab: int = 11, d: int = 8, heads: int = 2, block: int = 5) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(block, d)
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 2 * d)
        self.out = torch.nn.Linear(2 * d, d)
        self.lnf = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("positions", torch.arange(block), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos(self.positions[:t])
        x = x + self.attn(self.ln1(x))
        x = x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))
        logits = self.head(self.lnf(x))
        return logits.reshape(b * t, -1)


class GRUNet(torch.nn.Module):
    def __init__(self, d_in: int = 3, hidden: int = 4, d_out: int = 2) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(d_in, hidden, batch_first=True)
        self.fc = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class LSTMNet(torch.nn.Module):
    def __init__(self, d_in: int = 3, hidden: int = 4, d_out: int = 2) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(d_in, hidden, batch_first=True)
        self.fc = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class TwoHeads(torch.nn.Module):
    """A tanh trunk and two heads (3 and 2 outputs); the torch tests' loss reads the first only."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(4, 8)
        self.a = torch.nn.Linear(8, 3)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.trunk(x))
        return self.a(h), self.b(h)


@dataclass
class Case:
    """A torch model, one batch of inputs and targets, and its ONNX export."""

    name: str
    torch_model: torch.nn.Module
    inputs: dict[str, np.ndarray]
    target: np.ndarray
    onnx_model: onnx.ModelProto
    loss: str
    params: list[str] = field(default_factory=list)

    def torch_inputs(self) -> list[torch.Tensor]:
        return [torch.from_numpy(v) for v in self.inputs.values()]


def _seed(seed: int) -> np.random.Generator:
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def family(name: str) -> tuple[torch.nn.Module, dict[str, np.ndarray], np.ndarray, str]:
    """A fresh torch model of a family, a batch, a target and the fitting loss name."""
    rng = _seed(0)
    if name == "mlp":
        model = MLP()
        x = rng.standard_normal((6, 4)).astype(np.float32)
        return model, {"x": x}, rng.standard_normal((6, 3)).astype(np.float32), "mse"
    if name == "cnn":
        model = CNN()
        with torch.no_grad():  # non-trivial running statistics
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 1.5)
        x = rng.standard_normal((4, 1, 6, 6)).astype(np.float32)
        return model, {"x": x}, rng.integers(0, 3, 4).astype(np.int64), "cross_entropy"
    if name == "gpt":
        model = GPT()
        idx = rng.integers(0, 11, (2, 5)).astype(np.int64)
        return model, {"idx": idx}, rng.integers(0, 11, 10).astype(np.int64), "cross_entropy"
    if name == "gru":
        model = GRUNet()
        x = rng.standard_normal((3, 4, 3)).astype(np.float32)
        return model, {"x": x}, rng.standard_normal((3, 2)).astype(np.float32), "l1"
    if name == "lstm":
        model = LSTMNet()
        x = rng.standard_normal((3, 4, 3)).astype(np.float32)
        return model, {"x": x}, rng.standard_normal((3, 2)).astype(np.float32), "huber"
    raise KeyError(name)


def export(
    model: torch.nn.Module, inputs: dict[str, np.ndarray], exporter: str, train_mode: bool = True
) -> onnx.ModelProto:
    """Export with one of the torch exporters, with every folding/merging optimisation off."""
    if exporter not in ("torchscript", "dynamo"):
        raise KeyError(exporter)
    model.train(train_mode)
    result = export_onnx(
        model,
        inputs,
        dynamo=exporter == "dynamo",
        opset=OPSET if exporter == "torchscript" else None,
        dynamic_axes={n: {0: "batch"} for n in inputs},
        training=train_mode,
    )
    model.train(train_mode)
    return result


@functools.cache
def _case(name: str, exporter: str) -> Case:
    model, inputs, target, loss = family(name)
    if exporter == "onnxscript":
        onnx_model = onnxscript_model(name, model)
    else:
        onnx_model = export(model, inputs, exporter)
    params = [n for n, _ in model.named_parameters()]
    return Case(f"{name}-{exporter}", model, inputs, target, onnx_model, loss, params)


def case(name: str, exporter: str) -> Case:
    """A cached export; the returned ModelProto must not be mutated (tests copy it if needed)."""
    return _case(name, exporter)


def param_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


# ---------------------------------------------------------------- onnxscript models
def onnxscript_model(name: str, torch_model: torch.nn.Module) -> onnx.ModelProto:
    """The family's forward written in onnxscript, with the torch model's weights as initializers."""
    if name == "mlp":
        model = _onnxscript_mlp()
    elif name == "gpt":
        model = _onnxscript_gpt(torch_model)
    else:
        raise KeyError(f"no onnxscript version of {name}")
    inits = []
    for n, p in torch_model.named_parameters():
        array = p.detach().numpy()
        inits.append(numpy_helper.from_array(array.copy(), n))
    model.graph.initializer.extend(inits)
    return model


@script()
def _mlp_script(
    x: FLOAT["N", 4],  # noqa: UP037, F821 - onnxscript shapes, not quoted annotations
    fc1_w: FLOAT[8, 4],
    fc1_b: FLOAT[8],
    fc2_w: FLOAT[3, 8],
    fc2_b: FLOAT[3],
) -> FLOAT["N", 3]:  # noqa: UP037, F821
    h = op.Relu(op.Gemm(x, fc1_w, fc1_b, transB=1))
    return op.Gemm(h, fc2_w, fc2_b, transB=1)


def _onnxscript_mlp() -> onnx.ModelProto:
    model = _mlp_script.to_model_proto()
    return _rename_inputs_to_initializers(
        model,
        {"fc1_w": "fc1.weight", "fc1_b": "fc1.bias", "fc2_w": "fc2.weight", "fc2_b": "fc2.bias"},
    )


D, HEADS, HD = 8, 2, 4  # literal in the script below
SCALE = float(1.0 / HD**0.5)


@script()
def _gpt_script(
    idx: INT64["B", "T"],  # noqa: UP037, F821 - onnxscript shapes
    tok: FLOAT,
    pos: FLOAT,
    ln1_w: FLOAT,
    ln1_b: FLOAT,
    qkv_w: FLOAT,
    qkv_b: FLOAT,
    proj_w: FLOAT,
    proj_b: FLOAT,
    ln2_w: FLOAT,
    ln2_b: FLOAT,
    fc_w: FLOAT,
    fc_b: FLOAT,
    out_w: FLOAT,
    out_b: FLOAT,
    lnf_w: FLOAT,
    lnf_b: FLOAT,
    head_w: FLOAT,
    head_b: FLOAT,
) -> FLOAT["BT", 11]:  # noqa: UP037, F821
    shape = op.Shape(idx)
    b = op.Slice(shape, [0], [1])
    t = op.Slice(shape, [1], [2])
    positions = op.Range(0, op.Squeeze(t), 1)
    x = op.Add(op.Gather(tok, idx), op.Gather(pos, positions))
    h = op.LayerNormalization(x, ln1_w, ln1_b, axis=-1, epsilon=1e-5)
    qkv = op.Add(op.MatMul(h, op.Transpose(qkv_w, perm=[1, 0])), qkv_b)
    q, k, v = op.Split(qkv, op.Constant(value_ints=[8, 8, 8]), axis=2)
    heads_shape = op.Concat(b, t, op.Constant(value_ints=[2, 4]), axis=0)
    q = op.Transpose(op.Reshape(q, heads_shape), perm=[0, 2, 1, 3])
    k = op.Transpose(op.Reshape(k, heads_shape), perm=[0, 2, 3, 1])
    v = op.Transpose(op.Reshape(v, heads_shape), perm=[0, 2, 1, 3])
    att = op.Mul(op.MatMul(q, k), SCALE)
    ones = op.Expand(op.Constant(value_float=1.0), op.Concat(t, t, axis=0))
    causal = op.Trilu(ones, upper=0)
    att = op.Where(op.Equal(causal, 0.0), op.Constant(value_float=float("-inf")), att)
    att = op.Softmax(att, axis=-1)
    y = op.Transpose(op.MatMul(att, v), perm=[0, 2, 1, 3])
    y = op.Reshape(y, op.Concat(b, t, op.Constant(value_ints=[8]), axis=0))
    x = op.Add(x, op.Add(op.MatMul(y, op.Transpose(proj_w, perm=[1, 0])), proj_b))
    h = op.LayerNormalization(x, ln2_w, ln2_b, axis=-1, epsilon=1e-5)
    h = op.Add(op.MatMul(h, op.Transpose(fc_w, perm=[1, 0])), fc_b)
    h = op.Mul(op.Mul(h, 0.5), op.Add(op.Erf(op.Div(h, 1.4142135623730951)), 1.0))
    x = op.Add(x, op.Add(op.MatMul(h, op.Transpose(out_w, perm=[1, 0])), out_b))
    h = op.LayerNormalization(x, lnf_w, lnf_b, axis=-1, epsilon=1e-5)
    logits = op.Add(op.MatMul(h, op.Transpose(head_w, perm=[1, 0])), head_b)
    return op.Reshape(logits, op.Constant(value_ints=[-1, 11]))


def _onnxscript_gpt(torch_model: torch.nn.Module) -> onnx.ModelProto:
    assert torch_model.tok.embedding_dim == D and torch_model.attn.heads == HEADS
    model = _gpt_script.to_model_proto()
    names = {
        "tok": "tok.weight",
        "pos": "pos.weight",
        "ln1_w": "ln1.weight",
        "ln1_b": "ln1.bias",
        "qkv_w": "attn.qkv.weight",
        "qkv_b": "attn.qkv.bias",
        "proj_w": "attn.proj.weight",
        "proj_b": "attn.proj.bias",
        "ln2_w": "ln2.weight",
        "ln2_b": "ln2.bias",
        "fc_w": "fc.weight",
        "fc_b": "fc.bias",
        "out_w": "out.weight",
        "out_b": "out.bias",
        "lnf_w": "lnf.weight",
        "lnf_b": "lnf.bias",
        "head_w": "head.weight",
        "head_b": "head.bias",
    }
    return _rename_inputs_to_initializers(model, names)


def _rename_inputs_to_initializers(
    model: onnx.ModelProto, names: dict[str, str]
) -> onnx.ModelProto:
    """Drop the weight inputs of an onnxscript function model and rename their uses to parameter names."""
    keep = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    old_output = model.graph.output[0].name
    names[old_output] = "output"
    model.graph.output[0].name = "output"
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in names:
                node.input[i] = names[name]
        for i, name in enumerate(node.output):
            if name == old_output:
                node.output[i] = "output"
    return model


# ---------------------------------------------------------------- ONNX Runtime training API
class OrtTrainer:
    """ONNX Runtime's training API (C bindings) on a set of artifacts: checkpoint state, Module, Optimizer."""

    def __init__(
        self, artifacts, optimizer: bool = True, checkpoint: str | os.PathLike | None = None
    ) -> None:
        from onnxruntime.capi import _pybind_state as C

        from onnxblocks._core.ort import session_options

        self.C = C
        self.state = C.load_checkpoint(os.fspath(checkpoint or artifacts.checkpoint))
        self.device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
        self.module = C.Module(
            os.fspath(artifacts.training_model),
            self.state,
            os.fspath(artifacts.eval_model),
            self.device,
            session_options(),  # the library's: ONNXBLOCKS_ORT_THREADS sets the thread count
        )
        self.optimizer = None
        if optimizer and artifacts.optimizer_model is not None:
            self.optimizer = C.Optimizer(
                os.fspath(artifacts.optimizer_model), self.state, self.device, session_options()
            )

    def train_step(self, *inputs: np.ndarray) -> list[np.ndarray]:
        fetches = self.C.OrtValueVector()
        self.module.train_step(list(inputs), fetches)
        return [f.numpy() for f in fetches]

    def eval_step(self, *inputs: np.ndarray) -> list[np.ndarray]:
        fetches = self.C.OrtValueVector()
        self.module.eval_step(list(inputs), fetches)
        return [f.numpy() for f in fetches]

    def step(self) -> None:
        self.optimizer.optimizer_step()
        self.module.lazy_reset_grad()

    def grad(self, name: str) -> np.ndarray:
        return self.state.get_parameter(name).grad.numpy()

    def param(self, name: str) -> np.ndarray:
        return self.state.get_parameter(name).data.numpy()


def torch_loss(kind: str) -> torch.nn.Module:
    return {
        "mse": torch.nn.MSELoss(),
        "cross_entropy": torch.nn.CrossEntropyLoss(),
        "l1": torch.nn.L1Loss(),
        "huber": torch.nn.HuberLoss(),
        "smooth_l1": torch.nn.SmoothL1Loss(),
        "bce": torch.nn.BCEWithLogitsLoss(),
        "nll": torch.nn.NLLLoss(),
        "kl_div": torch.nn.KLDivLoss(reduction="mean"),
    }[kind]


LOSS_TYPES = {
    "mse": "MSELoss",
    "cross_entropy": "CrossEntropyLoss",
    "l1": "L1Loss",
    "huber": "HuberLoss",
    "smooth_l1": "SmoothL1Loss",
    "bce": "BCEWithLogitsLoss",
    "nll": "NLLLoss",
    "kl_div": "KLDivLoss",
}


#: The (family, exporter) pairs the model-family tests train.
FAMILY_CASES = [
    ("mlp", "torchscript"),
    ("mlp", "dynamo"),
    ("mlp", "onnxscript"),
    ("cnn", "torchscript"),
    ("cnn", "dynamo"),
    ("gpt", "torchscript"),
    ("gpt", "dynamo"),
    ("gpt", "onnxscript"),
    ("gru", "torchscript"),
    ("gru", "dynamo"),
    ("lstm", "torchscript"),
    ("lstm", "dynamo"),
]

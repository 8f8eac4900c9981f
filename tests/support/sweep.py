"""The exporter-sweep cases: small torch models of many families, their exports, and a cached ``generate_artifacts``.

``make_case(name)`` gives the torch model, inputs, target and loss; ``export(case, exporter)``
exports it (``ts``: TorchScript at opset 17; ``dyn18`` / ``dyn21``: dynamo at opset 18 / 21);
``build(name, exporter, directory)`` generates AdamW artifacts with every float parameter
trainable (cached per arguments). ``CASES`` lists the (model, exporter) pairs of the sweep.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnxscript import FLOAT, script
from onnxscript import opset18 as op
from torch import nn

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from support import models
from support.torch_export import export_onnx, initializer_names
from support.torch_export import quiet as quiet

D = 8


# ------------------------------------------------------------------ models
class Head(nn.Module):
    """``body`` then flatten and a Linear classifier."""

    def __init__(self, body: nn.Module, features: int, classes: int = 3) -> None:
        super().__init__()
        self.body = body
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.body(x), 1))


class Activation(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = act
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(3 * self.fc1(x)))


class Encoder(nn.Module):
    """A TransformerEncoderLayer with an optional padding or causal mask."""

    def __init__(
        self, norm_first: bool = False, activation: str = "relu", mask: str | None = None
    ) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            D, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first, activation=activation
        )
        self.mask = mask
        self.fc = nn.Linear(D, 3)

    def forward(self, x, pad=None):
        if self.mask == "pad":
            h = self.layer(x, src_key_padding_mask=pad)
        elif self.mask == "causal":
            h = self.layer(
                x,
                src_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[1]),
                is_causal=True,
            )
        else:
            h = self.layer(x)
        return self.fc(h).reshape(-1, 3)


class GPT2(nn.Module):
    """Token and position embeddings, causal SDPA, tanh-GELU MLP, LM head tied to the token embedding."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, D)
        self.wpe = nn.Embedding(6, D)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.fc = nn.Linear(D, 4 * D)
        self.proj = nn.Linear(4 * D, D)
        self.lm_head = nn.Linear(D, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        q, k, v = self.c_attn(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, 2, D // 2).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, D))
        x = x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return self.lm_head(self.lnf(x)).view(b * t, -1)


class Recurrent(nn.Module):
    def __init__(self, kind: str, layers: int = 2, bidirectional: bool = True, **options) -> None:
        super().__init__()
        self.rnn = getattr(nn, kind)(
            3, 4, num_layers=layers, bidirectional=bidirectional, batch_first=True, **options
        )
        self.fc = nn.Linear(8 if bidirectional else 4, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class ResidualMLP(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc_in = nn.Linear(4, D)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Dropout(p)) for _ in range(2)
        )
        self.fc_out = nn.Linear(D, 3)

    def forward(self, x):
        h = self.fc_in(x)
        for block in self.blocks:
            h = h + block(h)
        return self.fc_out(h)


class TwoHeads(nn.Module):
    """Two outputs: the loss reads the first, the second is an additional output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.cls = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.cls(h), self.aux(h)


class NormNoBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.ln = nn.LayerNorm(8, elementwise_affine=False)
        self.ln2 = nn.LayerNorm(8, bias=False)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.ln2(self.ln(self.fc1(x))))


class UNet(nn.Module):
    """Conv, MaxPool, bilinear Upsample and a skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.mid = nn.Conv2d(4, 4, 3, padding=1, padding_mode="replicate")
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        d = torch.relu(self.down(x))
        m = torch.relu(self.mid(F.max_pool2d(d, 2)))
        return self.out(torch.cat([d, self.up(m)], 1)).flatten(1)


class Indexing(nn.Module):
    """flip, amax, sign, nearest upsampling: ops rewritten with Gather, TopK, Where, Expand."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(2 * 8 + 4, 3)

    def forward(self, x):
        h = self.fc1(x)
        image = F.interpolate(
            h.reshape(-1, 1, 4, 4), scale_factor=2, mode="nearest"
        )  # [B, 1, 8, 8]
        peaks = image.amax(dim=-1).flatten(1)  # [B, 8]
        flipped = torch.flip(peaks, dims=[-1]) * torch.sign(peaks)
        return self.fc2(
            torch.cat([peaks, flipped, h[:, :4].amin(dim=0, keepdim=True).expand(h.shape[0], 4)], 1)
        )


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    model: nn.Module
    inputs: dict[str, np.ndarray]
    target: np.ndarray
    loss: str
    multi: bool = False
    random: bool = False
    external: bool = False
    frozen: list[str] = field(default_factory=list)
    train_only: tuple[
        str, ...
    ] = ()  # name prefixes of the trained parameters; the others stay constants


def make_case(name: str) -> Case:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def classes(n, c=3):
        return rng.integers(0, c, n).astype(np.int64)

    image, sequence, rows = {"x": f32(2, 4, 8, 8)}, {"x": f32(2, 5, D)}, {"x": f32(6, 4)}
    if name == "encoder_prenorm_gelu":
        return Case(
            Encoder(norm_first=True, activation="gelu"), sequence, classes(10), "cross_entropy"
        )
    if name == "encoder_padding_mask":
        pad = np.zeros((2, 5), bool)
        pad[0, 3:] = True
        return Case(
            Encoder(mask="pad"), {"x": sequence["x"], "pad": pad}, classes(10), "cross_entropy"
        )
    if name == "encoder_causal":
        return Case(Encoder(mask="causal"), sequence, classes(10), "cross_entropy")
    if name == "gpt2_tied":
        return Case(
            GPT2(),
            {"idx": rng.integers(0, 11, (2, 6)).astype(np.int64)},
            classes(12, 11),
            "cross_entropy",
        )
    if name == "conv_transpose2d":
        body = nn.Sequential(
            nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
            nn.Tanh(),
            nn.AvgPool2d(4),
        )
        return Case(Head(body, 32), image, classes(2), "cross_entropy")
    if name == "conv_transpose1d_groups_crop":
        body = nn.Sequential(
            nn.ConvTranspose1d(4, 4, 3, stride=2, padding=2, output_padding=1, groups=2), nn.ReLU()
        )
        return Case(Head(body, 4 * 18), {"x": f32(2, 4, 10)}, classes(2), "cross_entropy")
    if name == "avg_pools":
        body = nn.Sequential(
            nn.Conv2d(4, 4, 3, padding=1),
            nn.MaxPool2d(2),
            nn.AvgPool2d(2),
            nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
            nn.AdaptiveAvgPool2d(1),
        )
        return Case(Head(body, 4), image, classes(2), "cross_entropy")
    if name == "group_norm":
        body = nn.Sequential(
            nn.Conv2d(4, 4, 3), nn.GroupNorm(2, 4), nn.SiLU(), nn.AdaptiveAvgPool2d(1)
        )
        return Case(Head(body, 4), image, classes(2), "cross_entropy")
    if name == "instance_norm2d":
        body = nn.Sequential(nn.Conv2d(4, 4, 3), nn.InstanceNorm2d(4, affine=True), nn.ReLU())
        return Case(Head(body, 144), image, classes(2), "cross_entropy")
    if name == "instance_norm1d":
        body = nn.Sequential(nn.Conv1d(4, 4, 3), nn.InstanceNorm1d(4), nn.ReLU())
        return Case(Head(body, 32), {"x": f32(2, 4, 10)}, classes(2), "cross_entropy")
    if name == "layer_norm_without_bias":
        return Case(NormNoBias(), rows, f32(6, 3), "mse")
    if name in ("gru_bidirectional", "lstm_bidirectional"):
        kind = name.split("_")[0].upper()
        return Case(Recurrent(kind), {"x": f32(3, 4, 3)}, f32(3, 2), "mse")
    if name == "rnn_relu":
        return Case(
            Recurrent("RNN", bidirectional=False, nonlinearity="relu"),
            {"x": f32(3, 4, 3)},
            f32(3, 2),
            "mse",
        )
    if name.startswith("act_"):
        act = ACTIVATIONS[name[4:]]
        return Case(Activation(act), rows, f32(6, 3), "mse")
    if name == "dropout":
        return Case(ResidualMLP(0.5), rows, classes(6), "cross_entropy", random=True)
    if name == "two_outputs":
        return Case(
            TwoHeads(),
            rows,
            classes(6),
            "cross_entropy",
            multi=True,
            frozen=["aux.weight", "aux.bias"],
        )
    if name == "unet":
        return Case(UNet(), image, f32(2, 2 * 64), "mse")
    if name == "indexing":
        return Case(Indexing(), rows, f32(6, 3), "mse")
    if (
        name == "encoder_head_only"
    ):  # post-norm layers then a final LayerNorm, all of them constants
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0, batch_first=True),
            2,
            norm=nn.LayerNorm(D),
            enable_nested_tensor=False,
        )
        return Case(
            Head(encoder, 5 * D), sequence, classes(2), "cross_entropy", train_only=("fc.",)
        )
    if name == "external_data":
        return Case(Activation(nn.ELU()), rows, f32(6, 3), "mse", external=True)
    raise KeyError(name)


ACTIVATIONS = {
    "elu": nn.ELU(),
    "selu": nn.SELU(),
    "celu": nn.CELU(0.5),
    "hardswish": nn.Hardswish(),
    "hardsigmoid": nn.Hardsigmoid(),
    "prelu": nn.PReLU(8),
    "mish": nn.Mish(),
    "hardshrink": nn.Hardshrink(0.3),
    "softshrink": nn.Softshrink(0.3),
}

CASES = [
    *[
        (n, "ts")
        for n in (
            "conv_transpose2d",
            "conv_transpose1d_groups_crop",
            "avg_pools",
            "group_norm",
            "instance_norm2d",
            "instance_norm1d",
            "gru_bidirectional",
            "lstm_bidirectional",
            "rnn_relu",
            "two_outputs",
            "external_data",
            "unet",
            "indexing",
            "encoder_head_only",
            *[f"act_{a}" for a in ACTIVATIONS if a != "mish"],
        )
    ],
    *[
        (n, "dyn18")
        for n in (
            "gpt2_tied",
            "encoder_causal",
            "conv_transpose2d",
            "group_norm",
            "instance_norm1d",
            "layer_norm_without_bias",
            "lstm_bidirectional",
            "dropout",
            "act_mish",
            "act_hardswish",
            "act_elu",
            "unet",
            "indexing",
        )
    ],
    *[(n, "dyn21") for n in ("group_norm", "encoder_prenorm_gelu")],
    ("encoder_padding_mask", "ts"),
    ("gpt2_tied", "ts"),
]


#: The graph outputs of a case with one output (False) or two (True: ``Case.multi``).
OUTPUTS = {False: ("output",), True: ("out0", "out1")}


def export(case: Case, exporter: str) -> onnx.ModelProto:
    """Export in training mode (tracing updates BatchNorm statistics of ``case.model``, as the export records)."""
    names = list(case.inputs)
    case.model.train()
    if exporter == "ts":
        return export_onnx(
            case.model,
            case.inputs,
            dynamo=False,
            opset=17,
            outputs=OUTPUTS[case.multi],
            dynamic_axes={n: {0: "batch"} for n in names},
        )
    return export_onnx(
        case.model,
        case.inputs,
        dynamo=True,
        opset=int(exporter[len("dyn") :]),
        outputs=OUTPUTS[case.multi],
    )


def onnx_names(case: Case, model: onnx.ModelProto) -> dict[str, str]:
    """torch parameter name -> initializer name (a tied parameter may be exported under another of its names)."""
    return initializer_names(case.model, model, strict=True)


@functools.cache
def build(name: str, exporter: str, directory: str):
    case = make_case(name)
    model = export(case, exporter)
    names = onnx_names(case, model)
    source: onnx.ModelProto | str = model
    if case.external:
        source = os.path.join(directory, "model", "model.onnx")
        os.makedirs(os.path.dirname(source))
        onnx.save(
            model,
            source,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=0,
        )
    frozen = [names[n] for n in case.frozen]
    extra = (
        {"loss_input_names": ["out0"], "additional_output_names": ["out1"]} if case.multi else {}
    )
    trained = [n for t, n in names.items() if t not in case.frozen and is_trained(case, t)]
    artifacts = generate_artifacts(
        source,
        requires_grad=trained,
        frozen_params=frozen,
        loss=LossType[models.LOSS_TYPES[case.loss]],
        optimizer=OptimType.AdamW,
        artifact_directory=os.path.join(directory, "artifacts"),
        **extra,
    )
    return case, names, artifacts


def is_trained(case: Case, name: str) -> bool:
    return not case.train_only or name.startswith(case.train_only)


def torch_loss(case: Case, model: nn.Module) -> torch.Tensor:
    out = model(*[torch.from_numpy(v) for v in case.inputs.values()])
    return models.torch_loss(case.loss)(
        out[0] if case.multi else out, torch.from_numpy(case.target)
    )


# ------------------------------------------------------------------ authored with onnxscript
@script()
def onnxscript_block(
    x: FLOAT["N", 2, 6, 6],  # noqa: UP037, F821
    w: FLOAT[4, 2, 3, 3],
    b: FLOAT[4],
    s: FLOAT[4],
    beta: FLOAT[4],
) -> FLOAT["N", 4]:  # noqa: UP037, F821
    padded = op.Pad(x, op.Constant(value_ints=[0, 0, 1, 1, 0, 0, 1, 1]), mode="reflect")
    normed = op.InstanceNormalization(op.Conv(padded, w, b), s, beta, epsilon=1e-5)
    up = op.Resize(
        op.Elu(normed, alpha=0.5),
        None,
        op.Constant(value_floats=[1.0, 1.0, 2.0, 2.0]),
        mode="linear",
    )
    peaks = op.ReduceMax(up, op.Constant(value_ints=[3]), keepdims=0)
    return (
        op.ReduceMean(peaks, op.Constant(value_ints=[2]), keepdims=0) * 2.0
    )  # a literal: CastLike


def onnxscript_model() -> onnx.ModelProto:
    model = onnxscript_block.to_model_proto()
    rng = np.random.default_rng(0)
    params = {
        "w": rng.standard_normal((4, 2, 3, 3)) * 0.3,
        "b": rng.standard_normal(4) * 0.1,
        "s": rng.uniform(0.5, 1.5, 4),
        "beta": rng.standard_normal(4) * 0.1,
    }
    inputs = [i for i in model.graph.input if i.name not in params]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(
        onnx.numpy_helper.from_array(v.astype(np.float32), n) for n, v in params.items()
    )
    return model

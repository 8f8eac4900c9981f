"""Portable modes: standard-op artifacts run on ONNX's reference evaluator; ``"onnxruntime"`` keeps contrib ops.

On small models (an MLP, a transformer block with GELU and layer norm, an RMSNorm
block with SiLU, all exported by TorchScript, so ONNX Runtime's fusions emit their
contrib ops while the gradient is built), one fused AdamW step computed by
``onnx.reference.ReferenceEvaluator`` on ``step_model.onnx`` equals ONNX Runtime's run of
the same model within 1e-5 relative: the loss, every updated parameter and moment. With
``portable="onnxruntime"`` the same model keeps contrib ops the evaluator cannot run (and gives the same
step); the CLI's ``--portable [standard|onnxruntime]``; an unknown mode is refused before any work.
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator
from support.numerics import assert_close
from torch import nn

from onnxblocks._core.contracts import LEARNING_RATE, PORTABLE_MODE_METADATA, STEP
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.portable import non_portable_ops

D = 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
        )

    def forward(self, x):
        return self.net(x)


class GeluBlock(nn.Module):
    """Post-norm attention and a GELU MLP: ORT writes Gelu, FusedMatMul, LayerNormalization(Grad), SoftmaxGrad."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            D, 2, 16, dropout=0.0, batch_first=True, activation="gelu"
        )
        self.fc = nn.Linear(D, 3)

    def forward(self, x):
        return self.fc(self.layer(x)).reshape(-1, 3)


class RMSNormBlock(nn.Module):
    """LLaMA's RMSNorm and SiLU MLP: ORT writes SimplifiedLayerNormalization(Grad) and QuickGelu(Grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.linspace(0.5, 1.5, D))
        self.up = nn.Linear(D, 16, bias=False)
        self.down = nn.Linear(16, D, bias=False)
        self.fc = nn.Linear(D, 3)

    def rms(self, x):
        return self.norm * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x):
        h = x + self.down(nn.functional.silu(self.up(self.rms(x))))
        return self.fc(self.rms(h)).reshape(-1, 3)


CASES = {
    "mlp": (MLP, (4, 6), ()),
    "gelu_block": (GeluBlock, (2, 5, D), ("Gelu", "LayerNormalizationGrad")),
    "rmsnorm_block": (RMSNormBlock, (2, 5, D), ("SimplifiedLayerNormalization", "QuickGelu")),
}


def _artifacts(name: str, directory, portable="standard"):
    factory, shape, _ = CASES[name]
    torch.manual_seed(0)
    model = factory().train()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    f = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.from_numpy(x),),
        f,
        input_names=["x"],
        output_names=["y"],
        dynamo=False,
        opset_version=17,
    )
    base = onnx.load_from_string(f.getvalue())
    params = [i.name for i in base.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    artifacts = generate_artifacts(
        base,
        requires_grad=params,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=portable,
    )
    labels = rng.integers(0, 3, (x.size // shape[-1],)).astype(np.int64)
    return artifacts, {"x": x, "labels": labels}, rng


def _feeds(artifacts, batch, rng, step_model: onnx.ModelProto) -> dict[str, np.ndarray]:
    checkpoint = load_checkpoint(artifacts.checkpoint)
    params = {n: np.array(v) for n, v in {**checkpoint.trainable, **checkpoint.frozen}.items()}
    names = [i.name for i in step_model.graph.input]
    inputs = list(batch.values())
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        if name == LEARNING_RATE:
            feeds[name] = np.array([1e-2], np.float32)
        elif name == STEP:
            feeds[name] = np.array(
                [3], np.int64
            )  # a later step: the bias corrections are not 0 and 1
        elif name in params:
            feeds[name] = params[name]
        elif name.endswith(".exp_avg"):
            feeds[name] = (
                rng.standard_normal(params[name[: -len(".exp_avg")]].shape) * 1e-2
            ).astype(np.float32)
        elif name.endswith(".exp_avg_sq"):
            feeds[name] = (
                rng.uniform(size=params[name[: -len(".exp_avg_sq")]].shape) * 1e-4
            ).astype(np.float32)
        else:
            feeds[name] = inputs.pop(0)
    return feeds


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_on_the_reference_evaluator_equals_onnxruntime(name, tmp_path):
    artifacts, batch, rng = _artifacts(name, tmp_path / "a")
    step = onnx.load(artifacts.step_model)
    assert non_portable_ops(step) == []
    assert all(n.domain in ("", "ai.onnx") for n in step.graph.node)
    assert {p.key: p.value for p in step.metadata_props}[PORTABLE_MODE_METADATA] == "standard"
    feeds = _feeds(artifacts, batch, rng, step)
    session = onnxruntime().InferenceSession(
        str(artifacts.step_model), providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, feeds)
    got = ReferenceEvaluator(step).run(None, feeds)
    names = [o.name for o in step.graph.output]
    assert len(names) > 3
    for out, e, g in zip(names, expected, got, strict=True):
        g = np.asarray(g)
        assert g.shape == e.shape and g.dtype == e.dtype, out
        # two float32 implementations: no float64 truth, the floor from each output's size
        assert_close(g, e, rtol=1e-5, name=out)
    moved = [
        n
        for n, e in zip(names, expected, strict=True)
        if n in feeds and not np.array_equal(e, feeds[n])
    ]
    assert not moved  # outputs are new values (p.out), never an input


@pytest.mark.parametrize("name", ["gelu_block", "rmsnorm_block"])
def test_the_onnxruntime_mode_keeps_contrib_ops(name, tmp_path):
    """``portable="onnxruntime"``: the ops ORT's fusions wrote stay, so only onnxruntime runs the step model."""
    artifacts, batch, rng = _artifacts(name, tmp_path / "a", portable="onnxruntime")
    step = onnx.load(artifacts.step_model)
    kept = {
        n.op_type
        for n in step.graph.node
        if n.domain not in ("", "ai.onnx") or n.op_type in CASES[name][2]
    }
    assert set(CASES[name][2]) & kept, kept
    assert non_portable_ops(step, "onnxruntime") == [] and non_portable_ops(step) != []
    assert {p.key: p.value for p in step.metadata_props}[PORTABLE_MODE_METADATA] == "onnxruntime"
    feeds = _feeds(artifacts, batch, rng, step)
    standard, _, _ = _artifacts(name, tmp_path / "s")
    session = onnxruntime().InferenceSession(
        str(artifacts.step_model), providers=["CPUExecutionProvider"]
    )
    reference = onnxruntime().InferenceSession(
        str(standard.step_model), providers=["CPUExecutionProvider"]
    )
    for e, g in zip(reference.run(None, feeds), session.run(None, feeds), strict=True):
        assert_close(g, e, rtol=1e-5)


def test_the_cli_flag_takes_the_mode(tmp_path):
    from onnxblocks.cli import main as cli_main

    torch.manual_seed(0)
    f = io.BytesIO()
    torch.onnx.export(
        GeluBlock().train(),
        (torch.zeros(2, 5, D),),
        f,
        input_names=["x"],
        output_names=["y"],
        dynamo=False,
    )
    path = tmp_path / "model.onnx"
    path.write_bytes(f.getvalue())
    found = {}
    for flag in (["--portable"], ["--portable", "onnxruntime"], ["--portable", "standard"]):
        out = tmp_path / "-".join(flag)
        args = [
            "artifacts",
            str(path),
            "--loss",
            "crossentropy",
            "--all-params",
            *flag,
            "-o",
            str(out),
        ]
        assert cli_main(args) == 0
        step = onnx.load(out / "step_model.onnx")
        found[" ".join(flag)] = {p.key: p.value for p in step.metadata_props}[
            PORTABLE_MODE_METADATA
        ]
        assert (non_portable_ops(step) == []) == (found[" ".join(flag)] == "standard")
        for file in out.glob(
            "*.onnx"
        ):  # the eval model too: ORT's fusions write Gelu into the forward graph
            assert non_portable_ops(onnx.load(file), found[" ".join(flag)]) == [], file.name
    assert found == {
        "--portable": "standard",
        "--portable onnxruntime": "onnxruntime",
        "--portable standard": "standard",
    }


def test_an_unknown_mode_is_refused_before_any_work(tmp_path):
    from onnxblocks.errors import InvalidValueError

    with pytest.raises(
        InvalidValueError, match=r"portable must be True, 'standard'.*'onnxruntime'.*not 'ort'"
    ):
        generate_artifacts(
            "missing.onnx", requires_grad=["w"], artifact_directory=tmp_path / "a", portable="ort"
        )
    assert not (tmp_path / "a").exists()

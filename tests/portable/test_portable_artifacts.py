"""generate_artifacts(..., portable=True) end to end, run with a plain onnxruntime.InferenceSession.

Standard ops run on the training build too, so these tests run in the main
environment (stock onnxruntime under Python 3.13 is tests/portable/test_portable_runtime*).

* 20 AdamW steps with the portable models track the training build's artifacts
  (rtol 1e-5) and torch eager AdamW (rtol 1e-4, or within torch's own float32-vs-float64
  distance): once through the training model
  (accumulated gradients out) and the optimizer model (updated parameters and moments out), once
  through the fused step model; the demo MLP, the CNN and the small GPT.
* The accumulation contract: buffers add up, ``lazy_reset_grad`` overwrites.
* For models of every lowering family of the exporter sweep, the portable
  training model's gradients equal the training build's.
* Files, metadata, the CLI flag, and the errors.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support import models, sweep
from support.numerics import assert_close, is_close
from support.reference64 import gradient_magnitudes

from onnxblocks import demo
from onnxblocks._core.contracts import (
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    PORTABLE_METADATA,
    STEP,
    accumulated_name,
    buffer_name,
    gradient_name,
    moment_names,
    updated_name,
)
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.cli import main as cli_main
from onnxblocks.errors import PortabilityError
from onnxblocks.portable import make_portable, non_portable_ops

LR = 1e-2
STEPS = 20


def _session(path_or_model):
    source = (
        path_or_model.SerializeToString()
        if isinstance(path_or_model, onnx.ModelProto)
        else os.fspath(path_or_model)
    )
    return onnxruntime().InferenceSession(source, providers=["CPUExecutionProvider"])


class PortableTrainer:
    """Portable artifacts on a plain InferenceSession: the training model then the optimizer model per step."""

    def __init__(self, artifacts) -> None:
        self.train = _session(artifacts.training_model)
        self.optimizer = _session(artifacts.optimizer_model)
        checkpoint = load_checkpoint(artifacts.checkpoint)
        self.params = {n: np.array(v) for n, v in checkpoint.trainable.items()}
        self.frozen = {n: np.array(v) for n, v in checkpoint.frozen.items()}
        self.names = list(artifacts.requires_grad)
        self.buffers = {n: np.zeros_like(v) for n, v in self.params.items()}
        self.moments = [[np.zeros_like(self.params[n]) for n in self.names] for _ in range(2)]
        self.step_count = 0
        self.outputs = [o.name for o in self.train.get_outputs()]

    def train_step(self, feeds: dict[str, np.ndarray], reset: bool = True) -> list[np.ndarray]:
        feeds = dict(feeds) | self.params | self.frozen
        feeds |= {buffer_name(n): b for n, b in self.buffers.items()}
        feeds[LAZY_RESET_GRAD] = np.array([reset])
        out = dict(zip(self.outputs, self.train.run(None, feeds), strict=True))
        self.buffers = {n: out[accumulated_name(n)] for n in self.names}
        return [out[o] for o in self.outputs if not o.endswith(".accumulation.out")]

    def step(self) -> None:
        self.step_count += 1
        feeds = {
            LEARNING_RATE: np.array([LR], np.float32),
            STEP: np.array([self.step_count], np.int64),
        }
        for i, name in enumerate(self.names):  # one tensor per parameter, gradient and moment
            first, second = moment_names(name)
            feeds |= {name: self.params[name], gradient_name(name): self.buffers[name]}
            feeds |= {first: self.moments[0][i], second: self.moments[1][i]}
        names = [o.name for o in self.optimizer.get_outputs()]
        out = dict(zip(names, self.optimizer.run(None, feeds), strict=True))
        self.params = {n: out[updated_name(n)] for n in self.names}
        self.moments = [
            [out[updated_name(moment_names(n)[k])] for n in self.names] for k in range(2)
        ]


class StepTrainer:
    """The fused step model: one run per step, parameters and moments in and out."""

    def __init__(self, artifacts) -> None:
        self.session = _session(artifacts.step_model)
        checkpoint = load_checkpoint(artifacts.checkpoint)
        self.state = {n: np.array(v) for n, v in checkpoint.trainable.items()}
        for name in list(self.state):
            for moment in moment_names(name):
                self.state[moment] = np.zeros_like(self.state[name])
        self.frozen = {n: np.array(v) for n, v in checkpoint.frozen.items()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.step_count = 0

    def train_step(self, feeds: dict[str, np.ndarray]) -> float:
        self.step_count += 1
        feeds = dict(feeds) | self.state | self.frozen
        feeds |= {
            LEARNING_RATE: np.array([LR], np.float32),
            STEP: np.array([self.step_count], np.int64),
        }
        out = dict(zip(self.outputs, self.session.run(None, feeds), strict=True))
        self.state = {n: out[updated_name(n)] for n in self.state}
        return float(out[self.outputs[0]])


# ------------------------------------------------------------------ the families
class _DemoMLP(torch.nn.Module):
    """The demo's classifier in torch (Gemm weights are [in, out])."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        weights = {
            i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy())
            for i in model.graph.initializer
        }
        self.layers = torch.nn.ParameterList(
            torch.nn.Parameter(weights[k]) for k in sorted(weights)
        )
        self.names = sorted(weights)

    def forward(self, x):
        params = dict(zip(self.names, self.layers, strict=True))
        count = len(self.names) // 2
        for i in range(1, count + 1):
            x = x @ params[f"fc{i}.weight"] + params[f"fc{i}.bias"]
            x = torch.relu(x) if i < count else x
        return x


def _family(name: str):
    """(onnx model, params, feeds (no target), target, torch model, torch loss)."""
    if name == "demo_mlp":
        model = demo.build_classifier(hidden=(16, 16))
        rng = np.random.default_rng(3)
        x = rng.standard_normal((12, 2)).astype(np.float32)
        target = rng.integers(0, 3, 12).astype(np.int64)
        return (
            model,
            [i.name for i in model.graph.initializer],
            {"features": x},
            target,
            _DemoMLP(model),
            "cross_entropy",
        )
    case = models.case(name, "torchscript")
    return case.onnx_model, case.params, dict(case.inputs), case.target, case.torch_model, case.loss


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name: str):
        if name not in cache:
            model, params, feeds, target, torch_model, loss = _family(name)
            directory = tmp_path_factory.mktemp(name)
            common = {
                "requires_grad": params,
                "loss": LossType[models.LOSS_TYPES[loss]],
                "optimizer": OptimType.AdamW,
            }
            portable = generate_artifacts(
                model, artifact_directory=directory / "portable", portable=True, **common
            )
            training = generate_artifacts(
                model, artifact_directory=directory / "training", **common
            )
            cache[name] = (portable, training, feeds, target, torch_model, loss)
        return cache[name]

    return get


def _feeds(session, feeds: dict[str, np.ndarray], target: np.ndarray) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    label = next(
        n
        for n in names
        if n not in feeds and n not in ("params", LEARNING_RATE, STEP) and "." not in n
    )
    return dict(feeds) | {label: target}


def _torch_losses(torch_model, loss: str, feeds, target, dtype=torch.float32) -> list[float]:
    model = copy.deepcopy(torch_model).train().to(dtype)

    def tensor(value):
        t = torch.from_numpy(value)
        return t.to(dtype) if t.is_floating_point() else t

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        value = models.torch_loss(loss)(model(*[tensor(v) for v in feeds.values()]), tensor(target))
        value.backward()
        optimizer.step()
        losses.append(value.item())
    return losses


FAMILIES = ["demo_mlp", "cnn", "gpt"]


@pytest.mark.parametrize("name", FAMILIES)
def test_portable_models_track_the_training_build_and_torch(built, name):
    portable, training, feeds, target, torch_model, loss = built(name)
    reference = models.OrtTrainer(training)
    reference.optimizer.set_learning_rate(LR)
    split, fused = PortableTrainer(portable), StepTrainer(portable)
    split_feeds = _feeds(split.train, feeds, target)
    step_feeds = _feeds(fused.session, feeds, target)
    expected, got_split, got_fused = [], [], []
    for _ in range(STEPS):
        expected.append(float(reference.train_step(*split_feeds.values())[0]))
        reference.step()
        got_split.append(float(split.train_step(split_feeds)[0]))
        split.step()
        got_fused.append(fused.train_step(step_feeds))
    # two float32 programs of ours against each other: no float64 truth, the floor from the losses' size
    assert_close(
        np.float32(got_split),
        np.float32(expected),
        rtol=1e-5,
        name="split against the training build",
    )
    assert_close(
        np.float32(got_fused),
        np.float32(expected),
        rtol=1e-5,
        name="fused against the training build",
    )
    torch_losses = np.float32(_torch_losses(torch_model, loss, feeds, target))
    torch64 = _torch_losses(torch_model, loss, feeds, target, torch.float64)
    assert_close(
        np.float32(got_fused), torch_losses, torch64, rtol=1e-4, name="fused against torch"
    )
    assert_close(
        np.float32(got_split), torch_losses, torch64, rtol=1e-4, name="split against torch"
    )
    assert torch_losses[-1] < torch_losses[0]


def test_portable_artifact_files_and_metadata(built):
    portable, training, *_ = built("demo_mlp")
    assert sorted(p.name for p in portable.files) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "step_model.onnx",
        "training_model.onnx",
    ]
    assert portable.step_model == portable.directory / "step_model.onnx"
    assert training.step_model is None and not (training.directory / "step_model.onnx").exists()
    for path in (
        portable.training_model,
        portable.eval_model,
        portable.optimizer_model,
        portable.step_model,
    ):
        model = onnx.load(path)
        assert {p.key: p.value for p in model.metadata_props}[PORTABLE_METADATA] == "1", path.name
        assert non_portable_ops(model) == [], path.name
    for path in (training.training_model, training.eval_model, training.optimizer_model):
        assert PORTABLE_METADATA not in {p.key for p in onnx.load(path).metadata_props}
    # the eval model is the training build's, metadata aside
    portable_eval, training_eval = onnx.load(portable.eval_model), onnx.load(training.eval_model)
    assert portable_eval.graph == training_eval.graph
    # the checkpoint is the same file
    assert portable.checkpoint.read_bytes() == training.checkpoint.read_bytes()


def test_step_model_signature(built):
    portable, *_ = built("demo_mlp")
    session = _session(portable.step_model)
    params = list(portable.requires_grad)
    names = [i.name for i in session.get_inputs()]
    expected = ["features", "labels", LEARNING_RATE, STEP]
    for p in params:
        expected += [p, *moment_names(p)]
    assert names == expected
    outputs = [o.name for o in session.get_outputs()]
    assert outputs[1:] == [updated_name(n) for p in params for n in (p, *moment_names(p))]


def test_gradient_accumulation_adds_up_and_lazy_reset_overwrites(built):
    portable, training, feeds, target, *_ = built("cnn")
    trainer = PortableTrainer(portable)
    full = _feeds(trainer.train, feeds, target)
    half = {k: v[: len(v) // 2] for k, v in full.items()}
    rest = {k: v[len(v) // 2 :] for k, v in full.items()}
    trainer.train_step(half, reset=True)
    first = dict(trainer.buffers)
    trainer.train_step(rest, reset=False)
    reference = models.OrtTrainer(training)
    reference.train_step(*half.values())
    reference.train_step(*rest.values())  # ORT's Module accumulates too
    # the floor: the |terms| both gradients summed (conv.bias before a training-mode BatchNorm sums to zero)
    half_terms, rest_terms = _magnitudes(built("cnn"), half), _magnitudes(built("cnn"), rest)
    for name in trainer.names:
        both = half_terms[name] + rest_terms[name]
        assert_close(trainer.buffers[name], reference.grad(name), rtol=1e-5, scale=both, name=name)
        assert not is_close(trainer.buffers[name], first[name], rtol=1e-5), name
    trainer.train_step(rest, reset=True)  # overwrites what was accumulated
    single = models.OrtTrainer(training)
    single.train_step(*rest.values())
    for name in trainer.names:
        assert_close(
            trainer.buffers[name], single.grad(name), rtol=1e-5, scale=rest_terms[name], name=name
        )


def _magnitudes(family, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sum of |terms| of each parameter's gradient on ``feeds`` (the features, then the label)."""
    *_, torch_model, loss = family
    *inputs, label = feeds.values()
    return gradient_magnitudes(torch_model, inputs, label, models.torch_loss(loss))


def test_sgd_and_no_fused_step(tmp_path):
    case = models.case("mlp", "torchscript")
    common = {"requires_grad": case.params, "loss": LossType.MSELoss, "optimizer": OptimType.SGD}
    portable = generate_artifacts(
        case.onnx_model, artifact_directory=tmp_path / "p", portable=True, ort_format=True, **common
    )
    assert (tmp_path / "p" / "step_model.ort").is_file()
    unfused = generate_artifacts(
        case.onnx_model,
        artifact_directory=tmp_path / "u",
        portable=True,
        fused_step=False,
        **common,
    )
    assert unfused.step_model is None and not (tmp_path / "u" / "step_model.onnx").exists()
    session = _session(portable.step_model)
    assert [o.name for o in session.get_outputs()][1:] == [
        updated_name(p) for p in portable.requires_grad
    ]
    checkpoint = load_checkpoint(portable.checkpoint)
    feeds = _feeds(session, case.inputs, case.target) | {
        n: np.array(v) for n, v in checkpoint.trainable.items()
    }
    feeds |= {LEARNING_RATE: np.array([0.1], np.float32), STEP: np.array([1], np.int64)}
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    model, model64 = copy.deepcopy(case.torch_model), copy.deepcopy(case.torch_model).double()
    x, y = torch.from_numpy(case.inputs["x"]), torch.from_numpy(case.target)
    torch.nn.functional.mse_loss(model(x), y).backward()
    torch.nn.functional.mse_loss(model64(x.double()), y.double()).backward()
    terms = gradient_magnitudes(
        case.torch_model, [case.inputs["x"]], case.target, torch.nn.MSELoss()
    )
    params64 = dict(model64.named_parameters())
    for name, param in model.named_parameters():
        expected = param.detach().numpy() - 0.1 * param.grad.numpy()
        p64 = params64[name]
        expected64 = p64.detach().numpy() - 0.1 * p64.grad.numpy()
        scale = np.abs(expected64) + 0.1 * terms[name]
        assert_close(
            out[updated_name(name)], expected, expected64, rtol=1e-5, scale=scale, name=name
        )
    # a later non-portable set in the same directory leaves no stale step model
    generate_artifacts(case.onnx_model, artifact_directory=tmp_path / "p", **common)
    assert not any(p.name.startswith("step_model") for p in (tmp_path / "p").iterdir())


def test_cli_portable_flag(tmp_path, capsys):
    case = models.case("mlp", "torchscript")
    path = tmp_path / "model.onnx"
    onnx.save(case.onnx_model, path)
    code = cli_main(
        [
            "artifacts",
            str(path),
            "--loss",
            "mse",
            "--all-params",
            "--portable",
            "-o",
            str(tmp_path / "a"),
        ]
    )
    assert code == 0
    assert "step_model.onnx" in capsys.readouterr().out
    step = onnx.load(tmp_path / "a" / "step_model.onnx")
    assert (
        non_portable_ops(step) == []
        and non_portable_ops(onnx.load(tmp_path / "a" / "training_model.onnx")) == []
    )
    code = cli_main(
        [
            "artifacts",
            str(path),
            "--loss",
            "mse",
            "--all-params",
            "--portable",
            "--no-fused-step",
            "-o",
            str(tmp_path / "b"),
        ]
    )
    assert code == 0 and not (tmp_path / "b" / "step_model.onnx").exists()


def _embedding_model(opset: int) -> onnx.ModelProto:
    table = onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32), "table"
    )
    nodes = [
        helper.make_node("Gather", ["table", "idx"], ["rows"]),
        helper.make_node("ReduceSum", ["rows"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "embedding",
        [helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_a_model_that_cannot_be_made_portable_fails_before_writing(tmp_path):
    target = tmp_path / "artifacts"
    with pytest.raises(PortabilityError, match=r"GatherGrad.*opset 16.*opset_version=17"):
        generate_artifacts(
            _embedding_model(13), requires_grad=["table"], artifact_directory=target, portable=True
        )
    assert not target.exists()
    generate_artifacts(
        _embedding_model(13), requires_grad=["table"], artifact_directory=target
    )  # non-portable works
    artifacts = generate_artifacts(
        _embedding_model(17),
        requires_grad=["table"],
        artifact_directory=tmp_path / "ok",
        portable=True,
    )
    assert artifacts.step_model is None  # no optimizer: no step model


def test_make_portable_does_not_change_its_arguments(built):
    _, training, *_ = built("demo_mlp")
    model, optimizer = onnx.load(training.training_model), onnx.load(training.optimizer_model)
    before = (model.SerializeToString(), optimizer.SerializeToString())
    result = make_portable(model, optimizer)
    assert (model.SerializeToString(), optimizer.SerializeToString()) == before
    assert result.trainable == training.requires_grad
    assert result.lowered  # something was lowered
    with pytest.raises(TypeError, match="training_model must be an onnx.ModelProto"):
        make_portable(str(training.training_model))  # type: ignore[arg-type]


# ------------------------------------------------------------------ every lowering family of the sweep
GRADIENT_CASES = [  # one model per lowering family; the exports are cached for the exporter sweep's tests
    ("unet", "ts"),  # ConvGrad, MaxPoolGrad, Concat/SplitTraining, FusedMatMul
    ("indexing", "ts"),  # GatherElementsGrad, SliceGrad, GatherGrad, BroadcastGradientArgs
    ("group_norm", "ts"),  # DivGrad, QuickGeluGrad, Scale
    ("conv_transpose2d", "dyn18"),  # AveragePoolGrad
    ("conv_transpose1d_groups_crop", "ts"),  # grouped ConvGrad with a remainder
    ("avg_pools", "ts"),
    ("gpt2_tied", "ts"),  # LayerNormalizationGrad, SoftmaxGrad_13, TanhGrad
    ("encoder_padding_mask", "ts"),
    ("gru_bidirectional", "ts"),  # GRUTraining / GRUGrad
    ("lstm_bidirectional", "ts"),  # LSTMTraining / LSTMGrad
    ("rnn_relu", "ts"),
    ("instance_norm1d", "ts"),
]


@pytest.mark.parametrize(
    ("name", "exporter"), GRADIENT_CASES, ids=[f"{n}-{e}" for n, e in GRADIENT_CASES]
)
def test_portable_gradients_equal_the_training_build_across_the_sweep(tmp_path, name, exporter):
    case, onnx_names, artifacts = sweep.build(name, exporter, str(tmp_path))
    made = make_portable(onnx.load(artifacts.training_model), onnx.load(artifacts.optimizer_model))
    session = _session(made.training)
    checkpoint = load_checkpoint(artifacts.checkpoint)
    feeds = dict(case.inputs) | {n: np.array(v) for n, v in checkpoint.trainable.items()}
    feeds |= {n: np.array(v) for n, v in checkpoint.frozen.items()}
    feeds |= {buffer_name(n): np.zeros_like(checkpoint.trainable[n]) for n in made.trainable}
    feeds[LAZY_RESET_GRAD] = np.array([True])
    names = [i.name for i in session.get_inputs()]
    (label,) = [n for n in names if n not in feeds]
    feeds[label] = case.target
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    reference = models.OrtTrainer(artifacts)
    loss = reference.train_step(*case.inputs.values(), case.target)[0]
    if not case.random:
        # the training build against its lowering: no float64 truth; the floor from the |terms| each
        # gradient sums (a convolution's bias before a normalization sums to zero)
        assert_close(out[artifacts.loss_name], loss, rtol=1e-5, name="loss")
        criterion = models.torch_loss(case.loss)
        terms = gradient_magnitudes(
            case.model,
            case.inputs.values(),
            case.target,
            lambda y, t: criterion(y[0] if case.multi else y, t),
        )
        terms = {onnx_names[n]: v for n, v in terms.items() if n in onnx_names}
        for param in made.trainable:
            assert_close(
                out[accumulated_name(param)],
                reference.grad(param),
                rtol=1e-4,
                scale=terms.get(param),
                name=param,
            )


@pytest.mark.parametrize("name", ["cnn", "gpt"])
def test_a_batch_of_another_size_gives_the_training_builds_gradients(built, name):
    """The lowerings keep dynamic dims dynamic: the exported batch size is not baked in."""
    portable, training, feeds, target, *_ = built(name)
    rng = np.random.default_rng(7)
    batch = 3  # exported with 4 images / 2 sequences
    feeds = {k: np.concatenate([v, v])[:batch] for k, v in feeds.items()}
    rows = batch * (feeds["idx"].shape[1] if name == "gpt" else 1)
    target = rng.integers(0, 3 if name == "cnn" else 11, rows).astype(np.int64)
    trainer = PortableTrainer(portable)
    full = _feeds(trainer.train, feeds, target)
    (loss,) = trainer.train_step(full)[:1]
    reference = models.OrtTrainer(training)
    assert_close(loss, reference.train_step(*full.values())[0], rtol=1e-5, name="loss")
    terms = _magnitudes(built(name), full)
    for param in trainer.names:
        assert_close(
            trainer.buffers[param],
            reference.grad(param),
            rtol=1e-4,
            scale=terms.get(param),
            name=param,
        )

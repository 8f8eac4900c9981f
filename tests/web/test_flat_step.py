"""The flat step model (``onnxblocks.web.write_flat_step``) trains as the step model does, bit for bit.

The flat form only cuts the carried tensors (each trainable parameter and its optimizer state) from
one input and joins the updated ones into one output; every other node reads the same values. So
the comparison is exact: over steps that feed each run's outputs to the next, on stock ONNX Runtime
(this venv's), the losses and every carried tensor of the flat model equal the step model's. Cases:
optimizers carrying 2 (AdamW), 1 (SGD with momentum) and 0 (plain SGD) state tensors per parameter,
on a model with a frozen parameter, a scalar and more carried tensors than one ``Split`` takes; and
the demo MLP the browser trains (18 carried tensors). Refusals name the file and say what to do.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxblocks import artifacts, optim
from onnxblocks._core import ort
from onnxblocks.errors import OnnxBlocksError
from onnxblocks.portable.updates import MAX_PIECES
from onnxblocks.web import read_state, spiral_artifacts, spiral_plan, write_flat_step, write_state

STEPS = 6


def _tiny_model() -> onnx.ModelProto:
    """x [N, 3] -> Gemm(w1, b1) -> Relu -> Gemm(w2, b2) * scale + shift (frozen) -> logits [N, 2]."""
    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.normal(size=(3, 5)).astype(np.float32),
        "b1": rng.normal(size=(5,)).astype(np.float32),
        "w2": rng.normal(size=(5, 2)).astype(np.float32),
        "b2": rng.normal(size=(2,)).astype(np.float32),
        "scale": np.array(1.5, np.float32),
        "shift": rng.normal(size=(2,)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["z"]),
        helper.make_node("Mul", ["z", "scale"], ["s"]),
        helper.make_node("Add", ["s", "shift"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        (rng.normal(size=(8, 3)).astype(np.float32), rng.integers(0, 2, 8).astype(np.int64))
        for _ in range(3)
    ]


def _session(path):
    return ort.onnxruntime().InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _train(directory, flat: bool, batches, rates):
    """(losses, carried tensors by name after the steps), feeding each run's outputs to the next."""
    state = read_state(directory / "params.safetensors")
    session = _session(directory / ("flat_step_model.onnx" if flat else "step_model.onnx"))
    names = [i.name for i in session.get_inputs()]
    held = dict(state.parameters)
    for param in state.trainable:
        for moment in (n for n in names if n.startswith(param + ".") and n not in held):
            held[moment] = np.zeros_like(state.trainable[param])
    layout = json.loads(
        session.get_modelmeta().custom_metadata_map.get("onnxblocks.flat_state", "[]")
    )
    if flat:
        for name, _, shape in layout:
            held.setdefault(name, np.zeros(shape, np.float32))
        held["onnxblocks.flat_state"] = np.concatenate([held[n].ravel() for n, _, _ in layout])
    user = [n for n in names if n not in held and n not in ("learning_rate", "step")]
    losses = []
    for step, rate in enumerate(rates):
        feeds = {n: held[n] for n in names if n in held}
        feeds |= dict(zip(user, batches[step % len(batches)], strict=True))
        feeds["learning_rate"] = np.array([rate], np.float32)
        feeds["step"] = np.array([step + 1], np.int64)
        out = dict(
            zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True)
        )
        losses.append(out[session.get_outputs()[0].name])
        for name, value in out.items():
            if name.endswith(".out"):
                held[name.removesuffix(".out")] = value
    if flat:
        flat_state = held["onnxblocks.flat_state"]
        for name, offset, shape in layout:
            size = int(np.prod(shape))
            held[name] = flat_state[offset : offset + size].reshape(shape)
    return np.array(losses), held, layout


@pytest.mark.parametrize(
    "optimizer, carried_per_param",
    [
        (optim.AdamW(weight_decay=0.01), 3),
        (optim.SGD(lr=0.1, momentum=0.9), 2),
        (optim.SGD(lr=0.1), 1),
    ],
    ids=["adamw", "sgd-momentum", "sgd"],
)
def test_the_flat_step_model_trains_bit_for_bit_as_the_step_model(
    tmp_path, optimizer, carried_per_param
):
    trained = ["w1", "b1", "w2", "b2", "scale"]
    artifacts.generate_artifacts(
        _tiny_model(),
        requires_grad=trained,
        frozen_params=["shift"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optimizer,
        artifact_directory=tmp_path,
        portable=True,
    )
    write_state(tmp_path)
    before = (tmp_path / "step_model.onnx").read_bytes()
    write_flat_step(tmp_path)
    assert (tmp_path / "step_model.onnx").read_bytes() == before  # the step model is not changed

    batches, rates = _batches(), [0.05, 0.04, 0.03, 0.05, 0.02, 0.01][:STEPS]
    losses, held, _ = _train(tmp_path, False, batches, rates)
    flat_losses, flat_held, layout = _train(tmp_path, True, batches, rates)
    carried = [name for name, _, _ in layout]
    assert len(carried) == carried_per_param * len(trained)
    assert set(trained) <= set(carried) and "shift" not in carried  # frozen stays its own input
    assert np.array_equal(flat_losses, losses), (flat_losses, losses)
    for name in carried:
        assert flat_held[name].shape == held[name].shape, name
        assert np.array_equal(flat_held[name], held[name]), name
    assert losses[-1] != losses[0]  # it trained

    model = onnx.load(tmp_path / "flat_step_model.onnx")
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert "onnxblocks.flat_state" in inputs and not set(carried) & set(inputs)
    assert outputs[-1] == "onnxblocks.flat_state.out"
    assert not {f"{n}.out" for n in carried} & set(outputs)
    arity = [
        len(n.input) if n.op_type == "Concat" else len(n.output)
        for n in model.graph.node
        if n.op_type in ("Concat", "Split")
    ]
    assert max(arity) <= MAX_PIECES  # WebGPU binds at most 8 buffers per kernel


def test_the_demo_mlps_flat_step_equals_its_step_model(tmp_path):
    directory = spiral_artifacts(tmp_path / "artifacts")  # writes flat_step_model.onnx itself
    plan = spiral_plan(epochs=1)
    batches = [plan.batch(i) for i in range(STEPS)]
    rates = [float(r) for r in plan.learning_rates[:STEPS]]
    losses, held, _ = _train(directory, False, batches, rates)
    flat_losses, flat_held, layout = _train(directory, True, batches, rates)
    assert len(layout) == 18  # 6 parameters and AdamW's two moments each
    assert np.array_equal(flat_losses, losses)
    for name, _, _ in layout:
        assert np.array_equal(flat_held[name], held[name]), name


def test_write_flat_step_refuses_what_it_cannot_flatten(tmp_path):
    with pytest.raises(OnnxBlocksError, match="step_model.onnx.*portable=True"):
        write_flat_step(tmp_path)
    artifacts.generate_artifacts(
        _tiny_model(),
        requires_grad=["w1", "b1"],
        frozen_params=["w2", "b2", "scale", "shift"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim.AdamW(),
        artifact_directory=tmp_path,
        portable=True,
    )
    flat = write_flat_step(tmp_path)
    (tmp_path / "step_model.onnx").write_bytes(flat.read_bytes())  # a flat model as the step model
    with pytest.raises(OnnxBlocksError, match="flat already"):
        write_flat_step(tmp_path)


def test_node_trains_the_flat_step_model_as_the_step_model(tmp_path):
    """onnxruntime-node: the client picks the flat model on the CPU, ``--no-flat`` the step model;
    the losses and the saved states are the same bits.
    """
    from support import web_support

    from onnxblocks.runtime import TrainingSession
    from onnxblocks.web import read_safetensors, write_safetensors

    try:
        js = web_support.workspace(tmp_path / "client")
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))
    directory = spiral_artifacts(tmp_path / "artifacts")
    plan = spiral_plan(epochs=1)
    names = TrainingSession(directory).input_names
    tensors = {
        f"train/{i}/{name}": value
        for i in range(4)
        for name, value in zip(names, plan.batch(i), strict=True)
    }
    rates = [float(r) for r in plan.learning_rates[:10]]
    write_safetensors(tmp_path / "plan.safetensors", tensors, {"learning_rates": json.dumps(rates)})
    reports, states = {}, {}
    for form, extra in (("flat", []), ("step", ["--no-flat"])):
        reports[form] = web_support.run_node(
            js, "bin/onnxblocks-train.mjs", str(directory),
            "--plan", str(tmp_path / "plan.safetensors"),
            "--save", str(tmp_path / f"{form}.safetensors"), *extra,
        )  # fmt: skip
        states[form], _ = read_safetensors(tmp_path / f"{form}.safetensors")
    assert reports["flat"]["stepModel"] == "flat_step_model.onnx"
    assert reports["step"]["stepModel"] == "step_model.onnx"
    assert reports["flat"]["losses"] == reports["step"]["losses"]
    assert len(reports["flat"]["losses"]) == 10
    assert states["flat"].keys() == states["step"].keys()
    for name, value in states["step"].items():
        assert np.array_equal(states["flat"][name], value), name

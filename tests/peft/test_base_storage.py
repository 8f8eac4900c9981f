"""A frozen base stored once: ``base_weights.bin``, shared by every model of an artifact set.

The model: ``y = relu(x @ W1) @ W2`` where only the head ``W2`` trains and ``W1``
(64 KiB) stays a graph constant. Checked here:

* the training, eval and step models all reference ``W1`` in one ``base_weights.bin``
  (a hard link of the source model's ``.data`` file where the layout fits, a copy
  otherwise), and no model has a ``.data`` file of its own;
* the checkpoint holds the trainable head only;
* both backends train exactly as the same model with ``W1`` inline (a ``Constant``
  node), and the first loss is numpy's;
* a corrupted reference (offset past the end, a truncated or missing file, a path
  outside the directory) is refused by name before ONNX Runtime reads it;
* a failed or killed generation leaves the old set whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from support.frozen_base import (
    BACKENDS,
    D,
    batch,
    exported,
    generate,
    losses,
    make_model,
    numpy_loss,
    references,
    weights,
)
from support.numerics import assert_close

import onnxblocks
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.errors import FileMissingError, InvalidValueError
from onnxblocks.runtime import TrainingSession, _ort


# ------------------------------------------------------------------ one file, referenced by every model
@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
def test_the_base_is_stored_once_as_a_hard_link_of_the_source_data(tmp_path, portable):
    source = exported(tmp_path)
    art = generate(source, tmp_path / "art", portable)
    base = tmp_path / "art" / "base_weights.bin"
    assert art.base_weights == base
    assert os.path.samefile(
        base, source.with_name("m.onnx.data")
    )  # a hard link: the same inode, no copy
    models = [art.training_model, art.eval_model] + ([art.step_model] if portable else [])
    w1, _ = weights()
    for model in models:
        refs = references(model)
        assert set(refs) == {"W1"}, (
            model
        )  # the head is a graph input (fed from the checkpoint), not a constant
        location, offset, length = refs["W1"]
        assert location == "base_weights.bin"
        data = np.fromfile(base, dtype=np.float32, count=length // 4, offset=offset).reshape(D, D)
        np.testing.assert_array_equal(data, w1)
    assert not [p.name for p in (tmp_path / "art").iterdir() if p.name.endswith(".data")]
    assert base in art.files


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
def test_a_base_in_memory_is_copied_once_aligned(tmp_path, portable):
    art = generate(make_model(), tmp_path / "art", portable, prefix="p_")
    base = tmp_path / "art" / "p_base_weights.bin"
    assert art.base_weights == base and base.stat().st_nlink == 1
    location, offset, length = references(art.training_model)["W1"]
    assert (location, length) == ("p_base_weights.bin", D * D * 4) and offset % 64 == 0
    assert base.stat().st_size == offset + length  # W1 once, nothing else
    assert references(art.eval_model)["W1"] == (location, offset, length)


def test_unaligned_source_data_is_copied_not_linked(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    model = make_model()
    onnx.save(
        model,
        folder / "m.onnx",
        save_as_external_data=True,
        location="m.onnx.data",
        size_threshold=0,
    )
    # shift every tensor by one byte: a float at an odd offset cannot be mapped where a runtime can read it
    raw = (folder / "m.onnx.data").read_bytes()
    (folder / "m.onnx.data").write_bytes(b"\0" + raw)
    stored = onnx.load(folder / "m.onnx", load_external_data=False)
    for init in stored.graph.initializer:
        for entry in init.external_data:
            if entry.key == "offset":
                entry.value = str(int(entry.value) + 1)
        if not any(e.key == "offset" for e in init.external_data):
            init.external_data.add(key="offset", value="1")
    onnx.save(stored, folder / "m.onnx")
    art = generate(folder / "m.onnx", tmp_path / "art", False)
    assert art.base_weights is not None and not os.path.samefile(
        art.base_weights, folder / "m.onnx.data"
    )
    _assert_numpy_loss(losses(tmp_path / "art", "training", 1)[0])


def _assert_numpy_loss(first: float, base_dtype=None) -> None:
    """The first loss against NumPy's, in float32 and float64 (rtol 1e-5)."""
    expected, expected64 = (numpy_loss(dtype, base_dtype) for dtype in (np.float32, np.float64))
    assert_close(np.float32(first), expected, expected64, rtol=1e-5, name="first loss")


def test_the_checkpoint_holds_only_the_trainable_head(tmp_path):
    art = generate(exported(tmp_path), tmp_path / "art", True)
    checkpoint = load_checkpoint(art.checkpoint)
    assert set(checkpoint.trainable) == {"W2"} and not checkpoint.frozen
    assert art.checkpoint.stat().st_size < D * D * 4  # no base weight inside


def test_regenerating_without_a_large_constant_removes_the_old_base_file(tmp_path):
    generate(make_model(), tmp_path / "art", False)
    assert (tmp_path / "art" / "base_weights.bin").exists()
    art = generate(make_model(inline_base=True), tmp_path / "art", False)
    assert art.base_weights is None and not (tmp_path / "art" / "base_weights.bin").exists()


# ------------------------------------------------------------------ training is unchanged
@pytest.mark.parametrize(("portable", "backend"), BACKENDS, ids=[b for _, b in BACKENDS])
def test_both_backends_train_as_with_the_base_inline(tmp_path, portable, backend):
    generate(exported(tmp_path), tmp_path / "shared", portable)
    art = generate(make_model(inline_base=True), tmp_path / "inline", portable)
    assert art.base_weights is None
    shared, inline = losses(tmp_path / "shared", backend), losses(tmp_path / "inline", backend)
    _assert_numpy_loss(shared[0])
    # two float32 runs of ours: no float64 truth
    assert_close(np.float32(shared), np.float32(inline), rtol=1e-6, name="shared against inline")
    assert shared[-1] < shared[0]


# ------------------------------------------------------------------ corrupted references
def _rewrite_reference(model_path: Path, **changes: str) -> None:
    model = onnx.load(model_path, load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key in changes:
                entry.value = changes[entry.key]
    onnx.save(model, model_path)


@pytest.mark.parametrize(("portable", "backend"), BACKENDS, ids=[b for _, b in BACKENDS])
@pytest.mark.parametrize("corruption", ["offset", "length", "location", "truncated", "missing"])
def test_a_corrupted_reference_is_refused_by_name(tmp_path, portable, backend, corruption):
    art = generate(make_model(), tmp_path / "art", portable)
    base = tmp_path / "art" / "base_weights.bin"
    error: type[Exception] = InvalidValueError
    if corruption == "offset":
        _rewrite_reference(art.eval_model, offset=str(base.stat().st_size))
    elif corruption == "length":
        _rewrite_reference(art.training_model, length="8")
    elif corruption == "location":
        _rewrite_reference(art.training_model, location="../base_weights.bin")
    elif corruption == "truncated":
        os.truncate(base, base.stat().st_size // 2)
    else:
        base.unlink()
        error = FileMissingError
    with pytest.raises(error) as info:
        TrainingSession(tmp_path / "art", backend=backend)
    message = str(info.value)
    assert "'W1'" in message and "model" in message, message
    if corruption != "location":
        assert "base_weights.bin" in message


# ------------------------------------------------------------------ all or nothing
def test_a_failed_generation_keeps_the_old_set_and_its_base(tmp_path, monkeypatch):
    generate(exported(tmp_path), tmp_path / "art", False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    import onnxblocks.io

    monkeypatch.setattr(onnxblocks.io, "save_model", fail)
    with pytest.raises(OSError, match="disk full"):
        generate(make_model(), tmp_path / "art", True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()} == before


_KILLED = """
import os, signal, sys
import onnxblocks, onnxblocks.io
real = onnxblocks.io.save_model
def save_then_die(model, path, *args, **kwargs):
    if str(path).endswith("eval_model.onnx"):  # the base file and the training model are written by now
        os.kill(os.getpid(), signal.SIGKILL)
    return real(model, path, *args, **kwargs)
onnxblocks.io.save_model = save_then_die
onnxblocks.generate_artifacts(sys.argv[1], requires_grad=["W2"], loss=onnxblocks.LossType.L1Loss,
    artifact_directory=sys.argv[2], portable=True)
"""


def test_a_generation_killed_after_writing_the_base_leaves_the_old_set(tmp_path):
    source = exported(tmp_path)
    generate(source, tmp_path / "art", False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED), source, tmp_path / "art"], check=False
    )
    assert run.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".onnxblocks-artifacts-") for p in (tmp_path / "art").iterdir())
    session = TrainingSession(
        tmp_path / "art", backend="training"
    )  # a reader removes the killed run's stage
    assert {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()} == before
    x, y = batch()
    _assert_numpy_loss(float(session.train_step(x, y)[0]))


# ------------------------------------------------------------------ a float16 / bfloat16 base
def _rounded_model(dtype) -> onnx.ModelProto:
    """The model with its base weight rounded to ``dtype`` and back: what a cast base computes."""
    model = make_model()
    w1 = numpy_helper.to_array(model.graph.initializer[0]).astype(dtype).astype(np.float32)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w1, "W1"))
    return model


@pytest.mark.parametrize(("portable", "backend"), BACKENDS, ids=[b for _, b in BACKENDS])
@pytest.mark.parametrize("base_dtype", ["float16", "bfloat16"])
def test_a_cast_base_trains_as_float32_with_the_rounded_weights(
    tmp_path, portable, backend, base_dtype
):
    import ml_dtypes

    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[base_dtype]
    art = generate(exported(tmp_path), tmp_path / "cast", portable, base_dtype=base_dtype)
    generate(_rounded_model(dtype), tmp_path / "rounded", portable)
    assert (
        art.base_weights is not None and art.base_weights.stat().st_size == D * D * 2
    )  # half of float32's
    model = onnx.load(art.training_model, load_external_data=False)
    (w1,) = (i for i in model.graph.initializer if i.name == "W1")
    assert (
        w1.data_type
        == {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[base_dtype]
    )
    assert {p.key: p.value for p in model.metadata_props}["onnxblocks.base_dtype"] == base_dtype
    assert not os.path.samefile(art.base_weights, tmp_path / "src" / "m.onnx.data")
    cast, rounded = losses(tmp_path / "cast", backend), losses(tmp_path / "rounded", backend)
    assert_close(np.float32(cast), np.float32(rounded), rtol=1e-6, name="cast against rounded")
    _assert_numpy_loss(cast[0], dtype)  # NumPy's with the rounded weights ...
    assert np.float32(cast[0]) != numpy_loss()  # ... not float32's


def test_a_cast_base_keeps_trainable_parameters_and_the_checkpoint_in_float32(tmp_path):
    art = generate(make_model(), tmp_path / "art", True, base_dtype="float16")
    checkpoint = load_checkpoint(art.checkpoint)
    assert {n: a.dtype for n, a in checkpoint.trainable.items()} == {"W2": np.float32}
    step = onnx.load(art.step_model, load_external_data=False)
    inputs = {i.name: i.type.tensor_type.elem_type for i in step.graph.input}
    assert inputs["W2"] == TensorProto.FLOAT and inputs["W2.exp_avg"] == TensorProto.FLOAT


def test_a_float16_base_refuses_weights_beyond_its_range(tmp_path):
    model = make_model()
    w1 = numpy_helper.to_array(model.graph.initializer[0]).copy()
    w1[3, 5] = 1e6
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w1, "W1"))
    with pytest.raises(InvalidValueError, match=r"'W1'.*bfloat16"):
        generate(model, tmp_path / "art", False, base_dtype="float16")
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    ("value", "error"), [("int3", InvalidValueError), (16, onnxblocks.errors.InvalidTypeError)]
)
def test_an_unknown_base_dtype_is_refused_before_any_work(tmp_path, value, error):
    with pytest.raises(error, match="base_dtype"):
        generate(make_model(), tmp_path / "art", False, base_dtype=value)
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    "frozen_base", [False, True], ids=["onnxruntime-defaults", "onnxblocks-options"]
)
def test_onnxruntime_keeps_the_cast_base_in_float16(tmp_path, frozen_base):
    """No float32 copy of the base is made when the session opens, even with ONNX Runtime's defaults.

    Every Cast of the base waits for a value known only at run time (the reader's input, here the
    graph input ``x``), so neither constant folding nor an initializer fusion can fold it into a
    float32 initializer that lives as long as the session: the memory the float16 file saved.
    """
    from onnxblocks.runtime import _ort

    art = generate(make_model(), tmp_path / "art", True, base_dtype="float16")
    options = _ort.session_options(prepack=not frozen_base, frozen_base=frozen_base)
    assert (
        options.enable_mem_pattern is not frozen_base
    )  # planned per shape: GiBs with a dynamic sequence
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    _ort.onnxruntime().InferenceSession(
        str(art.step_model), options, providers=["CPUExecutionProvider"]
    )
    optimized = onnx.load(tmp_path / "optimized.onnx", load_external_data=False)
    kinds = {
        i.data_type
        for i in optimized.graph.initializer
        if i.name.startswith("W1") or "W1" in i.name
    }
    casts = sum(n.op_type == "Cast" for n in optimized.graph.node)
    assert TensorProto.FLOAT not in kinds and casts >= 2, (
        kinds,
        casts,
    )  # the forward's reader and the backward's


def _cast_graph(nodes: list, w: np.ndarray, output: str) -> onnx.ModelProto:
    """``nodes`` (input ``x`` [N, w.shape[1]], initializer ``W``) with ``W`` stored in float16 and cast back."""
    import onnx_ir as ir

    from onnxblocks.ir import edit, serde

    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", w.shape[1]])],
        [onnx.helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", w.shape[1]])],
        [numpy_helper.from_array(w, "W")],
    )
    proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8
    )
    model = serde.from_proto(proto)
    assert edit.cast_initializers(
        model.graph, {"W": ir.tensor(w.astype(np.float16), name="W")}
    ) == ["W"]
    cast = serde.to_proto(model)
    onnx.checker.check_model(cast)
    return cast


def test_a_cast_behind_a_chain_of_transposes_waits_for_the_reader_after_them():
    """The backward reads ``Transpose(Transpose(W))``: its cast waits for the MatMul's other input, not for nothing."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Relu", ["x"], ["r"], name="pre"),
        onnx.helper.make_node("Transpose", ["W"], ["Wt"], name="t"),
        onnx.helper.make_node("MatMul", ["r", "Wt"], ["h"], name="forward"),
        onnx.helper.make_node("Tanh", ["h"], ["dy"], name="grad_source"),
        onnx.helper.make_node("Transpose", ["Wt"], ["Wtt"], name="back_t"),
        onnx.helper.make_node("MatMul", ["dy", "Wtt"], ["dx"], name="backward"),
    ]
    cast = _cast_graph(nodes, w, "dx")
    produced = {o: n for n in cast.graph.node for o in n.output}
    triggers = []
    for node in (n for n in cast.graph.node if n.op_type == "Cast"):
        reshape = produced[node.input[0]]  # every cast reads the weight through a Reshape ...
        assert reshape.op_type == "Reshape" and reshape.input[0] == "W"
        triggers.append(
            produced[produced[reshape.input[1]].input[0]].input[0]
        )  # ... waiting for Shape(trigger)
    assert sorted(triggers) == ["dy", "r"]
    x = rng.standard_normal((3, 6)).astype(np.float32)
    got = _ort.onnxruntime().InferenceSession(cast.SerializeToString()).run(None, {"x": x})[0]
    _assert_cast_graph_output(got, x, w)


def _assert_cast_graph_output(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """tanh(relu(x) @ W16^T) @ W16 in NumPy, float32 and float64; the last matmul's |terms| as the floor."""
    w16 = w.astype(np.float16).astype(np.float32)

    def expected(x, w16):
        return np.tanh(np.maximum(x, 0) @ w16.T) @ w16

    x64, w64 = x.astype(np.float64), w16.astype(np.float64)
    terms = np.abs(np.tanh(np.maximum(x64, 0) @ w64.T)) @ np.abs(w64)
    assert_close(got, expected(x, w16), expected(x64, w64), rtol=1e-5, scale=terms)


def test_each_cast_waits_for_its_reader_input(tmp_path):
    model = make_model()
    first = model.graph.node[0]
    first.input[0] = (
        "x_relu"  # the base's reader now reads a computed value: its Cast can wait for it
    )
    model.graph.node.insert(0, onnx.helper.make_node("Relu", ["x"], ["x_relu"], name="pre"))
    art = generate(model, tmp_path / "art", False, base_dtype="float16")
    model = onnx.load(art.training_model, load_external_data=False)
    produced = {o: n for n in model.graph.node for o in n.output}
    casts = [
        n for n in model.graph.node if n.op_type == "Cast" and produced.get(n.input[0]) is not None
    ]
    assert casts, "every Cast of the base reads it through a Reshape"
    for cast in casts:
        reshape = produced[cast.input[0]]
        assert reshape.op_type == "Reshape" and reshape.input[0] == "W1"
        shape = produced[produced[reshape.input[1]].input[0]]  # Concat(Shape(trigger)[0:0], dims)
        assert shape.op_type == "Shape" and shape.input[0] not in {
            i.name for i in model.graph.initializer
        }


def test_a_transposed_base_is_cast_and_transposed_again_for_each_reader():
    """``x @ W^T`` as TorchScript exports a Linear, and ``W`` read again: each reader gets its own Cast."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 5)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Relu", ["x"], ["r"], name="pre"),
        onnx.helper.make_node("Transpose", ["W"], ["Wt"], name="t"),
        onnx.helper.make_node("MatMul", ["r", "Wt"], ["h"], name="first"),
        onnx.helper.make_node("Tanh", ["h"], ["g"], name="mid"),
        onnx.helper.make_node("MatMul", ["g", "W"], ["y"], name="second"),  # and the weight itself
    ]
    cast = _cast_graph(nodes, w, "y")
    ops = [n.op_type for n in cast.graph.node]
    assert (
        ops.count("Cast") == 2 and ops.count("Reshape") == 2
    )  # one per reader, each waiting for its input
    transposes = [n for n in cast.graph.node if n.op_type == "Transpose"]
    assert len(transposes) == 1 and transposes[0].input[0] != "W"  # transposed after the cast
    x = rng.standard_normal((3, 5)).astype(np.float32)
    got = _ort.onnxruntime().InferenceSession(cast.SerializeToString()).run(None, {"x": x})[0]
    _assert_cast_graph_output(got, x, w)

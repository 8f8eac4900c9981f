"""Checkpoints: ORT's C++ loader reads ours bit for bit; inline/nominal files equal ORT's writer byte for byte;
large data streams to <checkpoint>.data in bounded chunks; training continues from a streamed checkpoint."""

from __future__ import annotations

import os
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from support.optim_oracle import (
    FROZEN,
    TRAINABLE,
    OrtTrainer,
    assert_history_close,
    batches,
    optimizer_model,
    parameters_of,
    run_torch,
    tiny_forward,
)
from support.streaming import RecordingSource

import onnxblocks
from onnxblocks._core.weights import TensorSource
from onnxblocks.checkpoint import (
    CheckpointFormatError,
    external_data_path,
    load_checkpoint,
    load_checkpoint_to_model,
    save_checkpoint,
)
from onnxblocks.checkpoint import format as ckformat
from onnxblocks.optim import AdamW


def C():
    from onnxruntime.capi import _pybind_state

    return _pybind_state


def sample_parameters(seed: int = 0) -> tuple[list[TensorProto], list[TensorProto]]:
    """Parameters of every element type a checkpoint holds, including a scalar and an empty tensor."""
    rng = np.random.default_rng(seed)
    trainable = [
        numpy_helper.from_array(rng.standard_normal((7, 5)).astype(np.float32), "dense.weight"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "dense.bias"),
        numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal((3, 2)), "double"),
    ]
    frozen = [
        numpy_helper.from_array(np.arange(-6, 6, dtype=np.int64).reshape(3, 4), "positions"),
        numpy_helper.from_array(rng.integers(0, 255, 33).astype(np.uint8), "bytes"),
        numpy_helper.from_array(np.array([True, False, True]), "mask"),
        numpy_helper.from_array(rng.integers(-9, 9, (2, 2, 2)).astype(np.int32), "int32"),
        numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"),
        helper.make_tensor(
            "typed_fields", TensorProto.FLOAT, [4], [1.5, -2.0, 3.25, 0.0]
        ),  # float_data, not raw
    ]
    return trainable, frozen


def all_tensors(parameters):
    return [*parameters[0], *parameters[1]]


def assert_state_bitwise(state, parameters):
    """ORT's CheckpointState holds exactly the parameters' bytes, with the right trainable flags."""
    trainable_names = {t.name for t in parameters[0]}
    assert sorted(state.parameter_names()) == sorted(t.name for t in all_tensors(parameters))
    for tensor in all_tensors(parameters):
        parameter = state.get_parameter(tensor.name)
        expected = numpy_helper.to_array(tensor)
        got = parameter.data.numpy()
        assert got.dtype == expected.dtype and got.shape == expected.shape, tensor.name
        assert got.tobytes() == expected.tobytes(), tensor.name
        assert parameter.requires_grad == (tensor.name in trainable_names), tensor.name


# --------------------------------------------------------------------------- same bytes as ORT's writer


@pytest.mark.parametrize("nominal", [False, True])
def test_inline_checkpoint_equals_ort_writer_byte_for_byte(tmp_path, nominal):
    parameters = sample_parameters()
    C().save_checkpoint(
        [t.SerializeToString() for t in parameters[0]],
        [t.SerializeToString() for t in parameters[1]],
        os.fspath(tmp_path / "ort"),
        nominal,
    )
    save_checkpoint(parameters, tmp_path / "ours", nominal)
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "ort").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["ort", "ours"]  # no .data, no temp files


def test_inline_checkpoint_loads_bitwise(tmp_path):
    parameters = sample_parameters()
    save_checkpoint(parameters, tmp_path / "ckpt")
    assert_state_bitwise(C().load_checkpoint(os.fspath(tmp_path / "ckpt")), parameters)


def test_nominal_checkpoint_behaves_like_orts(tmp_path):
    parameters = sample_parameters()
    save_checkpoint(parameters, tmp_path / "ckpt", nominal_checkpoint=True)
    state = C().load_checkpoint(os.fspath(tmp_path / "ckpt"))
    assert sorted(state.parameter_names()) == sorted(t.name for t in all_tensors(parameters))
    with pytest.raises(RuntimeError, match="nominal"):
        state.get_parameter("dense.weight")
    ours = load_checkpoint(tmp_path / "ckpt")
    assert ours.is_nominal and list(ours.trainable) == [t.name for t in parameters[0]]
    parsed = ckformat.decode_checkpoint((tmp_path / "ckpt").read_bytes())
    assert all(
        e.dims == () and e.inline[1] == 0 for e in parsed.trainable + parsed.frozen
    )  # names only, no data
    with pytest.raises(ValueError, match="nominal"):
        load_checkpoint_to_model(tmp_path / "ckpt", tiny_forward()[0])


# --------------------------------------------------------------------------- external data


def test_external_data_loads_bitwise_and_matches_ort_semantics(tmp_path):
    parameters = sample_parameters()
    save_checkpoint(parameters, tmp_path / "ckpt", external_data_threshold=0)
    data = external_data_path(tmp_path / "ckpt")
    assert data == tmp_path / "ckpt.data" and data.is_file()
    parsed = ckformat.decode_checkpoint((tmp_path / "ckpt").read_bytes())
    assert (
        parsed.has_external_data
        and not parsed.is_nominal
        and parsed.version == ckformat.CHECKPOINT_VERSION
    )
    external = {e.name for e in parsed.trainable + parsed.frozen if e.external_offset is not None}
    assert external == {
        "dense.weight",
        "positions",
    }  # tensors >= 64 bytes; smaller ones stay inline
    assert_state_bitwise(C().load_checkpoint(os.fspath(tmp_path / "ckpt")), parameters)
    # Same semantics as ORT's own (inline) checkpoint of the same parameters.
    C().save_checkpoint(
        [t.SerializeToString() for t in parameters[0]],
        [t.SerializeToString() for t in parameters[1]],
        os.fspath(tmp_path / "ort"),
        False,
    )
    ort, ours = load_checkpoint(tmp_path / "ort"), load_checkpoint(tmp_path / "ckpt")
    for name in ort:
        assert (
            ours[name].dtype == ort[name].dtype and ours[name].tobytes() == ort[name].tobytes()
        ), name
    assert list(ours.trainable) == list(ort.trainable) and list(ours.frozen) == list(ort.frozen)


def test_threshold_chooses_inline_or_external(tmp_path):
    parameters = sample_parameters()
    total = sum(len(numpy_helper.to_array(t).tobytes()) for t in all_tensors(parameters))
    save_checkpoint(parameters, tmp_path / "at", external_data_threshold=total)
    save_checkpoint(parameters, tmp_path / "below", external_data_threshold=total - 1)
    assert not (tmp_path / "at.data").exists()
    assert (tmp_path / "below.data").exists()
    # Re-saving inline removes the now stale side file.
    save_checkpoint(parameters, tmp_path / "below")
    assert not (tmp_path / "below.data").exists()
    assert_state_bitwise(C().load_checkpoint(os.fspath(tmp_path / "below")), parameters)


def _model_with_external_weights(
    tmp_path: Path, shape=(256, 300)
) -> tuple[onnx.ModelProto, Path, np.ndarray]:
    rng = np.random.default_rng(3)
    big = rng.standard_normal(shape).astype(np.float32)
    model, _ = tiny_forward()
    model.graph.initializer.append(numpy_helper.from_array(big, "big"))
    path = tmp_path / "src" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.data",
        size_threshold=0,
    )
    return onnx.load(path, load_external_data=False), path, big


def test_streams_from_a_models_external_data_file(tmp_path):
    model, path, big = _model_with_external_weights(tmp_path)
    with onnxblocks.base(model, model_path=path) as acc:
        source = acc.weights.source("big")
    assert source.path is not None  # bytes live in model.data, not in memory
    log: list[int] = []
    recording = RecordingSource(
        source.name,
        source.data_type,
        source.dims,
        path=source.path,
        offset=source.offset,
        length=source.length,
        log=log,
    )
    small = [acc.weights.source(n) for n in ("W1", "W2")]
    save_checkpoint(([recording, *small], []), tmp_path / "ckpt", external_data_threshold=1024)
    assert sum(log) == big.nbytes and log  # streamed, chunk by chunk
    state = C().load_checkpoint(os.fspath(tmp_path / "ckpt"))
    assert state.get_parameter("big").data.numpy().tobytes() == big.tobytes()
    assert (tmp_path / "ckpt").stat().st_size < 4096  # the flatbuffer holds metadata only
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert isinstance(loaded.trainable["big"], np.memmap)  # read lazily
    np.testing.assert_array_equal(loaded.trainable["big"], big)


def test_external_tensor_protos_need_base_dir(tmp_path):
    model, path, big = _model_with_external_weights(tmp_path, shape=(8, 8))
    (init,) = [i for i in model.graph.initializer if i.name == "big"]
    with pytest.raises(ValueError, match="base_dir"):
        save_checkpoint(([init], []), tmp_path / "ckpt")
    save_checkpoint(
        ([init], []), tmp_path / "ckpt", base_dir=path.parent, external_data_threshold=0
    )
    assert (
        C()
        .load_checkpoint(os.fspath(tmp_path / "ckpt"))
        .get_parameter("big")
        .data.numpy()
        .tobytes()
        == big.tobytes()
    )


def test_memory_stays_bounded_while_streaming(tmp_path):
    # 48 MiB of parameters from an external data file; the writer never holds more than a chunk or so.
    model, path, big = _model_with_external_weights(tmp_path, shape=(3 * 1024, 4 * 1024))
    with onnxblocks.base(model, model_path=path) as acc:
        source = acc.weights.source("big")
    del big, model
    tracemalloc.start()
    try:
        save_checkpoint(([source], []), tmp_path / "ckpt", external_data_threshold=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert source.nbytes == 48 * 1024 * 1024
    assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"
    assert (tmp_path / "ckpt.data").stat().st_size >= source.nbytes


# --------------------------------------------------------------------------- training from our checkpoints


def test_training_continues_from_a_streamed_checkpoint(training_dir, tmp_path):
    _, params = tiny_forward()
    streamed, inline = tmp_path / "streamed", tmp_path / "inline"
    for d in (streamed, inline):
        d.mkdir()
        onnx.save(optimizer_model(AdamW(), params), d / "optimizer.onnx")
    # Streamed: every parameter comes from a TensorSource and goes through <checkpoint>.data.
    sources = tuple(
        [TensorSource(t.name, t.data_type, tuple(t.dims), tensor=t) for t in group]
        for group in parameters_of(params)
    )
    save_checkpoint(sources, streamed / "checkpoint", external_data_threshold=0)
    save_checkpoint(parameters_of(params), inline / "checkpoint")
    assert (streamed / "checkpoint.data").exists() and not (inline / "checkpoint.data").exists()
    histories = []
    for d in (streamed, inline):
        trainer = OrtTrainer.open(
            training_dir / "training.onnx", d / "checkpoint", d / "optimizer.onnx"
        )
        history = []
        for x, t in batches(3):
            trainer.step(x, t)
            history.append({n: trainer.param(n) for n in TRAINABLE + FROZEN})
        histories.append(history)
        # The trained state saved by ORT (with optimizer state) reads back with our reader.
        C().save_checkpoint(trainer.state, os.fspath(d / "trained"), True)
        trained = load_checkpoint(d / "trained")
        for n in TRAINABLE:
            np.testing.assert_array_equal(trained[n], history[-1][n])
        (group,) = trained.optimizer_state.values()
        assert group["step"] == 3 and set(group["moments"]) == set(TRAINABLE)
    for a, b in zip(*histories, strict=True):
        for n in a:
            assert a[n].tobytes() == b[n].tobytes()

    def adamw(params):
        return torch.optim.AdamW(params, lr=0.05)

    assert_history_close(
        histories[0], run_torch(adamw, 3), run_torch(adamw, 3, dtype=torch.float64)
    )


# --------------------------------------------------------------------------- load_checkpoint_to_model


@pytest.mark.parametrize("threshold", [0, None])
def test_load_checkpoint_to_model(tmp_path, threshold):
    model, params = tiny_forward()
    new = {n: (v * 2 + 1).astype(np.float32) for n, v in params.items()}
    kwargs = {} if threshold is None else {"external_data_threshold": threshold}
    save_checkpoint(parameters_of(new), tmp_path / "ckpt", **kwargs)
    before = model.SerializeToString()
    loaded = load_checkpoint_to_model(tmp_path / "ckpt", model)
    assert model.SerializeToString() == before  # the input is left alone
    for init in loaded.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(init), new[init.name])
    # Same result as ORT's own implementation.
    expected = onnx.load_from_string(
        C().get_model_after_loading_checkpoint(os.fspath(tmp_path / "ckpt"), before)
    )
    for a, b in zip(loaded.graph.initializer, expected.graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_load_checkpoint_to_model_rejects_other_models(tmp_path):
    save_checkpoint(
        ([numpy_helper.from_array(np.zeros((2, 2), np.float32), "W1")], []), tmp_path / "ckpt"
    )
    with pytest.raises(ValueError, match="'W1'.*different model"):
        load_checkpoint_to_model(tmp_path / "ckpt", tiny_forward()[0])


# --------------------------------------------------------------------------- atomicity and errors


@dataclass(frozen=True)
class FailingSource(TensorSource):
    def chunks(self, chunk_bytes=16 * 1024 * 1024):
        yield b"\0" * 64
        raise OSError("disk went away")


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    target = tmp_path / "out"
    target.mkdir()
    parameters = sample_parameters()
    save_checkpoint(parameters, target / "ckpt", external_data_threshold=0)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    failing = FailingSource(
        "w", TensorProto.FLOAT, (64,), tensor=numpy_helper.from_array(np.zeros(64, np.float32))
    )
    with pytest.raises(OSError, match="disk went away"):
        save_checkpoint(([failing], []), target / "ckpt", external_data_threshold=0)
    assert {
        p.name: p.read_bytes() for p in target.iterdir()
    } == before  # old checkpoint intact, no temps
    assert list(elsewhere.iterdir()) == []  # nothing created outside the target directory


@pytest.mark.parametrize(
    ("parameters", "error", "match"),
    [
        ([], TypeError, r"\(trainable, frozen\) pair"),
        (
            (numpy_helper.from_array(np.zeros(2, np.float32), "w"), []),
            TypeError,
            "sequence of tensors",
        ),
        ((["w"], []), TypeError, "str; checkpoints take onnx.TensorProto"),
        (
            (
                [numpy_helper.from_array(np.zeros(2, np.float32), "w")],
                [numpy_helper.from_array(np.zeros(1), "w")],
            ),
            ValueError,
            "'w' appears twice",
        ),
        (
            ([helper.make_tensor("names", TensorProto.STRING, [1], [b"a"])], []),
            ValueError,
            "'names'.*STRING",
        ),
        (
            ([numpy_helper.from_array(np.zeros(2, np.float16), "half")], []),
            ValueError,
            "'half'.*FLOAT16",
        ),
    ],
)
def test_bad_parameters(tmp_path, parameters, error, match):
    with pytest.raises(error, match=match):
        save_checkpoint(parameters, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_stub_is_rejected(tmp_path):
    model, path, _ = _model_with_external_weights(tmp_path, shape=(8, 8))
    with onnxblocks.base(model, model_path=path) as acc:
        (stub,) = [i for i in acc.working_model.graph.initializer if i.name == "big"]
    with pytest.raises(ValueError, match="'big' is an onnxblocks stub"):
        save_checkpoint(([stub], []), tmp_path / "ckpt")


def test_other_bad_calls(tmp_path):
    parameters = sample_parameters()
    with pytest.raises(ValueError, match="external_data_threshold"):
        save_checkpoint(parameters, tmp_path / "ckpt", external_data_threshold=-1)
    with pytest.raises(IsADirectoryError, match="checkpoint \\*file\\*"):
        save_checkpoint(parameters, tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_checkpoint(parameters, tmp_path / "missing" / "ckpt")


def test_reader_rejects_broken_files(tmp_path):
    parameters = sample_parameters()
    save_checkpoint(parameters, tmp_path / "ckpt", external_data_threshold=0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "model.onnx").write_bytes(tiny_forward()[0].SerializeToString())
    with pytest.raises(CheckpointFormatError, match="not an ONNX Runtime training checkpoint"):
        load_checkpoint(tmp_path / "model.onnx")
    data = (tmp_path / "ckpt").read_bytes()
    (tmp_path / "cut").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match="truncated"):
        load_checkpoint(tmp_path / "cut")
    os.replace(tmp_path / "ckpt.data", tmp_path / "moved.data")
    with pytest.raises(FileNotFoundError, match=r"ckpt\.data"):
        load_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt.data").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointFormatError, match="shorter|truncated"):
        load_checkpoint(tmp_path / "ckpt")
    save_checkpoint(parameters, tmp_path / "ok")
    with pytest.raises(KeyError, match="no parameter 'dense.weigth'. Did you mean 'dense.weight'"):
        load_checkpoint(tmp_path / "ok")["dense.weigth"]

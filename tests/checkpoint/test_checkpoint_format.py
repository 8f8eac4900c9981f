"""The checkpoint flatbuffer: flatc-generated accessors match ONNX Runtime 1.19.2's schema, our writer's files load
in ONNX Runtime, and every corrupted file raises CheckpointFormatError (never IndexError, struct.error, ...)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import flatbuffers
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.system_tools import debian_tool

from onnxblocks._core.ort import capi
from onnxblocks.checkpoint import (
    CheckpointFormatError,
    is_checkpoint,
    load_checkpoint,
    read_parameter_names,
    save_checkpoint,
)
from onnxblocks.checkpoint import format as ckformat
from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as fbs

GENERATED = Path(ckformat.__file__).parent / "_generated"


def parameters(seed: int = 0) -> tuple[list[TensorProto], list[TensorProto]]:
    """A few parameters of several element types, including a scalar, an empty tensor and a non-raw one."""
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
        numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"),
        helper.make_tensor("typed_fields", TensorProto.FLOAT, [4], [1.5, -2.0, 3.25, 0.0]),
    ]
    return trainable, frozen


def ort_state(path: Path):
    return capi().load_checkpoint(os.fspath(path))


def ort_names(path: Path) -> tuple[list[str], list[str]]:
    """ORT's view of a checkpoint's (trainable, frozen) names (sorted: ORT keeps them in a map)."""
    state = ort_state(path)
    names = list(state.parameter_names())
    trainable = sorted(n for n in names if state.get_parameter(n).requires_grad)
    return trainable, sorted(n for n in names if n not in trainable)


def ort_all_names(path: Path) -> list[str]:
    """ORT's names of every parameter (all ORT tells of a nominal checkpoint: it refuses get_parameter)."""
    return sorted(ort_state(path).parameter_names())


# --------------------------------------------------------------------------- the generated code


def _schema_facts(source: str) -> set[tuple]:
    """What the layout depends on, from generated Python: each accessor's vtable offset and default, each builder
    function's slot and default, each table's field count and each enum value (formatting-independent)."""
    facts: set[tuple] = set()
    owner = method = None
    for line in source.splitlines():
        if m := re.match(r"class (\w+)\(object\):", line):
            owner, method = m.group(1), None
        elif m := re.match(r"    def (\w+)\(self", line):
            method = m.group(1)
        elif m := re.match(r"def (\w+)\(builder", line):
            owner, method = None, m.group(1)
        if m := re.search(r"self\._tab\.Offset\((\d+)\)", line):
            facts.add((owner, method, "voffset", int(m.group(1))))
        if (
            owner
            and method
            and (m := re.match(r"\s+return (-?[\d.]+|True|False|None|\"\")\s*$", line))
        ):
            facts.add((owner, method, "default", m.group(1)))
        if m := re.search(r"builder\.(Prepend\w+Slot)\((\d+), .*, (.+?)\)\s*$", line):
            facts.add((method, m.group(1), int(m.group(2)), m.group(3)))
        if m := re.search(r"builder\.StartObject\((\d+)\)", line):
            facts.add((method, "fields", int(m.group(1))))
        if owner and (m := re.match(r"    ([A-Za-z]\w*) = (-?\d+)\s*$", line)):
            facts.add((owner, m.group(1), int(m.group(2))))
    return facts


def test_generated_layout_equals_ort_1_19_2_bindings():
    """Our flatc output describes the same checkpoint layout as the Python bindings ORT 1.19.2 ships."""
    spec = importlib.util.find_spec("onnxruntime")
    assert spec is not None and spec.origin is not None
    ort_fbs = Path(spec.origin).parent / "tools" / "ort_format_model" / "ort_flatbuffers_py" / "fbs"
    assert ort_fbs.is_dir(), (
        f"onnxruntime-training 1.19.2 ships its flatbuffers bindings in {ort_fbs}; not found"
    )
    theirs = set().union(*(_schema_facts(p.read_text()) for p in ort_fbs.glob("*.py")))
    ours = _schema_facts((GENERATED / "ort_training_checkpoint_generated.py").read_text())
    checkpoint_tables = {
        "Checkpoint",
        "ModuleState",
        "Tensor",
        "OptimizerGroup",
        "ParameterOptimizerState",
        "PropertyBag",
        "IntProperty",
        "FloatProperty",
        "StringProperty",
        "TensorDataType",
    }
    assert {f[0] for f in ours if f[0] in checkpoint_tables} == checkpoint_tables
    assert ours == theirs
    assert (
        "Tensor",
        "ExternalDataOffset",
        "voffset",
        16,
    ) in ours  # the field ORT 1.19.2 added to ort.fbs
    assert ("Tensor", "ExternalDataOffset", "default", "-1") in ours
    assert fbs.Checkpoint.CheckpointBufferHasIdentifier(b"\0\0\0\0" + ckformat.FILE_IDENTIFIER, 0)


def test_generated_code_is_what_flatc_writes(tmp_path):
    flatc = os.fspath(
        debian_tool(
            "flatbuffers-compiler",
            ["flatc"],
            "Debian 12's flatc 2.0.8 wrote the committed checkpoint code",
        )
    )
    version = subprocess.run(
        [flatc, "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert "2.0.8" in version, (
        f"the committed code is from flatc 2.0.8, not {version.strip()}: regenerate it"
    )
    subprocess.run(
        [
            flatc,
            "--python",
            "--gen-onefile",
            "--gen-all",
            "-o",
            os.fspath(tmp_path),
            os.fspath(GENERATED / "schema" / "ort_training_checkpoint.fbs"),
        ],
        check=True,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "__init__.py",
        "ort_training_checkpoint_generated.py",
    ]
    for p in tmp_path.iterdir():
        assert p.read_bytes() == (GENERATED / p.name).read_bytes(), p.name


def test_format_spells_no_field_slots():
    source = Path(ckformat.__file__).read_text()
    assert not re.search(r"_FIELDS\b|StartObject\(|Prepend\w*Slot\(\s*\d|\.Offset\(\s*\d", source)


# --------------------------------------------------------------------------- round trips through ORT


@pytest.mark.parametrize("kind", ["inline", "external", "nominal"])
def test_round_trip_through_ort(tmp_path, kind):
    params = parameters()
    save_checkpoint(
        params,
        tmp_path / "ckpt",
        nominal_checkpoint=kind == "nominal",
        external_data_threshold=0 if kind == "external" else 2**20,
    )
    assert (tmp_path / "ckpt.data").exists() == (kind == "external")
    state = ort_state(tmp_path / "ckpt")
    ours = load_checkpoint(tmp_path / "ckpt")
    trainable = {t.name for t in params[0]}
    assert (
        sorted(state.parameter_names())
        == sorted(ours)
        == sorted(t.name for t in params[0] + params[1])
    )
    for tensor in params[0] + params[1]:
        if kind == "nominal":
            with pytest.raises(RuntimeError, match="nominal"):
                state.get_parameter(tensor.name)
            assert ours[tensor.name].size == 0
            continue
        assert state.get_parameter(tensor.name).requires_grad == (tensor.name in trainable)
        expected = numpy_helper.to_array(tensor)
        theirs = state.get_parameter(tensor.name).data.numpy()
        for got in (theirs, ours[tensor.name]):
            assert got.dtype == expected.dtype and got.shape == expected.shape, tensor.name
            assert got.tobytes() == expected.tobytes(), tensor.name
    # And back: ORT re-saves what it loaded; we read ORT's file the same.
    capi().save_checkpoint(state, os.fspath(tmp_path / "again"), False)
    again = load_checkpoint(tmp_path / "again")
    assert sorted(again.trainable) == sorted(ours.trainable) and sorted(again.frozen) == sorted(
        ours.frozen
    )
    if kind != "nominal":
        for name in ours:
            assert again[name].tobytes() == ours[name].tobytes()


def test_properties_written_by_ort_read_back(tmp_path):
    save_checkpoint(parameters(), tmp_path / "ckpt")
    state = ort_state(tmp_path / "ckpt")
    state.add_property("epoch", 7)
    state.add_property("loss", 0.5)
    state.add_property("note", "héllo")
    capi().save_checkpoint(state, os.fspath(tmp_path / "with_props"), False)
    assert load_checkpoint(tmp_path / "with_props").properties == {
        "epoch": 7,
        "loss": 0.5,
        "note": "héllo",
    }


# --------------------------------------------------------------------------- read_parameter_names, is_checkpoint


@pytest.mark.parametrize("kind", ["inline", "external", "nominal", "ort"])
def test_read_parameter_names_equals_ort(tmp_path, kind):
    params = parameters()
    path = tmp_path / "ckpt"
    if kind == "ort":
        capi().save_checkpoint(
            [t.SerializeToString() for t in params[0]],
            [t.SerializeToString() for t in params[1]],
            os.fspath(path),
            False,
        )
    else:
        save_checkpoint(
            params,
            path,
            nominal_checkpoint=kind == "nominal",
            external_data_threshold=0 if kind == "external" else 2**20,
        )
    trainable, frozen = read_parameter_names(path)
    assert trainable == [t.name for t in params[0]] and frozen == [
        t.name for t in params[1]
    ]  # file order
    if kind == "nominal":
        assert sorted(trainable + frozen) == ort_all_names(path)
    else:
        assert (sorted(trainable), sorted(frozen)) == ort_names(path)
    assert is_checkpoint(path)
    if kind == "external":  # metadata only: the side file is never opened
        (tmp_path / "ckpt.data").unlink()
        assert read_parameter_names(path) == (trainable, frozen)


def test_is_checkpoint(tmp_path):
    onnx.save(helper.make_model(helper.make_graph([], "g", [], [])), tmp_path / "model.onnx")
    (tmp_path / "short").write_bytes(b"\0\0\0\0OD")
    assert not is_checkpoint(tmp_path / "model.onnx")
    assert not is_checkpoint(tmp_path / "short")
    assert not is_checkpoint(tmp_path / "missing")
    assert not is_checkpoint(tmp_path)


#: How long a read of a FIFO may take before it counts as blocked: generous, a busy machine is no hang.
BLOCKED_S = 120.0


def _returns_within(seconds: float, call):
    """Run ``call`` in a daemon thread; return ('raised', exc) / ('returned', value), or fail if it blocks."""
    outcome: list = []

    def target():
        try:
            outcome.append(("returned", call()))
        except BaseException as exc:
            outcome.append(("raised", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{call} blocked for {seconds} s"
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_raises_promptly(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    try:
        for reader in (load_checkpoint, read_parameter_names):
            how, exc = _returns_within(BLOCKED_S, lambda reader=reader: reader(fifo))
            assert how == "raised" and isinstance(exc, CheckpointFormatError), exc
            assert str(fifo) in str(exc) and "FIFO" in str(exc) and "not a regular file" in str(exc)
        assert _returns_within(BLOCKED_S, lambda: is_checkpoint(fifo)) == ("returned", False)
        from onnxblocks.cli import EXIT_INPUT, main

        how, code = _returns_within(BLOCKED_S, lambda: main(["inspect", os.fspath(fifo)]))
        assert (how, code) == ("returned", EXIT_INPUT)
        assert "not a regular file" in capsys.readouterr().err
        # A checkpoint whose side file is a FIFO: also an error, not a hang.
        save_checkpoint(parameters(), tmp_path / "ckpt", external_data_threshold=0)
        (tmp_path / "ckpt.data").unlink()
        os.mkfifo(tmp_path / "ckpt.data")
        how, exc = _returns_within(BLOCKED_S, lambda: load_checkpoint(tmp_path / "ckpt"))
        assert (
            how == "raised" and isinstance(exc, CheckpointFormatError) and "ckpt.data" in str(exc)
        ), exc
    finally:
        for path in (fifo, tmp_path / "ckpt.data"):
            if path.exists() and not path.is_file():
                try:  # unblock a reader that (wrongly) waits on the FIFO
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
                path.unlink()


# --------------------------------------------------------------------------- targeted corruptions


def _encode(*records: ckformat.TensorRecord) -> bytes:
    """A checkpoint of these trainable tensors, from our writer (which writes whatever the records say)."""
    return bytes(ckformat.encode_checkpoint(records, [], nominal=False, has_external_data=False))


def _record(
    name="w", data_type=TensorProto.FLOAT, dims=(2,), nbytes=8, **kwargs
) -> ckformat.TensorRecord:
    return ckformat.TensorRecord(name, data_type, dims, nbytes, lambda: [b"\1" * nbytes], **kwargs)


def _rejects(tmp_path: Path, data: bytes, *fragments: str) -> str:
    """``data`` fails to load, and to give its names, with a CheckpointFormatError naming the file."""
    path = tmp_path / "broken"
    path.write_bytes(data)
    with pytest.raises(CheckpointFormatError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    with pytest.raises(CheckpointFormatError):
        read_parameter_names(path)
    return message


def _load_bytes(tmp_path: Path, data: bytes):
    (tmp_path / "ok").write_bytes(data)
    return load_checkpoint(tmp_path / "ok")


def test_semantic_checks(tmp_path):
    assert _load_bytes(tmp_path, _encode(_record()))["w"].tobytes() == b"\1" * 8
    _rejects(
        tmp_path, _encode(_record(dims=(3,))), "12", "8 bytes"
    )  # dims product != raw_data length
    _rejects(tmp_path, _encode(_record(dims=(-1, -8))), "negative dimension")
    _rejects(tmp_path, _encode(_record(data_type=99)), "element type 99")
    _rejects(tmp_path, _encode(_record(data_type=TensorProto.FLOAT16, dims=(4,))), "FLOAT16")
    _rejects(tmp_path, _encode(_record(name="")), "no name")
    _rejects(
        tmp_path, _encode(_record(dims=(2**62, 4), nbytes=0)), "need"
    )  # no int64 overflow to 0
    _rejects(tmp_path, _encode(_record(external_offset=0, nbytes=0)), "external data")


def _checkpoint_with_version(version: int) -> bytes:
    """A checkpoint built with the generated builder functions directly."""
    builder = flatbuffers.Builder(64)
    fbs.ModuleStateStart(builder)
    module = fbs.ModuleStateEnd(builder)
    fbs.CheckpointStart(builder)
    fbs.CheckpointAddVersion(builder, version)
    fbs.CheckpointAddModuleState(builder, module)
    builder.Finish(fbs.CheckpointEnd(builder), file_identifier=ckformat.FILE_IDENTIFIER)
    return bytes(builder.Output())


def test_structural_checks(tmp_path):
    assert (
        _load_bytes(tmp_path, _checkpoint_with_version(ckformat.CHECKPOINT_VERSION)).trainable == {}
    )
    _rejects(tmp_path, _checkpoint_with_version(99), "version 99")
    good = _encode(_record(), _record("v"))
    _rejects(tmp_path, good[:4] + b"ORTM" + good[8:], "not an ONNX Runtime training checkpoint")
    _rejects(tmp_path, b"", "not an ONNX Runtime training checkpoint")
    _rejects(
        tmp_path, (2**31).to_bytes(4, "little") + good[4:], "outside"
    )  # root offset past the end
    _rejects(tmp_path, (len(good) - 4).to_bytes(4, "little") + good[4:])
    _rejects(tmp_path, (6).to_bytes(4, "little") + good[4:], "aligned")
    # raw_data's length says more bytes than the file has
    start = ckformat.decode_checkpoint(good).trainable[0].inline[0]
    longer = bytearray(good)
    longer[start - 4 : start] = (2**31 - 8).to_bytes(4, "little")
    _rejects(tmp_path, bytes(longer), "outside")
    # vtables claiming fields beyond the table
    parsed_root = fbs.Checkpoint.GetRootAs(good, 0)
    vtable = parsed_root._tab.Pos - int.from_bytes(
        good[parsed_root._tab.Pos : parsed_root._tab.Pos + 4], "little", signed=True
    )
    wide = bytearray(good)
    wide[vtable + 2 : vtable + 4] = (4).to_bytes(
        2, "little"
    )  # object size 4: every field is outside it
    _rejects(tmp_path, bytes(wide), "outside the table")
    for cut in (
        7,
        8,
        12,
        len(good) // 2,
        len(good) - 4,
    ):  # (the last bytes are padding after a name)
        _rejects(tmp_path, good[:cut])


def test_external_data_bounds(tmp_path):
    save_checkpoint(parameters(), tmp_path / "ckpt", external_data_threshold=0)
    data = (tmp_path / "ckpt.data").read_bytes()
    (tmp_path / "ckpt.data").write_bytes(data[:-1])
    with pytest.raises(CheckpointFormatError, match=r"ckpt\.data.*shorter"):
        load_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt.data").write_bytes(data)
    assert sorted(load_checkpoint(tmp_path / "ckpt")) == sorted(
        t.name for p in parameters() for t in p
    )


# --------------------------------------------------------------------------- corruption sweeps


def _snapshot(checkpoint) -> dict:
    """Everything a loaded checkpoint says, tensors as (dtype, shape, bytes)."""

    def arrays(d):
        return {k: (str(v.dtype), v.shape, v.tobytes()) for k, v in d.items()}

    return {
        "trainable": arrays(checkpoint.trainable),
        "trainable_order": list(checkpoint.trainable),
        "frozen": arrays(checkpoint.frozen),
        "frozen_order": list(checkpoint.frozen),
        "nominal": checkpoint.is_nominal,
        "version": checkpoint.version,
        "properties": checkpoint.properties,
        "optimizer": {
            g: {
                "step": s["step"],
                "lr": s["initial_learning_rate"],
                "moments": {
                    p: [(str(m.dtype), m.shape, m.tobytes()) for m in ms]
                    for p, ms in s["moments"].items()
                },
            }
            for g, s in checkpoint.optimizer_state.items()
        },
    }


def _structure(snapshot: dict) -> dict:
    """The snapshot without values: names, order, dtypes and shapes (any shape without elements is alike: no
    check can tell (0, 3) from a corrupted (0, 252))."""

    def meta(x):
        if isinstance(x, tuple) and len(x) == 3 and isinstance(x[2], bytes):
            return x[0], x[1] if math.prod(x[1]) else "no elements"
        if isinstance(x, dict):
            return {k: meta(v) for k, v in x.items()}
        if isinstance(x, list):
            return [meta(v) for v in x]
        return x

    out = meta(snapshot)
    out["properties"] = sorted(snapshot["properties"])
    for group in out["optimizer"].values():
        group.pop("step"), group.pop("lr")
    return out


def _payload_owner(path: Path) -> dict[int, str]:
    """Byte position -> name of the tensor whose inline bytes are there."""
    parsed = ckformat.decode_checkpoint(path.read_bytes())
    owner = {}
    for entry in parsed.entries():
        if entry.inline is not None:
            start, length = entry.inline
            owner.update(dict.fromkeys(range(start, start + length), entry.name))
    return owner


def _sweep(tmp_path: Path, original: Path, positions, strict: bool) -> dict[str, int]:
    """Flip each byte at ``positions`` (XOR 0xFF), then truncate at many lengths; every load must give the same
    checkpoint or raise CheckpointFormatError naming the file.

    ``strict``: values must match too, except the tensor whose inline bytes hold the flipped byte; otherwise
    (files with scalar values or external offsets no check can validate) names, dtypes and shapes must match.
    """
    data = original.read_bytes()
    expected = _snapshot(load_checkpoint(original))
    owner = _payload_owner(original)
    target = tmp_path / original.name.replace("orig", "corrupt")
    if original.with_name(original.name + ".data").exists():
        shutil.copy(
            original.with_name(original.name + ".data"), target.with_name(target.name + ".data")
        )
    outcome = {"rejected": 0, "same": 0, "header_flips": 0, "header_flips_rejected": 0}
    failures = []

    def attempt(label, content: bytes, flipped: int | None):
        target.write_bytes(content)
        try:
            got = _snapshot(load_checkpoint(target))
        except CheckpointFormatError as exc:
            if str(target) not in str(exc):
                failures.append(f"{label}: message does not name the file: {exc}")
            outcome["rejected"] += 1
            outcome["header_flips_rejected"] += flipped is not None and flipped not in owner
            return
        except Exception as exc:
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            return
        if strict:
            name = owner.get(flipped) if flipped is not None else None
            for group in ("trainable", "frozen"):
                for key, (dtype, shape, _raw) in got[group].items():
                    want = expected[group].get(key)
                    if want is None:
                        continue
                    if key == name:  # a flip in a tensor's own bytes: only its values may differ
                        got[group][key] = (dtype, shape, want[2])
                    elif dtype == want[0] and math.prod(shape) == 0 == math.prod(want[1]):
                        # a tensor without elements may come back with another element-less shape
                        got[group][key] = want
            ok = got == expected
        else:
            ok = _structure(got) == _structure(expected)
        if not ok:
            failures.append(f"{label}: loaded a different checkpoint")
        outcome["same"] += 1

    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        outcome["header_flips"] += pos not in owner
        attempt(f"byte {pos} flipped", bytes(flipped), pos)
    for cut in sorted({*range(0, min(len(data), 96)), *range(0, len(data), 7), len(data) - 1}):
        attempt(f"truncated to {cut} bytes", data[:cut], None)
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures)"
    return outcome


@pytest.mark.parametrize("kind", ["inline", "nominal"])
def test_corruption_sweep_every_byte(tmp_path, kind):
    save_checkpoint(parameters(), tmp_path / "orig", nominal_checkpoint=kind == "nominal")
    outcome = _sweep(
        tmp_path, tmp_path / "orig", range((tmp_path / "orig").stat().st_size), strict=True
    )
    # What loads after a flip outside tensor bytes is alignment padding, a table's (unused) size, a bool flipped
    # to another true value, or the dims of a tensor without elements.
    assert outcome["header_flips_rejected"] >= 0.85 * outcome["header_flips"], outcome


def test_corruption_sweep_external_data(tmp_path):
    # The flatbuffer holds external offsets, which no check can validate: names, dtypes and shapes must hold.
    save_checkpoint(parameters(), tmp_path / "orig", external_data_threshold=0)
    outcome = _sweep(
        tmp_path, tmp_path / "orig", range((tmp_path / "orig").stat().st_size), strict=False
    )
    assert outcome["header_flips_rejected"] >= 0.8 * outcome["header_flips"], outcome


def test_corruption_sweep_of_a_checkpoint_ort_wrote_after_training(tmp_path, trained_checkpoint):
    # Optimizer steps, learning rates and property values are unchecked scalars: names, dtypes, shapes must hold.
    outcome = _sweep(
        tmp_path, trained_checkpoint, range(trained_checkpoint.stat().st_size), strict=False
    )
    assert outcome["header_flips_rejected"] >= 0.8 * outcome["header_flips"], outcome


@pytest.fixture
def trained_checkpoint(tmp_path, training_dir):
    """A checkpoint ONNX Runtime saved after 2 AdamW steps: optimizer groups, moments and properties."""
    from support.optim_oracle import (
        OrtTrainer,
        batches,
        optimizer_model,
        parameters_of,
        tiny_forward,
    )

    from onnxblocks.optim import AdamW

    _, params = tiny_forward()
    d = tmp_path / "trained"
    d.mkdir()
    onnx.save(optimizer_model(AdamW(), params), d / "optimizer.onnx")
    save_checkpoint(parameters_of(params), d / "start")
    trainer = OrtTrainer.open(training_dir / "training.onnx", d / "start", d / "optimizer.onnx")
    for x, t in batches(2):
        trainer.step(x, t)
    trainer.state.add_property("epoch", 3)
    trainer.state.add_property("best", 0.125)
    trainer.state.add_property("run", "r1")
    capi().save_checkpoint(trainer.state, os.fspath(d / "orig_trained"), True)
    loaded = load_checkpoint(d / "orig_trained")
    assert loaded.properties == {"epoch": 3, "best": 0.125, "run": "r1"}
    (group,) = loaded.optimizer_state.values()
    assert group["step"] == 2 and group["moments"]
    return d / "orig_trained"


@pytest.fixture
def training_dir(tmp_path_factory):
    from support.optim_oracle import FROZEN, TRAINABLE, tiny_forward, training_model

    d = tmp_path_factory.mktemp("training")
    onnx.save(training_model(tiny_forward()[0], TRAINABLE, FROZEN), d / "training.onnx")
    return d

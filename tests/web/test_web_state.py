"""The Python side of training in JavaScript: safetensors, params.safetensors <-> checkpoints, the demo site.

No Node here (tests/web/test_js_node.py and tests/web/test_web_browser.py run the client).
"""

from __future__ import annotations

import json
import struct
import urllib.request

import numpy as np
import pytest

from onnxblocks.checkpoint import load_checkpoint, save_checkpoint
from onnxblocks.cli import main as cli_main
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import (
    WebState,
    load_state,
    read_safetensors,
    read_state,
    serving,
    spiral_plan,
    state_to_checkpoint,
    write_safetensors,
    write_state,
)
from onnxblocks.web.npm import ORT_WEB_VERSION, js_dir
from onnxblocks.web.safetensors import DTYPES

ALL_DTYPES = [
    "float32",
    "float64",
    "float16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "bool",
]


def test_safetensors_round_trip_every_dtype_and_shape(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {}
    for i, dtype in enumerate(ALL_DTYPES):
        shape = [(), (0,), (3,), (2, 3), (1, 2, 2)][i % 5]
        tensors[f"t/{dtype}"] = (rng.standard_normal(shape) * 50).astype(dtype)
    path = write_safetensors(tmp_path / "a.safetensors", tensors, {"k": "v"})
    back, meta = read_safetensors(path)
    assert meta == {"k": "v"}
    assert list(back) == list(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
        assert back[name].flags.writeable


def test_safetensors_layout_is_the_specification(tmp_path):
    """8-byte LE header length, JSON header padded with spaces to 8 bytes, LE data back to back."""
    path = write_safetensors(
        tmp_path / "a.safetensors",
        {"w": np.array([[1, 2]], np.float32), "n": np.array([7], np.int64)},
        {"format": "x"},
    )
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = json.loads(raw[8 : 8 + length])
    assert header == {
        "__metadata__": {"format": "x"},
        "w": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]},
        "n": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},
    }
    assert raw[8 + length :] == struct.pack("<2f", 1, 2) + struct.pack("<q", 7)
    assert sorted(DTYPES) == sorted(
        ["F32", "F64", "F16", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL"]
    )


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda raw: raw[:5], ValueError, "too short"),
        (lambda raw: struct.pack("<Q", 10**6) + raw[8:], ValueError, "header"),
        (lambda raw: raw[:8] + b"[" + raw[9:], ValueError, "not UTF-8 JSON"),
        (lambda raw: raw.replace(b'"F32"', b'"B16"'), TypeError, "dtype 'B16'"),
        (lambda raw: raw.replace(b"[0,8]", b"[0,12]"), ValueError, "needs 8 bytes"),
        (lambda raw: raw[:-4], ValueError, "truncated"),
    ],
)
def test_safetensors_malformed_files_name_themselves(tmp_path, mutate, error, match):
    path = write_safetensors(
        tmp_path / "a.safetensors", {"w": np.array([1, 2], np.float32), "v": np.ones(1, np.float32)}
    )
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(error, match=match) as info:
        read_safetensors(bad)
    assert "bad.safetensors" in str(info.value)


def test_safetensors_refuses_what_javascript_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="complex64"):
        write_safetensors(tmp_path / "a", {"z": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match="reserved"):
        write_safetensors(tmp_path / "a", {"__metadata__": np.zeros(2, np.float32)})
    with pytest.raises(TypeError, match="strings"):
        write_safetensors(tmp_path / "a", {"x": np.zeros(2, np.float32)}, {"step": 3})  # type: ignore[dict-item]
    assert not (tmp_path / "a").exists()


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    """Hand-written portable linear artifacts (tests/support/portable_linear.py) after 3 AdamW steps, saved with state."""
    from support import portable_linear

    directory = portable_linear.write(tmp_path_factory.mktemp("linear") / "artifacts")
    session = TrainingSession(directory)
    session.learning_rate = 0.05
    for x, t in portable_linear.batches(3):
        session.train_and_update(x, t)
    path = session.save_checkpoint(
        directory.parent / "trained", properties={"epoch": 2, "name": "web", "f": 1.0}
    )
    return directory, path, session


def test_state_from_a_checkpoint_holds_parameters_moments_step_and_properties(
    trained_checkpoint, tmp_path
):
    _, checkpoint, session = trained_checkpoint
    ck = load_checkpoint(checkpoint)
    path = write_state(checkpoint, tmp_path / "params.safetensors")
    tensors, meta = read_safetensors(path)
    assert meta["format"] == "onnxblocks-web/1"
    assert json.loads(meta["trainable"]) == ["W", "b"] and json.loads(meta["frozen"]) == []
    assert meta["step"] == "3"
    assert list(tensors) == ["W", "b", "W.exp_avg", "W.exp_avg_sq", "b.exp_avg", "b.exp_avg_sq"]
    np.testing.assert_array_equal(
        tensors["W.exp_avg_sq"], ck.optimizer_state["group0"]["moments"]["W"][1]
    )
    state = read_state(path)
    # the learning rate a resumed session starts with: ONNX Runtime keeps the initial one in checkpoints
    assert (
        state.step == 3
        and state.learning_rate == ck.optimizer_state["group0"]["initial_learning_rate"]
    )
    assert state.properties == ck.properties and state.properties["name"] == "web"
    assert isinstance(state.properties["f"], float) and isinstance(state.properties["epoch"], int)
    for name in ("W", "b"):
        np.testing.assert_array_equal(state.trainable[name], session.get_parameter(name))


def test_state_back_to_a_checkpoint_resumes_exactly(trained_checkpoint, tmp_path):
    from support import portable_linear

    directory, checkpoint, _ = trained_checkpoint
    state_to_checkpoint(write_state(checkpoint, tmp_path / "p.safetensors"), tmp_path / "resumed")
    a, b = load_checkpoint(checkpoint), load_checkpoint(tmp_path / "resumed")
    assert a.optimizer_state["group0"]["step"] == b.optimizer_state["group0"]["step"] == 3
    for name in ("W", "b"):
        for k in range(2):
            np.testing.assert_array_equal(
                a.optimizer_state["group0"]["moments"][name][k],
                b.optimizer_state["group0"]["moments"][name][k],
            )
    assert a.properties == b.properties
    batch = portable_linear.batches(4)[3]
    one, two = (
        TrainingSession(directory, checkpoint=checkpoint),
        TrainingSession(directory, checkpoint=tmp_path / "resumed"),
    )
    assert one.learning_rate == two.learning_rate
    assert one.train_and_update(*batch)[0] == two.train_and_update(*batch)[0]
    np.testing.assert_array_equal(one.get_parameter("W"), two.get_parameter("W"))


def test_a_fresh_artifact_directory_gives_a_step_zero_state(tmp_path):
    from support import portable_linear

    directory = portable_linear.write(tmp_path / "a")
    path = write_state(directory)
    assert path == directory / "params.safetensors"
    state = read_state(path)
    assert state.step == 0 and state.moments == {} and state.learning_rate is None
    expected = portable_linear.initial_parameters()
    for name, value in expected.items():
        np.testing.assert_array_equal(state.trainable[name], value)
    # without moments or steps, the checkpoint has no optimizer group, as generate_artifacts writes it
    assert load_checkpoint(state_to_checkpoint(state, tmp_path / "ck")).optimizer_state == {}


def test_load_state_sets_a_sessions_parameters_and_checks_them(trained_checkpoint, tmp_path):
    directory, checkpoint, trained = trained_checkpoint
    session = TrainingSession(directory)
    load_state(session, write_state(checkpoint, tmp_path / "p.safetensors"))
    for name in ("W", "b"):
        np.testing.assert_array_equal(session.get_parameter(name), trained.get_parameter(name))
    wrong = WebState(trainable={"W": np.zeros((3, 2), np.float32)}, frozen={})
    with pytest.raises(ValueError, match="'b'"):
        load_state(session, write_state(wrong, tmp_path / "w.safetensors"))
    shape = WebState(
        trainable={"W": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32)}, frozen={}
    )
    with pytest.raises(ValueError, match="shape"):
        load_state(session, write_state(shape, tmp_path / "s.safetensors"))


def test_state_files_that_do_not_fit_are_refused(tmp_path):
    plain = write_safetensors(tmp_path / "plain.safetensors", {"W": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="plain.safetensors' is not an onnxblocks web state file"):
        read_state(plain)
    meta = {"format": "onnxblocks-web/1", "trainable": '["W", "b"]', "frozen": "[]"}
    with pytest.raises(ValueError, match=r"\['b'\].*no tensor"):
        read_state(
            write_safetensors(tmp_path / "m.safetensors", {"W": np.zeros(2, np.float32)}, meta)
        )
    one_moment = {
        "W": np.zeros(2, np.float32),
        "b": np.zeros(2, np.float32),
        "W.exp_avg": np.zeros(2, np.float32),
    }
    with pytest.raises(ValueError, match="only one of its two moments"):
        read_state(write_safetensors(tmp_path / "o.safetensors", one_moment, meta))
    with pytest.raises(ValueError, match="nominal"):
        write_state(
            load_checkpoint(
                save_checkpoint(({"W": np.zeros(2, np.float32)}, {}), tmp_path / "n", True)
            ),
            "x",
        )
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        write_state(tmp_path / "nowhere")


def test_the_javascript_client_pins_the_onnxruntime_it_is_tested_with():
    package = json.loads((js_dir() / "package.json").read_text())
    lock = json.loads((js_dir() / "package-lock.json").read_text())
    pinned = {"onnxruntime-node": ORT_WEB_VERSION, "onnxruntime-web": ORT_WEB_VERSION}
    assert (
        package["peerDependencies"] == pinned and "dependencies" not in package
    )  # users install the one they run
    assert {n: package["devDependencies"][n] for n in pinned} == pinned  # the tests run both
    for name, version in package["devDependencies"].items():
        assert version[0].isdigit(), f"{name} must be pinned exactly, not {version}"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    assert "onnxruntime-node-install=skip" in (js_dir() / ".npmrc").read_text()


def test_the_plan_replays_the_python_demo():
    """Same data, the ArrayBatches order of each epoch and the CosineSchedule rate of each step as run_demo."""
    from onnxblocks.datasets import spirals, train_val_split
    from onnxblocks.runtime import ArrayBatches
    from onnxblocks.runtime.schedules.warmup import CosineSchedule

    plan = spiral_plan(epochs=3, seed=0)
    x, y = spirals(points_per_class=400, classes=3, seed=0)
    (x_train, y_train), (_, y_val) = train_val_split(x, y, 0.2)
    np.testing.assert_array_equal(plan.features, x_train)
    np.testing.assert_array_equal(plan.val_labels, y_val)
    train = ArrayBatches((x_train, y_train), batch_size=32, seed=0)
    schedule = CosineSchedule(0.01, total_steps=90, warmup_steps=min(30, 90 // 5))
    step = 0
    for _ in range(3):
        for features, labels in train:
            got = plan.batch(step)
            np.testing.assert_array_equal(got[0], features)
            np.testing.assert_array_equal(got[1], labels)
            assert plan.learning_rates[step] == schedule(step)
            step += 1
    assert step == plan.steps == 90
    assert np.abs(plan.features).max() < plan.extent
    with pytest.raises(IndexError):
        plan.batch(90)


def test_the_server_serves_modules_and_wasm_with_their_types(tmp_path):
    for name in ("a.mjs", "b.wasm", "c.onnx", "index.html"):
        (tmp_path / name).write_bytes(b"\0asm" if name.endswith("wasm") else b"x")
    with serving(tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")
        types = {}
        for name in ("a.mjs", "b.wasm", "c.onnx", "index.html"):
            with urllib.request.urlopen(url + name) as response:
                types[name] = response.headers["Content-Type"]
    assert types == {
        "a.mjs": "text/javascript",
        "b.wasm": "application/wasm",
        "c.onnx": "application/octet-stream",
        "index.html": "text/html; charset=utf-8",
    }


def test_cli_web_demo_rejects_a_bad_port(capsys, tmp_path):
    assert cli_main(["demo", "--web", "--port", "-1", "--output-dir", str(tmp_path / "d")]) == 2
    assert "--port" in capsys.readouterr().err
    assert cli_main(["demo", "--web", "--port", "70000", "--output-dir", str(tmp_path / "d")]) == 3
    assert "65535" in capsys.readouterr().err


def test_without_npm_the_install_fails_and_says_what_to_install(tmp_path, monkeypatch):
    from onnxblocks.web import NpmError, install_js_dependencies

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NpmError, match="npm is not on the PATH. Install Node.js 20"):
        install_js_dependencies(cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())

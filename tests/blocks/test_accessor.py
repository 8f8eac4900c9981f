"""The model accessor: scoping, nesting, non-mutation, versions, held weights and errors."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from support.numerics import assert_equal
from support.onnx_models import make_linear_model, run_model

import onnxblocks as ob
from onnxblocks._core import limits as _limits
from onnxblocks._core import weights


def test_caller_model_is_not_mutated(linear_model):
    before = linear_model.SerializeToString()
    with ob.base(linear_model) as acc:
        ob.blocks.ReduceMean(keepdims=False)(ob.blocks.Mul()("y", "y"))
        acc.add_input("extra", onnx.TensorProto.FLOAT, [1])
    assert linear_model.SerializeToString() == before


def test_large_initializers_are_held_not_copied(monkeypatch):
    monkeypatch.setattr(weights, "HOLD_THRESHOLD_BYTES", 16)
    model = make_linear_model(8, 4)
    with ob.base(model) as acc:
        stubs = {i.name for i in acc.working_model.graph.initializer if weights.is_stub(i)}
        assert stubs == {"W", "b"}
        # the source is the caller's own tensor, not a copy
        assert acc.weights.source("W").tensor is model.graph.initializer[0]
        np.testing.assert_array_equal(
            acc.tensor("W"), onnx.numpy_helper.to_array(model.graph.initializer[0])
        )
    finished = acc.model  # after the build: complete again
    assert not any(weights.is_stub(i) for i in finished.graph.initializer)
    x = np.ones((2, 8), np.float32)
    assert_equal(
        run_model(finished, {"x": x})[0], run_model(model, {"x": x})[0]
    )  # the same graph and weights


def test_block_outside_build_is_a_clear_error():
    with pytest.raises(ob.errors.NoActiveModelError, match="onnxblocks.base"):
        ob.blocks.Add()("a", "b")


def test_state_is_clean_after_an_exception(linear_model):
    with pytest.raises(ob.errors.UnknownNameError), ob.base(linear_model):
        ob.blocks.Add()("y", "missing")
    assert ob.blocks.active() is None
    with ob.base(linear_model) as acc:  # a new build starts fine
        out = ob.blocks.Add()("y", "y")
    assert out in {n.output[0] for n in acc.model.graph.node}


def test_nested_builds_restore_the_outer_one(linear_model):
    with ob.base(linear_model) as outer:
        with ob.empty_base() as inner:
            assert ob.blocks.current() is inner
            inner.add_input("z", onnx.TensorProto.FLOAT, [2])
            ob.blocks.Neg()("z")
        assert ob.blocks.current() is outer
        ob.blocks.Neg()("y")
    assert [n.op_type for n in inner.model.graph.node] == ["Neg"]
    assert [n.op_type for n in outer.model.graph.node][-1] == "Neg"
    assert not any(i.name == "z" for i in outer.model.graph.input)


def test_threads_do_not_see_each_other():
    results: dict[int, list[str]] = {}
    barrier = threading.Barrier(2)

    def build(k: int) -> None:
        model = make_linear_model(4, 2, seed=k)
        with ob.base(model) as acc:
            barrier.wait()
            for _ in range(20):
                ob.blocks.Neg()("y")
            barrier.wait()
            results[k] = [n.op_type for n in acc.working_model.graph.node]

    threads = [threading.Thread(target=build, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == results[1] == ["MatMul", "Add"] + ["Neg"] * 20


def test_empty_base_loads_in_the_installed_runtime():
    with ob.empty_base() as acc:
        acc.add_input("a", onnx.TensorProto.FLOAT, [3])
        b = ob.value("a") * 2.0 + 1.0
        acc.set_outputs([b])
    model = acc.finish()
    assert model.ir_version <= _limits.MAX_IR_VERSION
    assert _limits.onnx_opset(model) <= _limits.MAX_ONNX_OPSET
    assert_equal(
        run_model(model, {"a": np.arange(3, dtype=np.float32)})[0], np.float32([1.0, 3.0, 5.0])
    )


def test_ir_version_of_new_onnx_is_stamped_down(linear_model):
    linear_model.ir_version = 14

    class Identity(ob.ForwardBlock):
        def build(self, y):
            return y * 1.0

    with ob.base(linear_model):
        block = Identity()
        block("y")
    assert block.to_model_proto().ir_version <= 10


def test_too_new_opset_is_converted_down_or_refused_with_a_remedy():
    model = make_linear_model(
        opset=22
    )  # issue 12: converted down with onnx's version converter, not refused
    with ob.base(model) as acc:
        assert acc.domain_version("") == 21
    assert model.opset_import[0].version == 22  # the caller's model is not changed
    with pytest.raises(ValueError, match="opset"):
        with ob.empty_base(opset_version=23):
            pass


def test_base_rejects_non_model():
    with pytest.raises(TypeError, match=r"onnx.ModelProto, not str.*onnx.load"):
        with ob.base("model.onnx"):  # type: ignore[arg-type]
            pass


def test_custom_op_library_missing_file(tmp_path):
    missing = tmp_path / "libcustom.so"
    with pytest.raises(FileNotFoundError, match="libcustom.so"):
        with ob.custom_op_library(missing):
            pass


def test_custom_op_library_is_scoped(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with ob.custom_op_library(lib), ob.empty_base() as acc:
        assert acc.custom_op_libraries == (str(lib),)
    assert ob.blocks.custom_op_libraries() == ()


def test_external_data_model_without_path_is_explained(tmp_path):
    model = make_linear_model(64, 32)
    path = tmp_path / "m.onnx"
    onnx.save_model(
        onnx.ModelProto.FromString(model.SerializeToString()),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    loaded = onnx.load(path, load_external_data=False)
    with pytest.raises(ValueError, match="model_path"):
        with ob.base(loaded):
            pass
    with ob.base(loaded, model_path=path) as acc:
        np.testing.assert_array_equal(
            acc.tensor("W"), onnx.numpy_helper.to_array(model.graph.initializer[0])
        )
    x = np.ones((1, 64), np.float32)
    assert_equal(
        run_model(acc.model, {"x": x})[0], run_model(model, {"x": x})[0]
    )  # the same graph and weights

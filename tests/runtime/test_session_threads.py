"""ONNXBLOCKS_ORT_THREADS: the intra-op thread count of every session, the library's and the tests' own."""

from __future__ import annotations

import pytest
from support.onnx_models import make_linear_model
from support.ort_threads import install

from onnxblocks._core.ort import THREADS_ENV, intra_op_threads, onnxruntime, session_options
from onnxblocks.errors import InvalidValueError


@pytest.mark.parametrize(("value", "threads"), [(None, 0), ("", 0), ("0", 0), ("1", 1), (" 2 ", 2)])
def test_the_library_options_take_the_count_from_the_variable(monkeypatch, value, threads):
    if value is None:
        monkeypatch.delenv(THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(THREADS_ENV, value)
    assert intra_op_threads() == threads
    assert session_options().intra_op_num_threads == threads
    assert session_options(runs=True).intra_op_num_threads == threads


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_count_that_is_not_one_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(InvalidValueError, match=rf"{THREADS_ENV}=.* positive integer"):
        session_options()


def test_install_gives_the_count_to_the_sessions_a_test_opens_itself(monkeypatch):
    ort = onnxruntime()
    monkeypatch.setattr(
        ort.InferenceSession, "__init__", ort.InferenceSession.__init__
    )  # undone afterwards
    monkeypatch.setenv(THREADS_ENV, "3")
    assert install() == 3
    model = make_linear_model().SerializeToString()
    plain = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert plain.get_session_options().intra_op_num_threads == 3
    unset = ort.SessionOptions()
    assert ort.InferenceSession(model, unset).get_session_options().intra_op_num_threads == 3
    chosen = ort.SessionOptions()
    chosen.intra_op_num_threads = 2  # a test that chose its own count keeps it
    assert (
        ort.InferenceSession(model, sess_options=chosen).get_session_options().intra_op_num_threads
        == 2
    )

"""Adversarial training replies: each is dropped with a logged reason before aggregation, and the round completes.

Every case is one bad reply beside two good ones: the aggregate is the good replies' weighted mean, the
history records one drop whose reason names the problem, and the ``onnxblocks.federated`` logger says
so. Arrays are judged by their ``.npy`` header before any byte is decoded: an object array is never
unpickled, and a header claiming a huge shape is never allocated.
"""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from numpy.lib import format as npy
from support.numerics import assert_equal

from onnxblocks.federated import FederatedHistory, ValidatingStrategy
from onnxblocks.federated.records import to_record
from onnxblocks.federated.validation import MAX_EXAMPLES, check_header, check_metrics, specs_of

GLOBAL = {
    "w": np.zeros((2, 3), np.float32),
    "b": np.zeros(3, np.float32),
    "s": np.zeros((), np.float32),
}


#: Every test here builds messages, stamped as in a real run (``conftest.task_identity``).
pytestmark = pytest.mark.usefixtures("task_identity")


def filled(value):
    return {k: np.full_like(v, value) for k, v in GLOBAL.items()}


def raw_array(header: dict, payload: bytes = b"", version=(1, 0)) -> Array:
    """A Flower Array whose bytes are a hand-written ``.npy`` header and ``payload`` (what a hostile client may send)."""
    buffer = io.BytesIO()
    write = npy.write_array_header_1_0 if version == (1, 0) else npy.write_array_header_2_0
    write(buffer, header)
    shape = tuple(header["shape"])
    return Array(
        dtype=str(header["descr"]),
        shape=shape,
        stype="numpy.ndarray",
        data=buffer.getvalue() + payload,
    )


def message(arrays=None, metrics=None, node=1, record=None, extra_records=None):
    content = RecordDict()
    if record is not None:
        content["arrays"] = record
    elif arrays is not None:
        content["arrays"] = to_record(arrays)
    for key, value in (extra_records or {}).items():
        content[key] = value
    content["metrics"] = MetricRecord(
        metrics if metrics is not None else {"num-examples": 10, "train-loss": 0.5}
    )
    content["client"] = ConfigRecord({"partition-id": node})
    request = Message(content=RecordDict(), dst_node_id=node, message_type="train")
    return Message(content=content, reply_to=request)


def with_array(name, array: Array) -> ArrayRecord:
    record = to_record(filled(2.0))
    record[name] = array
    return record


def duplicated_key_record() -> ArrayRecord:
    """An ArrayRecord off the wire whose JSON body names 'w' twice: Flower's decoding keeps the second (NaN) one."""
    from flwr.supercore.inflatable.inflatable_object import (
        add_header_to_object_body,
        get_object_body,
    )

    good, bad = to_record(filled(2.0)), to_record(filled(np.nan))
    body = get_object_body(good.deflate(), ArrayRecord).decode()
    text = body[:-1] + f', "w": "{bad["w"].object_id}"}}'
    assert text.count('"w"') == 2
    arrays = {a.object_id: a for a in (*good.values(), bad["w"])}
    children = {
        ref: arrays[ref] for ref in json.loads(text).values()
    }  # Flower refuses unreferenced children
    return ArrayRecord.inflate(add_header_to_object_body(text.encode(), good), children)


BIG = 2**40
CASES = {
    "object array": (
        with_array(
            "w", raw_array({"descr": "|O", "fortran_order": False, "shape": (2, 3)}, b"\x80\x04N.")
        ),
        "object",
    ),
    "string array": (with_array("b", Array(np.array(["a", "bb", "ccc"]))), "<U3"),
    "0-d sent as 1 element": (with_array("s", Array(np.zeros(1, np.float32))), "shape (1,)"),
    "1 element sent as 0-d": (with_array("b", Array(np.zeros((), np.float32))), "shape ()"),
    "huge shape": (
        with_array(
            "w",
            raw_array({"descr": "<f4", "fortran_order": False, "shape": (BIG, BIG)}, b"\0" * 24),
        ),
        f"shape ({BIG}, {BIG})",
    ),
    "truncated data": (
        with_array(
            "w", raw_array({"descr": "<f4", "fortran_order": False, "shape": (2, 3)}, b"\0" * 8)
        ),
        "holds 8 data bytes",
    ),
    "trailing data": (
        with_array(
            "w", raw_array({"descr": "<f4", "fortran_order": False, "shape": (2, 3)}, b"\0" * 30)
        ),
        "holds 30 data bytes",
    ),
    "header over the bound": (
        with_array(
            "w",
            raw_array(
                {"descr": "<f4", "fortran_order": False, "shape": (2, 3), "x": "y" * 20000},
                b"\0" * 24,
                (2, 0),
            ),
        ),
        "no readable .npy header",
    ),
    "not npy bytes": (
        with_array(
            "w", Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=b"\x93NUMPY junk")
        ),
        ".npy format version",
    ),
    "not numpy": (
        with_array("w", Array(dtype="float32", shape=(2, 3), stype="torch.Tensor", data=b"")),
        "not a serialized numpy array",
    ),
    "extra key": (with_array("w.extra", Array(np.zeros(1, np.float32))), "unknown 'w.extra'"),
    "duplicated key": (duplicated_key_record(), "non-finite"),
}
METRICS = {
    "num-examples int64 max": (
        {"num-examples": 2**63 - 1, "train-loss": 0.5},
        "'num-examples' is 9223372036854775807",
    ),
    "num-examples above int64": (
        {"num-examples": 2**64, "train-loss": 0.5},
        "'num-examples' is 18446744073709551616",
    ),
    "num-examples negative": ({"num-examples": -10, "train-loss": 0.5}, "'num-examples' is -10"),
    "num-examples NaN": (
        {"num-examples": float("nan"), "train-loss": 0.5},
        "'num-examples' is nan, not a finite",
    ),
    "num-examples fractional": ({"num-examples": 10.5, "train-loss": 0.5}, "whole number"),
    "num-examples huge float": ({"num-examples": 1e300, "train-loss": 0.5}, "whole number"),
    "metric beyond float": ({"num-examples": 10, "train-loss": 2**1100}, "'train-loss' is"),
}


def aggregate(bad: Message, caplog):
    wrapped = ValidatingStrategy(
        FedAvg(min_train_nodes=1, min_available_nodes=1), specs_of(GLOBAL), FederatedHistory()
    )
    wrapped._global = dict(GLOBAL)
    good = [
        message(filled(1.0), {"num-examples": 10, "train-loss": 0.5}, node=0),
        message(filled(3.0), {"num-examples": 30, "train-loss": 0.5}, node=1),
    ]
    with caplog.at_level(logging.WARNING, logger="onnxblocks.federated"):
        arrays, _ = wrapped.aggregate_train(1, [good[0], bad, good[1]])
    for name, value in arrays.items():  # the round completes with the two good replies
        assert_equal(
            value.numpy(), np.full_like(GLOBAL[name], 2.5), name=name
        )  # (10 + 90) / 40: exact
    assert [d["node"] for d in wrapped.history.dropped] == [2]
    return wrapped.history.dropped[0]["reason"], caplog.text


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_array_is_dropped_with_its_reason(case, caplog):
    record, needle = CASES[case]
    reason, logged = aggregate(message(record=record, node=2), caplog)
    assert needle in reason, reason
    assert reason in logged


@pytest.mark.parametrize("case", list(METRICS))
def test_a_bad_weight_or_metric_is_dropped_with_its_reason(case, caplog):
    metrics, needle = METRICS[case]
    reason, logged = aggregate(message(filled(2.0), metrics, node=2), caplog)
    assert needle in reason, reason
    assert reason in logged


def test_extra_records_and_metrics_are_dropped(caplog):
    two = {"arrays": to_record(filled(2.0)), "more": to_record(filled(2.0))}
    extra = message(record=two["arrays"], extra_records={"more": two["more"]}, node=2)
    reason, _ = aggregate(extra, caplog)
    assert "2 ArrayRecords" in reason
    odd = message(filled(2.0), {"num-examples": 10, "train-loss": 0.5, "leak": 1.0}, node=2)
    reason, _ = aggregate(odd, caplog)
    assert "differ from the others'" in reason and "leak" in reason


def test_a_0d_parameter_travels_as_0d():
    """``to_record`` keeps a 0-d parameter 0-d (``np.ascontiguousarray`` would make it shape (1,), and every
    reply of a model with a scalar parameter would be dropped)."""
    from onnxblocks.federated.records import from_record

    back = from_record(to_record(GLOBAL))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in GLOBAL.items()}


def test_the_header_check_reads_no_more_than_the_header():
    spec = specs_of(GLOBAL)["w"]
    assert check_header(Array(np.zeros((2, 3), np.float32)), "w", *spec) is None
    assert check_header(Array(np.asfortranarray(np.zeros((2, 3), np.float32))), "w", *spec) is None
    huge = raw_array({"descr": "<f4", "fortran_order": False, "shape": (BIG,)})
    assert "holds 0 data bytes" in check_header(
        huge, "w", np.dtype(np.float32), (BIG,)
    )  # nothing allocated
    assert (
        check_metrics({"num-examples": MAX_EXAMPLES, "train-loss": 0.1}, ("num-examples",)) is None
    )
    assert (
        check_metrics({"num-examples": 12.0, "eval-loss": 0.1}, ("num-examples",)) is None
    )  # evaluate's float rows

"""The EMA of weights (onnxblocks.runtime.ema.WeightEMA) against torch's AveragedModel with get_ema_multi_avg_fn.

A portable MLP trains 12 steps with SGD and momentum under ``fit``; the average
after each step equals what ``torch.optim.swa_utils.AveragedModel`` computes from
the same sequence of weights (rtol 1e-6 of torch in float32, or its own rounding against
torch in float64; ``support.numerics``), the export inside ``applied`` holds the
averaged weights (and the session gets its raw ones back), and ``save``/``load``
round-trip the average exactly.

The checkpoint holds the average (frozen tensors ``onnxblocks.extra/ema/<parameter>``):
ONNX Runtime's training API loads it and trains, and on the training build and the
portable backend a run resumed from it after one of two epochs ends with the
uninterrupted run's weights and average, bit for bit; ``export_inference_model(...,
use_ema=True)`` of a session loaded from it exports the average.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from support.numerics import assert_close
from support.runtime_support import PARAMS, classification_data, mlp_model

from onnxblocks import artifacts, optim
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.errors import InvalidValueError, StateError
from onnxblocks.runtime import TrainingSession, fit, resume
from onnxblocks.runtime.callbacks import Callback
from onnxblocks.runtime.ema import WeightEMA
from onnxblocks.web import WebState

DECAY = 0.9


class _Record(Callback):
    def __init__(self) -> None:
        self.weights: list[dict[str, np.ndarray]] = []

    def on_step_end(self, run) -> None:
        self.weights.append(run.session.parameters(trainable_only=True))


def _torch_average(
    records: list[dict[str, np.ndarray]], dtype: torch.dtype
) -> dict[str, np.ndarray]:
    """torch's ``AveragedModel`` with the EMA of ``DECAY`` over the recorded weights, in ``dtype``."""
    module = torch.nn.ParameterDict(
        {
            n.replace(".", "_"): torch.nn.Parameter(torch.zeros(records[0][n].shape, dtype=dtype))
            for n in PARAMS
        }
    )
    averaged = torch.optim.swa_utils.AveragedModel(
        module, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(DECAY)
    )
    for weights in records:
        with torch.no_grad():
            for n in PARAMS:
                module[n.replace(".", "_")].copy_(torch.from_numpy(weights[n]))
        averaged.update_parameters(module)
    return {n: averaged.module[n.replace(".", "_")].detach().numpy() for n in PARAMS}


def test_weight_ema_equals_torch_averaged_model_and_exports_the_average(tmp_path) -> None:
    directory = tmp_path / "artifacts"
    artifacts.generate_artifacts(
        mlp_model(),
        requires_grad=PARAMS,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim.SGD(momentum=0.9),
        artifact_directory=directory,
        additional_output_names=["logits"],
        portable=True,
    )
    session = TrainingSession(directory)
    session.learning_rate = 0.1
    x, y = classification_data(rows=48)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 48, 4)]
    ema, record = WeightEMA(DECAY), _Record()
    fit(session, batches, epochs=1, callbacks=[record, ema], progress=False)
    assert ema.updates == len(record.weights) == 12

    want, want64 = (
        _torch_average(record.weights, torch.float32),
        _torch_average(record.weights, torch.float64),
    )
    for n in PARAMS:
        # an average (weights summing to one) of the recorded weights: its terms are at most the largest of them
        scale = np.max(np.abs([weights[n] for weights in record.weights]), axis=0)
        assert_close(ema.average[n], want[n], want64[n], rtol=1e-6, scale=scale, name=n)
    assert not np.array_equal(ema.average["fc1.weight"], record.weights[-1]["fc1.weight"])

    raw = session.parameters(trainable_only=True)
    with ema.applied(session):
        session.export_inference_model(tmp_path / "ema.onnx")
    exported = {
        i.name: onnx.numpy_helper.to_array(i)
        for i in onnx.load(tmp_path / "ema.onnx").graph.initializer
    }
    for n in PARAMS:
        np.testing.assert_array_equal(exported[n], ema.average[n])
        np.testing.assert_array_equal(session.get_parameter(n), raw[n])

    again = WeightEMA(DECAY)
    again.load(ema.save(tmp_path / "ema.npz"))
    assert again.updates == 12
    for n in PARAMS:
        np.testing.assert_array_equal(again.average[n], ema.average[n])


def test_weight_ema_refuses_bad_decay_and_use_before_training(tmp_path) -> None:
    with pytest.raises(InvalidValueError, match="decay"):
        WeightEMA(1.0)
    with pytest.raises(StateError, match="no average"):
        WeightEMA().save(tmp_path / "x.npz")


def _artifacts(directory, portable: bool):
    artifacts.generate_artifacts(
        mlp_model(),
        requires_grad=PARAMS,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim.SGD(momentum=0.9) if portable else artifacts.OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["logits"],
        portable=portable,
    )
    return directory


@pytest.mark.parametrize("portable", [False, True], ids=["training-build", "portable"])
def test_the_checkpoint_holds_the_ema_and_resume_continues_it_bit_exactly(
    tmp_path, portable
) -> None:
    """Saved inside the checkpoint (ORT's training API loads it), restored on resume, exported on request."""
    directory = _artifacts(tmp_path / "artifacts", portable)
    x, y = classification_data(rows=48)
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 48, 8)]

    whole = TrainingSession(directory)
    whole.learning_rate = 0.05
    ema = WeightEMA(DECAY)
    fit(whole, batches, epochs=2, callbacks=[ema], progress=False)

    first = TrainingSession(directory)
    first.learning_rate = 0.05
    fit(first, batches, epochs=1, callbacks=[WeightEMA(DECAY)], progress=False)
    checkpoint = first.save_checkpoint(tmp_path / "checkpoint")
    assert first.parameter_names() == sorted(PARAMS)  # the average is no model parameter

    stored = load_checkpoint(checkpoint)
    assert sorted(stored.frozen) == sorted(f"onnxblocks.extra/ema/{n}" for n in PARAMS)
    if (
        not portable
    ):  # ONNX Runtime's own training API loads it, trains, and counts only the model's parameters
        from onnxruntime.training import api

        state = api.CheckpointState.load_checkpoint(str(checkpoint))
        module = api.Module(
            str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx")
        )
        assert module.get_parameters_size(True) == sum(v.size for v in stored.trainable.values())
        assert np.isfinite(module(*batches[0])[0])
        api.Optimizer(str(directory / "optimizer_model.onnx"), module).step()
        np.testing.assert_array_equal(
            state.parameters["onnxblocks.extra/ema/fc1.weight"].data,
            stored.frozen["onnxblocks.extra/ema/fc1.weight"],
        )

    assert (
        WebState.from_checkpoint(stored).frozen == {}
    )  # the web state carries the model's parameters only

    resumed = TrainingSession(directory)
    resume(resumed, checkpoint)
    assert resumed.weight_ema is not None and resumed.weight_ema.updates == 6
    resumed.learning_rate = 0.05
    again = WeightEMA(DECAY)
    fit(resumed, batches, epochs=1, callbacks=[again], progress=False)
    assert again.updates == ema.updates == 12
    for n in PARAMS:  # bit for bit the uninterrupted run: weights and average
        np.testing.assert_array_equal(resumed.get_parameter(n), whole.get_parameter(n))
        np.testing.assert_array_equal(again.average[n], ema.average[n])

    final = resumed.save_checkpoint(tmp_path / "final")
    loaded = TrainingSession(
        directory, checkpoint=final
    )  # no fit: the export takes the restored average
    loaded.export_inference_model(tmp_path / "ema.onnx", use_ema=True)
    loaded.export_inference_model(tmp_path / "raw.onnx")
    read = {
        kind: {
            i.name: onnx.numpy_helper.to_array(i)
            for i in onnx.load(tmp_path / f"{kind}.onnx").graph.initializer
        }
        for kind in ("ema", "raw")
    }
    for n in PARAMS:
        np.testing.assert_array_equal(read["ema"][n], ema.average[n])
        np.testing.assert_array_equal(read["raw"][n], whole.get_parameter(n))
    assert not np.array_equal(read["ema"]["fc1.weight"], read["raw"]["fc1.weight"])


def test_use_ema_without_an_average_and_a_decay_mismatch_are_refused(tmp_path) -> None:
    directory = _artifacts(tmp_path / "artifacts", portable=True)
    session = TrainingSession(directory)
    with pytest.raises(StateError, match="no weight EMA"):
        session.export_inference_model(tmp_path / "m.onnx", use_ema=True)
    x, y = classification_data(rows=8)
    fit(session, [(x, y)], epochs=1, callbacks=[WeightEMA(DECAY)], progress=False)
    resumed = TrainingSession(directory, checkpoint=session.save_checkpoint(tmp_path / "ck"))
    with pytest.raises(InvalidValueError, match=f"decay {DECAY}"):
        fit(resumed, [(x, y)], epochs=1, callbacks=[WeightEMA(0.5)], progress=False)
    resumed.weight_ema = None  # dropped: the next checkpoint holds no average
    plain = TrainingSession(directory, checkpoint=resumed.save_checkpoint(tmp_path / "plain"))
    assert plain.weight_ema is None and not load_checkpoint(tmp_path / "plain").frozen

"""The EMA of weights (onnxblocks.runtime.ema.WeightEMA) against torch's AveragedModel with get_ema_multi_avg_fn.

A portable MLP trains 12 steps with SGD and momentum under ``fit``; the average
after each step equals what ``torch.optim.swa_utils.AveragedModel`` computes from
the same sequence of weights (rtol 1e-6), the export inside ``applied`` holds the
averaged weights (and the session gets its raw ones back), and ``save``/``load``
round-trip the average exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from support.runtime_support import PARAMS, classification_data, mlp_model

from onnxblocks import artifacts, optim
from onnxblocks.errors import InvalidValueError, StateError
from onnxblocks.runtime import TrainingSession, fit
from onnxblocks.runtime.callbacks import Callback
from onnxblocks.runtime.ema import WeightEMA

DECAY = 0.9


class _Record(Callback):
    def __init__(self) -> None:
        self.weights: list[dict[str, np.ndarray]] = []

    def on_step_end(self, run) -> None:
        self.weights.append(run.session.parameters(trainable_only=True))


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

    first = record.weights[0]
    module = torch.nn.ParameterDict(
        {n.replace(".", "_"): torch.nn.Parameter(torch.zeros(first[n].shape)) for n in PARAMS}
    )
    averaged = torch.optim.swa_utils.AveragedModel(
        module, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(DECAY)
    )
    for weights in record.weights:
        with torch.no_grad():
            for n in PARAMS:
                module[n.replace(".", "_")].copy_(torch.from_numpy(weights[n]))
        averaged.update_parameters(module)
    for n in PARAMS:
        want = averaged.module[n.replace(".", "_")].detach().numpy()
        np.testing.assert_allclose(ema.average[n], want, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(ema.average["fc1.weight"], record.weights[-1]["fc1.weight"])

    raw = session.parameters(trainable_only=True)
    with ema.applied(session):
        session.export_inference_model(tmp_path / "ema.onnx")
    exported = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(tmp_path / "ema.onnx").graph.initializer}
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

"""``F.interpolate`` (``aten::upsample_nearest{1,2,3}d``, ``upsample_bilinear2d``) trained through ONNX Runtime.

ONNX Runtime 1.19.2 has no CPU kernel for ``ResizeGrad``; ``resize_as_matmul`` rewrites each ``Resize`` into
products with constant interpolation matrices. Each case is exported by dynamo and by torchscript (a dynamic
batch: the dynamo exporter then computes an explicit ``size`` at run time from the input's shape) and
differentiated two ways: ``OrtModule`` (the training build) and the VJP graph lowered to standard ops (the
portable path). Outputs and the input's gradient are compared with torch in float32 and float64.

One deviation is by design and tested as such: for nearest resizing to a size whose index product lands near an
integer (14 -> 16), the torchscript exporter's ``Resize`` keeps ONNX Runtime's index (it records no aten call);
the dynamo exporter's gets torch's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.numerics import assert_close

from onnxblocks._core.ort import onnxruntime
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops
from onnxblocks.torch import OrtModule
from onnxblocks.torch.export import export_module

RTOL = 1e-5  # float32 interpolation weights, summed over a few terms

CASES = {
    "nearest1d-x2": ((2, 3, 5), {"scale_factor": 2, "mode": "nearest"}),
    "nearest1d-size-14to16": ((2, 3, 14), {"size": 16, "mode": "nearest"}),
    "nearest2d-x1.5": ((2, 3, 4, 5), {"scale_factor": 1.5, "mode": "nearest"}),
    "nearest2d-x0.12-x2.2": ((2, 2, 25, 6), {"scale_factor": (0.12, 2.2), "mode": "nearest"}),
    "nearest2d-size": ((2, 3, 4, 5), {"size": (7, 3), "mode": "nearest"}),
    "nearest3d-x2": ((1, 2, 3, 4, 5), {"scale_factor": 2, "mode": "nearest"}),
    "nearest3d-size": ((1, 2, 3, 4, 5), {"size": (5, 3, 7), "mode": "nearest"}),
    "bilinear-x2": ((2, 3, 4, 5), {"scale_factor": 2, "mode": "bilinear", "align_corners": False}),
    "bilinear-x2-corners": (
        (2, 3, 4, 5),
        {"scale_factor": 2, "mode": "bilinear", "align_corners": True},
    ),
    "bilinear-x1.7": (
        (2, 3, 4, 5),
        {"scale_factor": 1.7, "mode": "bilinear", "align_corners": False},
    ),
    "bilinear-size": ((2, 3, 4, 5), {"size": (7, 3), "mode": "bilinear", "align_corners": False}),
    "bilinear-size-corners": (
        (2, 3, 4, 5),
        {"size": (7, 3), "mode": "bilinear", "align_corners": True},
    ),
}


class Upsample(torch.nn.Module):
    def __init__(self, options: dict) -> None:
        super().__init__()
        self.options = options

    def forward(self, x):
        return F.interpolate(x, **self.options)


def _torch(options: dict, x: np.ndarray, grad_out: np.ndarray, dtype: torch.dtype):
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    y = Upsample(options)(xt)
    (y * torch.tensor(grad_out, dtype=dtype)).sum().backward()
    return y.detach(), xt.grad


def _portable(options: dict, x: np.ndarray, grad_out: np.ndarray, exporter: str):
    exported = export_module(Upsample(options), (torch.tensor(x),), {}, exporter, dynamic="batch")
    vjp = build_vjp_graph(
        exported.model, requires_grad=[exported.inputs[0]], outputs=exported.outputs
    )
    assert vjp.rewrites["resize_as_matmul"] == 1
    lowered = vjp.model
    lower_training_ops(lowered)
    assert not non_portable_ops(lowered), [op for _, op, _ in non_portable_ops(lowered)]
    session = onnxruntime().InferenceSession(
        lowered.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    got = dict(
        zip(
            names,
            session.run(None, {exported.inputs[0]: x, vjp.output_grads[0]: grad_out}),
            strict=True,
        )
    )
    return got[exported.outputs[0]], got[f"{exported.inputs[0]}_grad"]


def _training(options: dict, x: np.ndarray, grad_out: np.ndarray, exporter: str):
    xt = torch.tensor(x, requires_grad=True)
    y = OrtModule(Upsample(options), exporter=exporter)(xt)
    (y * torch.tensor(grad_out)).sum().backward()
    return y.detach(), xt.grad


@pytest.mark.parametrize("backend", ["training", "portable"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", list(CASES))
def test_upsample_gradients_match_torch(case, exporter, backend):
    shape, options = CASES[case]
    rng = np.random.default_rng(21)
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        out_shape = Upsample(options)(torch.tensor(x)).shape
    grad_out = rng.standard_normal(tuple(out_shape)).astype(np.float32)
    expected, grad = _torch(options, x, grad_out, torch.float32)
    expected64, grad64 = _torch(options, x, grad_out, torch.float64)
    if (
        case == "nearest1d-size-14to16" and exporter == "torchscript"
    ):  # ONNX Runtime's index 6 for output 8
        source = np.minimum(np.floor(np.arange(16) / np.float32(16 / 14)).astype(np.int64), 13)
        assert source[8] == 6 and np.floor(8 * np.float32(14 / 16)) == 7
        expected = expected64 = torch.tensor(x.astype(np.float64)[..., source])
        dy = torch.tensor(grad_out, dtype=torch.float64)
        grad = grad64 = torch.zeros(shape, dtype=torch.float64).index_add_(
            -1, torch.tensor(source), dy
        )
    # the operands' magnitudes: interpolation weights are not negative, so the same maps of |x| and |dy|
    out_scale, grad_scale = _torch(options, np.abs(x), np.abs(grad_out), torch.float64)
    run = _training if backend == "training" else _portable
    y, dx = run(options, x, grad_out, exporter)
    assert_close(y, expected, expected64, rtol=RTOL, scale=out_scale, name="output")
    assert_close(dx, grad, grad64, rtol=RTOL, scale=grad_scale, name="input gradient")

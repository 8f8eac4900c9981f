"""Which form an optimizer's artifacts get, and that its spec says so.

``AdamW()`` and ``SGD()`` are ONNX Runtime's kernels (``form="onnxruntime"``); the options those
kernels cannot express (AdamW's amsgrad, maximize and groups; SGD's momentum, decay, maximize and
groups) give torch's algorithm in standard ops (``form="standard"``). The model built, the spec the
block hands on and the spec read back from the model on disk agree on the form.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxblocks
from onnxblocks._core.contracts import OPTIMIZER_METADATA
from onnxblocks.optim import SGD, AdamW
from onnxblocks.portable.optimizer import read_optimizer

KERNELS = {"AdamWOptimizer", "SGDOptimizerV2"}
BIAS_GROUP = [{"params": ["b"], "weight_decay": 0.0}]

CASES = {
    "adamw": (lambda: AdamW(), "onnxruntime"),
    "adamw-hf": (lambda: AdamW(mode="hf", clip_grad=1.0), "onnxruntime"),
    "adamw-amsgrad": (lambda: AdamW(amsgrad=True), "standard"),
    "adamw-maximize": (lambda: AdamW(maximize=True), "standard"),
    "adamw-groups": (lambda: AdamW(param_groups=BIAS_GROUP), "standard"),
    "sgd": (lambda: SGD(clip_grad=2.0), "onnxruntime"),
    "sgd-momentum": (lambda: SGD(momentum=0.9), "standard"),
    "sgd-groups": (lambda: SGD(param_groups=[{"params": ["b"], "lr": 0.1}]), "standard"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_spec_names_the_form_the_model_has(case):
    make, form = CASES[case]
    block = make()
    trainable = [numpy_helper.from_array(np.zeros(3, np.float32), n) for n in ("w", "b")]
    with onnxblocks.empty_base():
        block((trainable, []))
    model = block.to_model_proto()
    spec = block.optimizer_spec
    assert spec is not None and spec.form == form
    assert (block.standard is None) == (form == "onnxruntime")
    kernels = {n.op_type for n in model.graph.node} & KERNELS
    metadata = {p.key for p in model.metadata_props}
    if form == "onnxruntime":
        assert len(kernels) == 1 and OPTIMIZER_METADATA not in metadata
        assert not spec.exact  # the kernel's float32 arithmetic
    else:
        assert not kernels and OPTIMIZER_METADATA in metadata
        assert [name for name, _ in spec.params] == ["w", "b"]
    assert read_optimizer(onnx.load_from_string(model.SerializeToString())).form == form

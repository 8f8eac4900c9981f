"""ORTModule's ``test_gradient_correctness_einsum`` equations at their full size: memory and values against torch.

``"sec,sm->ecm"`` and its mirror ``"sec,ecm->sm"`` (s=1024, e=64, c=32, m=768) once wrote the whole
``[s, e, c, m]`` product (6 GiB a tensor, 23.8 GB for the run). Each is run in a child process of its own, torch
eager and ``OrtModule`` (``support/einsum_memory.py``): the peak of the resident set during one forward and backward
at the full size (after a warm-up at a small size that builds the graphs), and the tensors of that call.

The bound: ours at most torch's peak plus the operands, output and gradients of the call (``io_bytes``): whatever
ONNX Runtime copies or keeps beyond torch, it is no more than one more copy of what the call reads and writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.numerics import assert_close

WORKER = Path(__file__).resolve().parents[1] / "support" / "einsum_memory.py"
EQUATIONS = ["sec,sm->ecm", "sec,ecm->sm"]
MIB = 1 << 20


def _measure(kind: str, equation: str, npz: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(WORKER), kind, equation, str(npz)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{kind} {equation} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """Per equation, the torch and OrtModule runs (figures, and the ``.npz`` of the full-size call)."""
    folder = tmp_path_factory.mktemp("einsum_memory")
    runs: dict[str, dict[str, dict]] = {}
    for i, equation in enumerate(EQUATIONS):
        runs[equation] = {}
        for kind in ("torch", "ortmodule"):
            npz = folder / f"{kind}{i}.npz"
            runs[equation][kind] = _measure(kind, equation, npz) | {"npz": npz}
    return runs


@pytest.mark.parametrize("equation", EQUATIONS)
def test_peak_memory_within_torch_and_one_copy_of_the_call(measured, equation):
    ours, theirs = measured[equation]["ortmodule"], measured[equation]["torch"]
    assert ours["exports"] == 1, (
        "the full-size call exported again: the warm-up's graph is not what was measured"
    )
    report = (
        f"{equation}: OrtModule {ours['peak_bytes'] / MIB:.1f} MiB, torch {theirs['peak_bytes'] / MIB:.1f} MiB, "
        f"operands, output and gradients {ours['io_bytes'] / MIB:.1f} MiB"
    )
    print(report)
    assert ours["peak_bytes"] <= theirs["peak_bytes"] + ours["io_bytes"], report


@pytest.mark.parametrize("equation", EQUATIONS)
def test_ortmodule_matches_torch_at_full_size(measured, equation):
    with np.load(measured[equation]["ortmodule"]["npz"]) as data:
        got = {k: data[k] for k in data.files}

    def reference(dtype, absolute=False):
        left, right, bias, grad = (
            torch.tensor(got[k], dtype=dtype) for k in ("left", "right", "bias", "grad")
        )
        if absolute:
            left, right, bias, grad = left.abs(), right.abs(), bias.abs(), grad.abs()
        for t in (left, right, bias):
            t.requires_grad_(True)
        out = torch.einsum(equation, left + bias, right)
        out.backward(grad)
        return {
            "out": out.detach(),
            "left_grad": left.grad,
            "right_grad": right.grad,
            "bias_grad": bias.grad,
        }

    expected, expected64 = reference(torch.float32), reference(torch.float64)
    scale = reference(torch.float64, absolute=True)
    for name in ("out", "left_grad", "right_grad", "bias_grad"):
        assert_close(
            got[name], expected[name], expected64[name], rtol=1e-5, scale=scale[name], name=name
        )

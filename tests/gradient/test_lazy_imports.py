"""onnx-ir's sympy is loaded only when symbolic dimensions are computed with (0.2 s off every build)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, time
import onnxblocks.gradient
import onnx_ir as ir
loaded = type(sys.modules["sympy"]).__name__ == "module"
dim = ir.SymbolicDim("N") * 2
print(loaded, dim, type(sys.modules["sympy"]).__name__ == "module")
"""


def test_sympy_loads_on_first_use_only():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "2*N", "True"]

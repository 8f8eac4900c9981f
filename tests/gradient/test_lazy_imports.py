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


def test_no_entry_point_of_the_graph_packages_loads_sympy():
    probe = (
        "import sys, importlib\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print(type(sys.modules.get('sympy')).__name__)\n"
    )
    entries = ["onnxblocks.artifacts", "onnxblocks.blocks.value_index", "onnxblocks.losses"]
    for entry in entries:
        out = subprocess.run(
            [sys.executable, "-c", probe, entry], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out != "module", f"importing {entry} loaded sympy"

"""``onnxblocks doctor`` on this Python (the training build): in-process gradient builder, both backends.

Its answer on Python 3.13 (a worker Python) is checked in tests/artifacts/test_generate_any_python.py.
"""

from __future__ import annotations

import json
import sys

from onnxblocks.cli import main


def test_doctor_reports_this_python_first_with_the_in_process_builder(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    here = report["pythons"][0]
    assert here["found_by"] == "this Python" and here["python"] == sys.executable
    assert here["onnxruntime"] == "1.19.2" and here["training_build"] is True
    assert here["gradient_builder"] == "in-process (onnxruntime-training)"
    for other in report["pythons"][1:]:  # every other Python: what it would use
        expected = "in-process" if other["version"] in ("3.10", "3.11", "3.12") else "worker"
        assert other["gradient_builder"].startswith(expected), other


def test_doctor_prints_one_block_per_python(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"Python {sys.version_info.major}.{sys.version_info.minor}  {sys.executable}  (this Python)"
    )
    assert "  gradient builder: in-process (onnxruntime-training)" in out

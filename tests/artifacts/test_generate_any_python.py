"""generate_artifacts on Python 3.13 (stock onnxruntime) writes the same artifacts, byte for byte, as on 3.11.

On 3.13 everything runs in-process except ONNX Runtime's gradient builder, which
goes to a worker Python 3.10-3.12 with onnxruntime-training found through pyenv,
uv or the PATH (its environment is created on first use in the test cache). The
custom Block below is defined in this file: the 3.13 side runs this very file as
a script, so it imports only what the 3.13 venv has (no pytest, no test support
at module level); the Block itself never reaches the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks import Block, blocks, losses
from onnxblocks.artifacts import OptimType, generate_artifacts

ROOT = Path(__file__).resolve().parents[2]


class WeightedTail(Block):
    """A custom loss defined in a notebook or test: cross entropy plus a weighted squared penalty on the logits."""

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight

    def build(self, logits: str) -> str:
        penalty = blocks.ReduceMean(keepdims=False)(blocks.Mul()(logits, logits))
        return losses.CrossEntropyLoss()(logits) + penalty * self.weight


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("MatMul", ["a", "w2"], ["logits"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def generate(directory: str | os.PathLike[str]) -> list[str]:
    """The artifacts of the MLP with the custom loss; their names."""
    artifacts = generate_artifacts(
        mlp(),
        requires_grad=["w1", "b1", "w2"],
        loss=WeightedTail(0.01),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
    )
    return sorted(p.name for p in artifacts.files)


def _run_313(python: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONNXBLOCKS_")}
    env.update(PYTHONPATH=str(ROOT), ONNXBLOCKS_CACHE=str(cache))
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
        check=False,
    )


def _worker_cache() -> Path:
    from support.portable_env import cache_dir

    return cache_dir() / "gradient-worker"


def test_python_313_writes_the_same_artifacts_as_311(tmp_path, portable_python):
    here = generate(tmp_path / "py311")
    done = _run_313(portable_python, _worker_cache(), __file__, str(tmp_path / "py313"))
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        answer["python"][:2] == [3, 13] and answer["training_build"] is False
    )  # stock onnxruntime there
    assert answer["files"] == here
    for name in here:
        assert (tmp_path / "py313" / name).read_bytes() == (
            tmp_path / "py311" / name
        ).read_bytes(), name


def test_doctor_names_the_gradient_builder_on_311_and_313(portable_python):
    done = _run_313(portable_python, _worker_cache(), "-m", "onnxblocks", "doctor", "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    on_313 = json.loads(done.stdout)["pythons"][0]
    assert on_313["found_by"] == "this Python" and on_313["version"] == "3.13"
    assert on_313["training_build"] is False and on_313["backend"] == "portable (stock onnxruntime)"
    assert on_313["gradient_builder"].startswith("worker (Python 3.1")

    proc = subprocess.run(
        [sys.executable, "-c", "from onnxblocks.cli import main; main(['doctor', '--json'])"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    on_311 = json.loads(proc.stdout)["pythons"][0]
    assert on_311["version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert on_311["gradient_builder"] == "in-process (onnxruntime-training)"
    assert on_311["backend"] == "training API + portable"


if __name__ == "__main__":  # the Python 3.13 side: generate into argv[1], print what ran
    from onnxblocks._core.ort import has_training_build

    names = generate(sys.argv[1])
    print(
        json.dumps(
            {
                "python": list(sys.version_info[:3]),
                "training_build": has_training_build(),
                "files": names,
            }
        )
    )

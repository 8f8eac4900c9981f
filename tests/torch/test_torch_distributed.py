"""Data-parallel training on 2 processes (``torchrun --nproc-per-node 2``, gloo, localhost) equals 1 process.

``tests/support/ddp_worker.py`` trains on each rank's half of every batch; here one process
trains on the full batches. After 10 AdamW steps the parameters must agree within rtol 1e-5
plus the float32 floor (``support.numerics``: two runs of ours that add the batch in another order,
neither the truth), and the two ranks must be identical:

* ``DDP(OrtModule(model))``: torch all-reduces the gradients ONNX Runtime computed;
* a torch-free ``TrainingSession`` with ``onnxblocks.torch.distributed.DataParallel`` and ``fit``,
  for the training build's artifacts and for portable ones: the gradients are all-reduced
  between the training model and the optimizer model; only rank 0 writes checkpoints and progress.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import ddp_worker
from support.numerics import assert_close, is_close

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.runtime import ArrayBatches, TrainingSession, fit
from onnxblocks.torch import OrtModule
from onnxblocks.torch.export import export_module

RTOL = 1e-5
WORKER = Path(ddp_worker.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _artifacts(directory: Path, portable: bool) -> Path:
    x, _ = ddp_worker.data(8)
    exported = export_module(ddp_worker.make_model(), (torch.from_numpy(x),), {}, "dynamo")
    generate_artifacts(
        exported.model,
        requires_grad=list(exported.weights),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=portable,
    )
    return directory


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Run the worker on 2 ranks once; return its output folder and the artifact folders it trained."""
    base = tmp_path_factory.mktemp("ddp")
    directories = [_artifacts(base / kind, kind == "portable") for kind in ("training", "portable")]
    out = base / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(WORKER), str(out), *map(str, directories),
    ]  # fmt: skip
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]),
    )
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, (
        f"torchrun failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return out, directories


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files}


def _same(actual: dict, expected: dict, what: str) -> None:
    assert sorted(actual) == sorted(expected), what
    for name in expected:
        assert_close(actual[name], expected[name], rtol=RTOL, name=f"{what}: {name}")


def test_ddp_of_ort_module_equals_one_process(launched):
    out, _ = launched
    ranks = [_load(out / f"module-rank{r}.npz") for r in range(2)]
    for name in ranks[0]:
        np.testing.assert_array_equal(
            ranks[0][name], ranks[1][name], err_msg=f"ranks differ on {name}"
        )
    model = OrtModule(ddp_worker.make_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=ddp_worker.LR)
    x, y = ddp_worker.data(8 * ddp_worker.STEPS)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(ddp_worker.STEPS):
        rows = slice(step * 8, (step + 1) * 8)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x[rows])), torch.from_numpy(y[rows])
        ).backward()
        optimizer.step()
    expected = {n: p.detach().numpy() for n, p in model.named_parameters()}
    _same(ranks[0], expected, "DDP(OrtModule) on 2 ranks against 1 process")
    assert any(not is_close(expected[n], before[n], rtol=RTOL) for n in expected)  # it did train


@pytest.mark.parametrize(("key", "kind"), [(0, "training"), (1, "portable")])
def test_data_parallel_session_equals_one_process(launched, key, kind):
    out, directories = launched
    ranks = [_load(out / f"session-{key}-rank{r}.npz") for r in range(2)]
    for name in ranks[0]:
        np.testing.assert_array_equal(
            ranks[0][name], ranks[1][name], err_msg=f"ranks differ on {name}"
        )
    session = TrainingSession(directories[key])
    assert session.backend == kind
    session.learning_rate = ddp_worker.LR
    initial = session.parameters()
    history = fit(
        session, ArrayBatches(ddp_worker.data(40), batch_size=8, seed=0), epochs=2, progress=False
    )
    assert history.steps == ddp_worker.STEPS
    _same(
        ranks[0], session.parameters(), f"DataParallel {kind} session on 2 ranks against 1 process"
    )
    assert any(not is_close(ranks[0][n], initial[n], rtol=RTOL) for n in initial)
    # rank 0 alone writes checkpoints and shows progress
    assert (out / f"{key}-rank0" / "ckpt").exists()
    assert not (out / f"{key}-rank1").exists() or not any((out / f"{key}-rank1").iterdir())
    assert (out / f"{key}-progress-rank0.txt").read_text().strip()
    assert not (out / f"{key}-progress-rank1.txt").read_text().strip()

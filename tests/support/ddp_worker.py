"""One rank of the data-parallel parity test (tests/torch/test_torch_distributed.py), launched by torchrun.

``python -m torch.distributed.run --nproc-per-node 2 ddp_worker.py <out_dir> <artifact_dir>...`` trains, on this
rank's half of every batch, with gloo:

* ``DDP(OrtModule(model))``: 10 AdamW steps (``module-rank<r>.npz``: the parameters afterwards);
* for each artifact directory: a ``TrainingSession`` with ``DataParallel``, ``fit`` for 10 steps with a
  ``SaveCheckpoint`` to ``<out_dir>/<k>-rank<r>/ckpt`` and its progress on ``<out_dir>/<k>-progress-rank<r>.txt``
  (``session-<k>-rank<r>.npz``: the parameters afterwards).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

STEPS = 10
LR = 1e-2


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, 6)).astype(np.float32), rng.integers(0, 3, rows).astype(
        np.int64
    )


def train_module(rank: int, world: int, full_batch: int = 8) -> dict[str, np.ndarray]:
    """10 AdamW steps of ``DDP(OrtModule(model))``; each rank takes its rows of every full batch."""
    from onnxblocks.torch import OrtModule

    model = torch.nn.parallel.DistributedDataParallel(OrtModule(make_model()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = data(full_batch * STEPS)
    half = full_batch // world
    for step in range(STEPS):
        rows = slice(step * full_batch + rank * half, step * full_batch + (rank + 1) * half)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x[rows])), torch.from_numpy(y[rows])
        )
        loss.backward()
        optimizer.step()
    return {n: p.detach().numpy().copy() for n, p in model.module.named_parameters()}


def train_session(
    directory: str, out: str, key: str, rank: int, world: int
) -> dict[str, np.ndarray]:
    from onnxblocks.runtime import ProgressBar, SaveCheckpoint, TrainingSession, fit
    from onnxblocks.torch.distributed import DataParallel

    session = TrainingSession(directory)
    session.learning_rate = LR
    parallel = DataParallel(session)
    x, y = data(40)
    batches = parallel.batches((x, y), batch_size=8 // world, seed=0)  # 5 steps per epoch
    checkpoint = os.path.join(out, f"{key}-rank{rank}", "ckpt")
    with open(os.path.join(out, f"{key}-progress-rank{rank}.txt"), "w") as stream:
        fit(
            session,
            batches,
            epochs=2,
            callbacks=[SaveCheckpoint(checkpoint)],
            progress=ProgressBar(stream=stream),
        )
    parallel.close()
    return session.parameters()


def main() -> None:
    out, directories = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    np.savez(os.path.join(out, f"module-rank{rank}.npz"), **train_module(rank, world))
    for k, directory in enumerate(directories):
        params = train_session(directory, out, str(k), rank, world)
        np.savez(os.path.join(out, f"session-{k}-rank{rank}.npz"), **params)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

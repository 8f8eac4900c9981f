"""Data-parallel training of a torch-free :class:`~onnxblocks.runtime.TrainingSession` over
``torch.distributed``.

The runtime stays torch-free; this optional extra borrows torch's collectives (gloo on
the CPU) as the transport. Each process (rank) opens the same artifacts, trains on its
shard of every batch, and :class:`DataParallel` averages the gradients of all ranks
between ``train_step`` and ``optimizer_step``:

* at construction, rank 0's parameters are broadcast, so every rank starts from the same point;
* before each optimizer step (``session.optimizer_step()``, ``session.train_and_update(...)``,
  or :func:`~onnxblocks.runtime.fit`) the accumulated gradients are read, all-reduced
  (one ``all_reduce`` per dtype over the gradients flattened together) and divided by
  the number of ranks, then written back into the buffers the optimizer model reads;
* ``train_and_update`` therefore runs unfused (the training model, then the optimizer
  model): a fused step model never exposes its gradients. ``benchmarks/bench_torch.py``
  measures what that costs;
* :meth:`DataParallel.batches` gives each rank its rows of every batch
  (``ArrayBatches(..., shard=(rank, world_size))``), and ``fit`` shows its progress bar and
  writes checkpoints on rank 0 only.

Example (``torchrun --nproc-per-node 2 train.py``)::

    import torch.distributed as dist
    from onnxblocks.runtime import TrainingSession, fit
    from onnxblocks.torch.distributed import DataParallel

    dist.init_process_group("gloo")
    session = TrainingSession("artifacts")
    parallel = DataParallel(session)
    batches = parallel.batches((x, y), batch_size=16, seed=0)   # 16 rows per rank, 32 per step
    fit(session, batches, epochs=3)

With a mean loss, 2 ranks on half-batches take the same steps as 1 process on the full batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from onnxblocks._core.errors import StateError
from onnxblocks.runtime.data import ArrayBatches
from onnxblocks.runtime.session import TrainingSession

__all__ = ["DataParallel"]


class DataParallel:
    """Average a :class:`~onnxblocks.runtime.TrainingSession`'s gradients over the ranks of
    ``torch.distributed``.

    Args:
        session: The session to train (it is given this object as its ``gradient_reducer``).
        group: The process group (torch's default group when None).

    Attributes:
        rank: This process's rank in the group.
        world_size: The number of ranks.

    Raises:
        StateError: when ``torch.distributed`` is not initialised.
    """

    def __init__(self, session: TrainingSession, group: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise StateError(
                "DataParallel needs torch.distributed initialised: call "
                "torch.distributed.init_process_group('gloo') "
                "in each process (torchrun --nproc-per-node N sets the environment it reads)."
            )
        self.session = session
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.broadcast_parameters()
        session.gradient_reducer = self

    def __call__(self, session: TrainingSession) -> None:
        """The session's ``gradient_reducer``: :meth:`all_reduce_gradients`."""
        self.all_reduce_gradients()

    def _all_reduce(
        self, arrays: dict[str, np.ndarray], average: bool, source: int | None = None
    ) -> dict[str, Any]:
        """``arrays`` summed (or broadcast from ``source``) over the ranks: one collective per
        dtype.
        """
        out: dict[str, np.ndarray] = {}
        names = sorted(arrays)
        for dtype in sorted({arrays[n].dtype.str for n in names}):
            group = [n for n in names if arrays[n].dtype.str == dtype]
            flat = torch.from_numpy(np.concatenate([np.ravel(arrays[n]) for n in group]))
            if source is None:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
                if average:
                    flat /= self.world_size
            else:
                dist.broadcast(flat, src=source, group=self.group)
            values, start = flat.numpy(), 0
            for n in group:
                size = arrays[n].size
                out[n] = values[start : start + size].reshape(arrays[n].shape)
                start += size
        return out

    def all_reduce_gradients(self) -> None:
        """Replace the session's accumulated gradients by their mean over the ranks."""
        gradients = self.session.gradients()
        if gradients:
            self.session.set_gradients(self._all_reduce(gradients, average=True))

    def broadcast_parameters(self) -> None:
        """Give every rank rank 0's parameters (trainable and frozen)."""
        parameters = self.session.parameters()
        if parameters:
            self.session.set_parameters(self._all_reduce(parameters, average=False, source=0))

    def batches(
        self,
        arrays: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> ArrayBatches:
        """``ArrayBatches`` of this rank's shard: ``batch_size`` rows per rank, the same ``seed``
        on every rank.
        """
        return ArrayBatches(
            arrays,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            shard=(self.rank, self.world_size),
        )

    @property
    def is_main(self) -> bool:
        """True on rank 0 (which writes checkpoints and shows progress)."""
        return self.rank == 0

    def close(self) -> None:
        """Stop reducing: the session trains alone again."""
        session = self.session
        if session.gradient_reducer is self:
            session.gradient_reducer = None

"""What keeping the optimizer state between rounds costs a client (``keep-optimizer-state``), per
round.

Usage::

    python benchmarks/bench_federated_state.py                # spiral MLP (64, 64), AdamW, both
    backends
    python benchmarks/bench_federated_state.py --rounds 10 --hidden 256,256

For each backend, one client's round (``onnxblocks.federated.train_client``: a fresh session, the
global
parameters written, one epoch of ``fit``) is timed fresh (the default) and with the state kept (read
after training, restored before the next round through the session's checkpoint), side by side in
one
process, alternating. Printed: the median round time of each and their ratio, and the state's size.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from onnxblocks import artifacts, optim
from onnxblocks.datasets import spirals
from onnxblocks.demo import build_classifier
from onnxblocks.federated import train_client
from onnxblocks.losses import CrossEntropyLoss
from onnxblocks.runtime import TrainingSession


def _artifacts(root: Path, hidden: tuple[int, ...], portable: bool) -> Path:
    model = build_classifier(hidden=hidden, seed=0)
    out = root / ("portable" if portable else "training")
    artifacts.generate_artifacts(
        model,
        requires_grad=[i.name for i in model.graph.initializer],
        loss=CrossEntropyLoss(),
        optimizer=optim.AdamW(weight_decay=0.0),
        artifact_directory=out,
        portable=portable,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=7, help="rounds timed per mode (median reported)"
    )
    parser.add_argument("--hidden", default="64,64", help="hidden widths of the spiral MLP")
    parser.add_argument("--rows", type=int, default=256, help="rows of the client's data")
    args = parser.parse_args()
    hidden = tuple(int(h) for h in args.hidden.split(","))
    x, y = spirals(points_per_class=args.rows // 3 + 1, seed=0)
    config = {"local-epochs": 1, "batch-size": 32, "shuffle": False, "lr": 0.01}
    print(
        f"spiral MLP {hidden}, AdamW, {args.rows} rows, batch 32, one epoch per round, "
        f"{args.rounds} rounds"
    )
    print(f"{'backend':<10} {'fresh s':>9} {'kept s':>9} {'ratio':>7} {'state KB':>9}")
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        data = {"features": x[: args.rows], "labels": y[: args.rows]}
        for portable in (False, True):
            art = _artifacts(root, hidden, portable)
            params = TrainingSession(art).parameters(trainable_only=True)
            times: dict[str, list[float]] = {"fresh": [], "kept": []}
            state = None
            update = None
            for _ in range(args.rounds):
                for mode in ("fresh", "kept"):
                    keep = mode == "kept"
                    start = time.perf_counter()
                    update = train_client(
                        art,
                        data,
                        params,
                        config,
                        optimizer_state=state if keep else None,
                        keep_optimizer_state=keep,
                    )
                    times[mode].append(time.perf_counter() - start)
                    if keep:
                        state = update.optimizer_state
            assert update is not None and update.optimizer_state is not None
            size = sum(np.asarray(a).nbytes for a in update.optimizer_state.moments.values()) / 1024
            fresh, kept = statistics.median(times["fresh"]), statistics.median(times["kept"])
            backend = "portable" if portable else "training"
            print(f"{backend:<10} {fresh:>9.3f} {kept:>9.3f} {kept / fresh:>7.2f} {size:>9.1f}")


if __name__ == "__main__":
    main()

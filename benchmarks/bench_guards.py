"""What the runtime's input guards cost per step, against the step they guard.

Usage::

    python benchmarks/bench_guards.py               # prints a table
    python benchmarks/bench_guards.py --repeat 2000

``TrainingSession`` runs :class:`onnxblocks.runtime.guards.BatchGuard` before
every ``train_step`` / ``eval_step``: the empty-batch check always (a look at
each input's shape), the index-range check (class labels, token ids: one
``min``/``max`` pass over each index input) when ``check_inputs`` is on. This
script times both on label and token-id arrays of several sizes, and a
``train_step`` of a small MLP classifier (2 -> 16 -> 3, cross entropy, AdamW)
with the guards on and off, on this machine's CPU. Figures are medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.runtime_support import classification_data, generate  # noqa: E402

from onnxblocks.runtime import TrainingSession  # noqa: E402
from onnxblocks.runtime.guards import BatchGuard, IndexRule  # noqa: E402
from onnxblocks.runtime.inputs import InputSpec  # noqa: E402


def _median_us(fn, repeat: int) -> float:
    for _ in range(min(50, repeat)):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _guard(shape: tuple[int, ...], classes: int) -> BatchGuard:
    guard = BatchGuard(None, [InputSpec("ids", np.dtype(np.int64), tuple("d" for _ in shape))])
    guard.rules = {0: [IndexRule("ids", 0, classes, frozenset(), f"the {classes} classes")]}
    return guard


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=1000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for label, shape, classes in (
        ("labels [32]", (32,), 10),
        ("labels [256]", (256,), 10),
        ("labels [4096]", (4096,), 1000),
        ("token ids [8, 512]", (8, 512), 50257),
        ("token ids [256, 512]", (256, 512), 50257),
    ):
        ids = rng.integers(0, classes, shape, dtype=np.int64)
        guard = _guard(shape, classes)
        always = _median_us(
            lambda g=guard, a=ids: g.check([a], "train_step", values=False), args.repeat
        )
        values = _median_us(
            lambda g=guard, a=ids: g.check([a], "train_step", values=True), args.repeat
        )
        rows.append((label, always, values))
    with tempfile.TemporaryDirectory() as tmp:
        directory = generate(Path(tmp) / "mlp")
        x, y = classification_data(rows=32)
        steps = {}
        for check in (True, False):
            session = TrainingSession(directory, check_inputs=check)
            steps[check] = _median_us(lambda s=session: s.train_step(x, y), args.repeat)
    print(f"{'input':<24}{'empty check µs':>16}{'range check µs':>16}")
    for label, always, values in rows:
        print(f"{label:<24}{always:>16.2f}{values:>16.2f}")
    print(
        f"\ntrain_step, MLP 2-16-3, batch 32: {steps[True]:.1f} µs with check_inputs=True, "
        f"{steps[False]:.1f} µs with check_inputs=False"
    )


if __name__ == "__main__":
    main()

"""What issue 12's build-side checks cost: model intake, Pow rewrite, dependency checks, and the
locked commit.

Usage::

    python benchmarks/bench_reliability.py                    # the GPT 162 M model of bench_models
    (cached)
    python benchmarks/bench_reliability.py --model gpt-tiny --repeat 5

Builds the artifacts of a benchmark model once per repeat (every parameter trainable, cross
entropy) and times, inside that call, each step issue 12 added: ``intake.fit_model`` (opset import,
conversion, topological order; it runs twice, in ``base()`` and in the gradient builder),
``pow_exponent_as_exp_log``, ``dependencies.check_differentiable``, and the commit of the set
under the directory lock (recovery scan, journal, moves; from the second run on it replaces the
previous run's set). Prints the mean of each per call, and its share of the median call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_models import DEFAULT_CACHE_DIR, ensure_model

import onnxblocks
from onnxblocks.artifacts import files
from onnxblocks.gradient import builder, dependencies, intake


def _timed(module: object, name: str, sink: dict[str, list[float]]) -> None:
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            sink[name].append(time.perf_counter() - start)

    setattr(module, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gpt162m", help="a bench_models name (default gpt162m)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()

    built = ensure_model(args.model, args.cache_dir)
    import onnx

    model = onnx.load(built.path, load_external_data=False)
    steps: dict[str, list[float]] = defaultdict(list)
    _timed(intake, "fit_model", steps)  # base() looks it up in the module on each call
    _timed(builder, "fit_model", steps)
    _timed(builder, "pow_exponent_as_exp_log", steps)
    _timed(dependencies, "check_differentiable", steps)
    _timed(files, "_commit", steps)
    _timed(files, "recover_stale", steps)
    totals = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.repeat):
            start = time.perf_counter()
            onnxblocks.generate_artifacts(
                model,
                requires_grad=built.params,
                loss=onnxblocks.LossType.CrossEntropyLoss,
                artifact_directory=Path(work) / "out",
                model_path=built.path,
            )
            totals.append(time.perf_counter() - start)
            print(f"[bench] run {i + 1}: {totals[-1]:.2f} s", file=sys.stderr, flush=True)
        total = statistics.median(totals)
        set_bytes = sum(p.stat().st_size for p in (Path(work) / "out").iterdir())
    per_call = {name: sum(times) / args.repeat for name, times in steps.items()}
    print(
        f"Model {built.name}: {len(model.graph.node)} nodes, {built.num_params / 1e6:.0f} M "
        "parameters."
    )
    print(
        f"Command: `python benchmarks/bench_reliability.py --model {args.model} --repeat "
        f"{args.repeat}`\n"
    )
    print("| step (per generate_artifacts call) | s | share of the call |")
    print("|---|---:|---:|")
    for name, seconds in per_call.items():
        print(f"| {name} | {seconds:.4f} | {100 * seconds / total:.2f} % |")
    added = sum(per_call.values())
    print(f"| **all of the above** | **{added:.4f}** | **{100 * added / total:.2f} %** |")
    print(f"| generate_artifacts (median) | {total:.2f} | 100 % |")
    print(f"\nThe set written: {set_bytes / 1e6:.0f} MB (the commit moves files, it copies none).")


if __name__ == "__main__":
    main()

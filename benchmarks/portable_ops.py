"""List the ops of every training model the test families generate (what a portable lowering must
cover).

Generates artifacts for every case of the exporter sweep and the model families
(``tests/support/sweep.py``, ``tests/support/models.py``) (plus every built-in loss on the MLP, with
SGD)
and prints, per ``(domain, op)``, how many training models use it and
whether it is portable as it is, lowered by :mod:`onnxblocks.portable`, or rewritten by the
contract (optimizers, accumulation).

    python benchmarks/portable_ops.py            # the op table
    python benchmarks/portable_ops.py --check    # also make every case portable and load it
    python benchmarks/portable_ops.py --json ops.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _cases():
    from support import models, sweep

    from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

    for name, exporter in models.FAMILY_CASES:
        case = models.case(name, exporter)

        def build(directory, case=case):
            return generate_artifacts(
                case.onnx_model,
                requires_grad=case.params,
                loss=LossType[models.LOSS_TYPES[case.loss]],
                optimizer=OptimType.AdamW,
                artifact_directory=directory,
            )

        yield f"families/{name}-{exporter}", build
    for kind in sorted(models.LOSS_TYPES):
        case = models.case("mlp", "torchscript")

        def build_loss(directory, case=case, kind=kind):
            return generate_artifacts(
                case.onnx_model,
                requires_grad=case.params,
                loss=LossType[models.LOSS_TYPES[kind]],
                optimizer=OptimType.SGD,
                artifact_directory=directory,
            )

        yield f"loss/{kind}", build_loss
    for name, exporter in sweep.CASES:

        def build_sweep(directory, name=name, exporter=exporter):
            return sweep.build(name, exporter, directory)[2]

        yield f"sweep/{name}-{exporter}", build_sweep
    yield (
        "sweep/onnxscript",
        lambda directory: generate_artifacts(
            sweep.onnxscript_model(),
            requires_grad=["w", "b", "s", "beta"],
            loss=LossType.MSELoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory,
        ),
    )


def collect(check: bool = False) -> tuple[dict[tuple[str, str], list[str]], dict[str, str]]:
    """``(domain, op) -> [case, ...]`` over the training and optimizer models of every case.

    With ``check``, also make each case portable (``make_portable``) and load the
    results in an ``InferenceSession``: the second mapping is case -> error for those that failed.
    """
    from onnxblocks._core.ort import onnxruntime
    from onnxblocks.portable import make_portable

    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    failures: dict[str, str] = {}
    for label, build in _cases():
        with tempfile.TemporaryDirectory() as directory:
            artifacts = build(directory)
            loaded = {}
            for path in (artifacts.training_model, artifacts.optimizer_model):
                if path is None:
                    continue
                model = onnx.load(path, load_external_data=False)
                loaded[path] = onnx.load(path)
                for key in sorted({(n.domain or "ai.onnx", n.op_type) for n in model.graph.node}):
                    found[key].append(label)
            if check:
                try:
                    made = make_portable(
                        loaded[artifacts.training_model], loaded.get(artifacts.optimizer_model)
                    )
                    for m in (made.training, made.optimizer, made.step):
                        if m is not None:
                            onnxruntime().InferenceSession(
                                m.SerializeToString(), providers=["CPUExecutionProvider"]
                            )
                except Exception as exc:  # reported below, case by case
                    failures[label] = f"{type(exc).__name__}: {exc}"
        print(f"  {label}", file=sys.stderr)
    return found, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the table as JSON here")
    parser.add_argument(
        "--check", action="store_true", help="also make every case portable and load it"
    )
    args = parser.parse_args()
    from onnxblocks.portable import LOWERINGS, is_portable_op

    found, failures = collect(args.check)
    print(f"{'domain':<14} {'op':<40} {'models':>6}  portable")
    for (domain, op), labels in sorted(
        found.items(), key=lambda kv: (is_portable_op(*kv[0][::-1]), kv[0])
    ):
        portable = (
            "yes"
            if is_portable_op(op, domain)
            else "lowered"
            if op in LOWERINGS
            else "contract"
            if op
            in (
                "AdamWOptimizer",
                "SGDOptimizerV2",
                "InPlaceAccumulatorV2",
                "InplaceClipGradNorm",
            )
            else "NO"
        )
        print(f"{domain:<14} {op:<40} {len(labels):>6}  {portable}")
    cases = len({label for labels in found.values() for label in labels})
    if args.check:
        print(f"make_portable: {cases - len(failures)} of {cases} cases portable")
        for label, error in failures.items():
            print(f"  FAILED {label}: {error}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({f"{d}:{o}": v for (d, o), v in sorted(found.items())}, indent=1)
        )


if __name__ == "__main__":
    main()

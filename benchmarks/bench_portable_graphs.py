"""Graph-side cost of portable artifacts: the same onnxruntime runs the training build's step and
the fused step model.

``bench_portable.py`` compares the two backends (onnxruntime-training 1.19.2 against
stock onnxruntime under Python 3.13). This script isolates what the lowering costs:
on **one** onnxruntime (the training build, which runs standard ops too) it times

* ``training build``: ``Module.train_step`` + ``Optimizer.optimizer_step`` +
  ``lazy_reset_grad`` on the non-portable artifacts (C bindings, no Python wrapper);
* ``fused step``: the portable ``step_model.onnx`` on an ``InferenceSession``, two
  IOBindings bound once (parameters and moments ping-pong between two sets of OrtValues);

for the models of ``bench_portable.py`` (MLP 784-512-512-10, CNN, small GPT), each
the median of per-round means (wall and process CPU time), the two loops alternating round by round.

    python benchmarks/bench_portable_graphs.py [--models mlp,cnn,gpt] [--steps 30] [--rounds 7]
    taskset -c 0 python benchmarks/bench_portable_graphs.py   # one core: CPU time is the work,
    whatever else runs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def training_build_step(directory: Path, batch: list[np.ndarray]):
    from onnxblocks._core.ort import capi

    C = capi()
    state = C.load_checkpoint(str(directory / "checkpoint"))
    device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    module = C.Module(
        str(directory / "training_model.onnx"),
        state,
        str(directory / "eval_model.onnx"),
        device,
        C.SessionOptions(),
    )
    optimizer = C.Optimizer(
        str(directory / "optimizer_model.onnx"), state, device, C.SessionOptions()
    )
    optimizer.set_learning_rate(1e-3)
    fetches = C.OrtValueVector()

    def step(
        state=state,
    ) -> None:  # the Module points into the state: keep it alive (freed, the run fails at random)
        module.train_step(batch, fetches)
        optimizer.optimizer_step()
        module.lazy_reset_grad()

    return step


def fused_step(directory: Path, batch: list[np.ndarray]):
    from onnxblocks._core.contracts import LEARNING_RATE, STEP, moment_names, updated_name
    from onnxblocks._core.ort import capi, onnxruntime
    from onnxblocks.checkpoint import load_checkpoint

    C, ort = capi(), onnxruntime()
    session = ort.InferenceSession(
        str(directory / "step_model.onnx"), providers=["CPUExecutionProvider"]
    )
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    checkpoint = load_checkpoint(directory / "checkpoint")
    keep: list = []  # the arrays and OrtValues the bindings point to must outlive them

    def value(array: np.ndarray):
        ort_value = C.OrtValue.ortvalue_from_numpy(array, cpu)
        keep.extend([array, ort_value])
        return ort_value

    pairs = {}
    for param, data in checkpoint.trainable.items():
        for name, start in (
            (param, np.array(data)),
            *((m, np.zeros_like(data)) for m in moment_names(param)),
        ):
            pairs[name] = (value(start), value(np.empty_like(start)))
    lr, step_no = np.array([1e-3], np.float32), np.zeros(1, np.int64)
    names = [i.name for i in session.get_inputs()]
    user = [
        n
        for n in names
        if n not in pairs and n not in (LEARNING_RATE, STEP) and n not in checkpoint.frozen
    ]
    loss = session.get_outputs()[0].name
    bindings = []
    for parity in (0, 1):
        binding = C.SessionIOBinding(session._sess)
        binding.bind_ortvalue_input(LEARNING_RATE, value(lr))
        binding.bind_ortvalue_input(STEP, value(step_no))
        for name, array in zip(user, batch, strict=True):
            binding.bind_ortvalue_input(name, value(array))
        for name, frozen in checkpoint.frozen.items():
            if name in names:
                binding.bind_ortvalue_input(name, value(np.array(frozen)))
        for name, pair in pairs.items():
            binding.bind_ortvalue_input(name, pair[parity])
            binding.bind_ortvalue_output(updated_name(name), pair[1 - parity])
        binding.bind_output(loss, cpu)
        bindings.append(binding)
    run, options, state = (
        session._sess.run_with_iobinding,
        C.RunOptions(),
        {"parity": 0, "keep": keep},
    )

    def step() -> None:
        step_no[0] += 1
        run(bindings[state["parity"]], options)
        state["parity"] ^= 1

    step.session = session  # type: ignore[attr-defined]  # alive as long as the loop
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    import bench_portable

    from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

    for name, (model, params, batch) in bench_portable.build_models(args.models.split(",")).items():
        with tempfile.TemporaryDirectory() as tmp:
            common = {
                "requires_grad": params,
                "loss": LossType.CrossEntropyLoss,
                "optimizer": OptimType.AdamW,
            }
            generate_artifacts(model, artifact_directory=Path(tmp) / "t", **common)
            generate_artifacts(model, artifact_directory=Path(tmp) / "p", portable=True, **common)
            loops = {
                "training build": training_build_step(Path(tmp) / "t", batch),
                "fused step": fused_step(Path(tmp) / "p", batch),
            }
            for step in loops.values():
                for _ in range(args.warmup):
                    step()
            means: dict[str, list[float]] = {k: [] for k in loops}
            cpu: dict[str, list[float]] = {k: [] for k in loops}
            for _ in range(args.rounds):
                for label, step in loops.items():
                    start, start_cpu = time.perf_counter(), time.process_time()
                    for _ in range(args.steps):
                        step()
                    means[label].append((time.perf_counter() - start) / args.steps)
                    cpu[label].append((time.process_time() - start_cpu) / args.steps)
            base, base_cpu = (
                statistics.median(means["training build"]),
                statistics.median(cpu["training build"]),
            )
            for label, values in means.items():
                median, median_cpu = statistics.median(values), statistics.median(cpu[label])
                print(
                    f"{name:<5} {label:<15} wall {median * 1e6:9.1f} us/step "
                    f"({median / base:4.2f}x)   "
                    f"cpu {median_cpu * 1e6:9.1f} us/step ({median_cpu / base_cpu:4.2f}x)"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

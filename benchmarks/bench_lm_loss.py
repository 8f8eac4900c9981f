"""Peak memory of a training step's language-model loss, plain and chunked (docs/lora.md).

    python benchmarks/bench_lm_loss.py                 # every configuration
    python benchmarks/bench_lm_loss.py --only plain head-64

The model is SmolLM2-135M's LM head alone: hidden states ``[4, 128, 576]`` go through one
trained ``576 x 576`` layer, then the frozen head ``[49152, 576]`` (113 MiB), then cross
entropy over the 512 tokens (a quarter of them labelled -100, ignored). Configurations:

* ``plain``: ``CrossEntropyLoss(class_axis=-1, ignore_index=-100)`` on the logits;
* ``logits-<N>``: the same with ``chunk_size=N`` (chunks of the logits);
* ``head-<N>``: ``chunk_size=N, head_weight=...``: the head inside the chunks, ignored
  tokens dropped before it.

Each configuration generates its artifacts in one subprocess and trains 3 steps in another
(training build and portable artifacts); the step child reports its peak RSS (``VmHWM``)
and the median step time. ``[B, T, V]`` float32 is 96 MiB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH, SEQ, HIDDEN, VOCAB = 4, 128, 576, 49152
CONFIGS = ["plain", "logits-64", "head-64", "head-128"]


def peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def model_file(directory: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    layer = (rng.standard_normal((HIDDEN, HIDDEN)) / HIDDEN**0.5).astype(np.float32)
    head = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "layer.weight"], ["h"]),
            helper.make_node("Transpose", ["lm_head.weight"], ["head_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["h", "head_t"], ["logits"]),
        ],
        "lm_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
        [
            numpy_helper.from_array(layer, "layer.weight"),
            numpy_helper.from_array(head, "lm_head.weight"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = directory / "head.onnx"
    onnx.save(model, path, save_as_external_data=True, location="head.onnx.data")
    return path


def generate(config: str, model: Path, out: Path, portable: bool) -> dict:
    from onnxblocks import generate_artifacts, losses
    from onnxblocks.artifacts import OptimType

    options: dict = {"class_axis": -1, "ignore_index": -100}
    if config != "plain":
        kind, size = config.split("-")
        options["chunk_size"] = int(size)
        if kind == "head":
            options["head_weight"] = "lm_head.weight"
    start = time.perf_counter()
    generate_artifacts(
        str(model),
        requires_grad=["layer.weight"],
        loss=losses.CrossEntropyLoss(**options),
        optimizer=OptimType.AdamW,
        artifact_directory=out,
        portable=portable,
    )
    return {"generate_s": time.perf_counter() - start, "generate_peak_mib": peak_mib()}


def step(artifacts: Path, steps: int) -> dict:
    import numpy as np

    from onnxblocks.runtime import TrainingSession

    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
    labels = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
    labels[:, : SEQ // 4] = -100  # a prompt: not counted
    session = TrainingSession(artifacts)
    times, loss = [], None
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = session.train_and_update(x, labels)[0]
        times.append(time.perf_counter() - start)
    return {
        "step_s": statistics.median(times[1:]),
        "peak_mib": peak_mib(),
        "loss": float(np.asarray(loss)),
    }


def child(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=CONFIGS)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        what, *rest = args.child
        if what == "generate":
            result = generate(rest[0], Path(rest[1]), Path(rest[2]), rest[3] == "1")
        else:
            result = step(Path(rest[0]), int(rest[1]))
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = model_file(root)
        print(
            f"head {VOCAB}x{HIDDEN} fp32: {VOCAB * HIDDEN * 4 / 2**20:.0f} MiB; "
            f"[B, T, V] fp32: {BATCH * SEQ * VOCAB * 4 / 2**20:.0f} MiB"
        )
        print("| loss | backend | step s | peak RSS MiB | loss value |")
        print("|---|---|---|---|---|")
        for config in args.only:
            for portable in (False, True):
                out = root / f"{config}-{int(portable)}"
                made = child(["generate", config, str(model), str(out), str(int(portable))])
                ran = made if "error" in made else child(["step", str(out), str(args.steps)])
                backend = "portable" if portable else "training build"
                if "error" in ran:
                    print(f"| {config} | {backend} | failed: {ran['error']} | | |")
                    continue
                print(
                    f"| {config} | {backend} | {ran['step_s']:.3f} | {ran['peak_mib']:.0f} | "
                    f"{ran['loss']:.6f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

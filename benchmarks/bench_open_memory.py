"""Where an open training session's bytes go, piece by piece (docs/lora.md, "Where the open
session's bytes go").

    python benchmarks/bench_lora.py --only training-int4-rc --lean-loss 64 --keep KEPT
    python benchmarks/bench_open_memory.py KEPT/training-int4-rc
    python benchmarks/bench_open_memory.py --shape 360m KEPT360/training-int4-rc

The artifacts are ``benchmarks/bench_lora.py``'s, kept with ``--keep`` (there: LoRA r=8 on q/v,
AdamW; with ``--lean-loss 64`` the lean loss with the tied head inside it; ``-rc``:
``recompute="layers"``; training build); ``--shape`` names the shape they were made for (the
batch the steps take). Each measurement runs in a fresh process and reads ``VmRSS`` after each
piece; the step peak is ``VmHWM`` (neither depends on the machine's load):

* ``pieces``: Python; + NumPy and onnx; + onnxruntime-training's library through onnxblocks' door;
  + an empty ``InferenceSession`` (the process floor); + the checkpoint state; + the training
  graph's ``Module`` without an eval model; + the eval graph's session;
* ``session``: the floor, then ``TrainingSession(directory)``, RSS once open, ``--steps`` training
  steps (peak), then one eval step (RSS after it); ``--trim`` calls glibc's ``malloc_trim(0)``
  after opening.

``--code DIR`` runs the children on the onnxblocks package found in ``DIR`` (another checkout, for
a before/after comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def floor_session() -> object:
    """An empty ``InferenceSession`` (one ``Identity``): what any ONNX Runtime process holds."""
    import numpy as np
    from onnx import TensorProto, helper

    from onnxblocks._core.ort import onnxruntime

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "floor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime 1.19 loads
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    session.run(None, {"x": np.zeros(1, np.float32)})
    return session


def child_pieces(directory: Path) -> dict:
    rows = {"python": status("VmRSS")}
    import numpy  # noqa: F401
    import onnx  # noqa: F401

    rows["numpy, onnx"] = status("VmRSS")
    from onnxblocks._core.ort import capi

    C = capi()
    rows["onnxruntime (onnxblocks' door)"] = status("VmRSS")
    keep = [floor_session()]
    rows["empty InferenceSession (floor)"] = status("VmRSS")
    from onnxblocks.runtime import _ort

    state = C.load_checkpoint(os.fspath(directory / "checkpoint"))
    rows["checkpoint state"] = status("VmRSS")
    options = _ort.session_options(runs=True, frozen_base=True)
    device = _ort.make_device("cpu")
    module = C.Module(os.fspath(directory / "training_model.onnx"), state, None, device, options)
    rows["training graph's Module (no eval model)"] = status("VmRSS")
    ort = _ort.onnxruntime()
    evaluation = ort.InferenceSession(
        os.fspath(directory / "eval_model.onnx"),
        sess_options=options,
        providers=["CPUExecutionProvider"],
    )
    rows["eval graph's session"] = status("VmRSS")
    keep += [state, module, evaluation]
    return rows


def child_session(directory: Path, steps: int, trim: bool) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_lora
    import numpy as np

    keep = floor_session()
    rows = {"floor": status("VmRSS")}
    from onnxblocks.runtime import TrainingSession

    session = TrainingSession(directory)
    rows["open"] = status("VmRSS")
    if trim:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        rows["open, malloc_trim(0)"] = status("VmRSS")
    session.learning_rate = bench_lora.LR
    x, y = bench_lora.batch()
    losses = [float(np.asarray(session.train_and_update(x, y)[0])) for _ in range(steps)]
    rows["step peak (VmHWM)"] = status("VmHWM")
    rows["after the steps"] = status("VmRSS")
    rows["  of which file pages (RssFile: the mapped base)"] = status("RssFile")
    losses.append(float(np.asarray(session.eval_step(x, y)[0])))
    rows["after an eval step"] = status("VmRSS")
    rows["  of which file pages (RssFile)"] = status("RssFile")
    rows["peak with the eval step (VmHWM)"] = status("VmHWM")
    del keep
    return {"rss": rows, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("directory", type=Path, help="training-build artifacts")
    parser.add_argument("--shape", choices=["135m", "360m"], default="135m")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--code", type=Path, help="import onnxblocks from this directory")
    parser.add_argument("--only", choices=["pieces", "session"])
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        kind, directory = args.child[0], args.directory
        sys.path.insert(0, str(args.code or ROOT))
        if args.shape != "135m":
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import bench_lora

            bench_lora.select_shape(args.shape)
        result = (
            child_pieces(directory)
            if kind == "pieces"
            else child_session(directory, args.steps, args.trim)
        )
        print(json.dumps(result))
        return
    directory = args.directory
    code = str(args.code or ROOT)
    env = {**os.environ, "PYTHONPATH": code}
    for kind in [args.only] if args.only else ["pieces", "session"]:
        extra = ["--trim"] if args.trim else []
        command = [sys.executable, __file__, "--shape", args.shape, "--steps", str(args.steps)]
        out = subprocess.run(
            [*command, *extra, "--code", code, str(directory), "--child", kind],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            cwd=ROOT,
        )
        if out.returncode != 0:
            print(kind, "failed:", out.stderr.strip().splitlines()[-3:])
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        rows = result.get("rss", result)
        print(f"{kind} ({directory}, code {code}):")
        for name, mib in rows.items():
            print(f"  {name:<45} {mib:8.0f} MiB")
        if "losses" in result:
            print("  losses (steps, then eval):", ", ".join(f"{v:.6f}" for v in result["losses"]))


if __name__ == "__main__":
    main()

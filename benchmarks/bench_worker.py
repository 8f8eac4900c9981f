"""Run ONE benchmark case in this process and print its measurements as JSON.

bench_artifacts.py starts this script once per case, so every case gets a fresh
process and its own peak RSS (``VmHWM``). The last line on stdout is a JSON
object; everything else goes to stderr.

Measured:
    * ``wall_s``: the ``generate_artifacts`` call (or the import, for the import
      case), after the tool's modules are imported and the model is loaded.
    * ``peak_rss_gb``: the process's RSS high-water mark over its whole life
      (imports, the caller's ``onnx.load`` and the call).
    * ``call_peak_rss_gb``: the RSS high-water mark during the call alone (the
      kernel's mark is reset just before it), which includes the caller's model.
    * ``base_rss_gb``: RSS just before the call (imports + the caller's model).
    * ``cpu_s``: CPU time of the process during the call (all threads).

Optional diagnostics: ``--profile FILE`` (cProfile of the call) and
``--rss-trace`` (samples RSS every 5 ms and reports the Python stack of the main
thread at the moment RSS peaked).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

GB = 1024**3


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes() -> int:
    """Current resident set size."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (since the last :func:`reset_peak_rss`)."""
    return _status_kb("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0); False if
    unsupported.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class RssSampler(threading.Thread):
    """Samples RSS and remembers the main thread's stack at the highest sample."""

    def __init__(self, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.main_id = threading.main_thread().ident
        self.stop_event = threading.Event()
        self.samples: list[tuple[float, int]] = []
        self.peak = 0
        self.peak_stack: list[str] = []
        self.start_time = time.perf_counter()

    def run(self) -> None:
        statm = open("/proc/self/statm")
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stop_event.is_set():
            statm.seek(0)
            rss = int(statm.read().split()[1]) * page
            self.samples.append((time.perf_counter() - self.start_time, rss))
            if rss > self.peak:
                self.peak = rss
                frame = sys._current_frames().get(self.main_id)
                self.peak_stack = (
                    [
                        f"{Path(f.filename).name}:{f.lineno} {f.name}"
                        for f in traceback.extract_stack(frame)[-12:]
                    ]
                    if frame
                    else []
                )
            time.sleep(self.interval)
        statm.close()

    def stop(self) -> dict:
        self.stop_event.set()
        self.join()
        step = max(1, len(self.samples) // 60)
        return {
            "peak_gb": self.peak / GB,
            "peak_stack": self.peak_stack,
            "trace": [(round(t, 3), round(r / GB, 3)) for t, r in self.samples[::step]],
        }


def chain_loss(block_module, n_blocks: int):
    """A custom loss Block made of ``n_blocks`` sub-blocks: n-1 elementwise ops then ReduceMean.

    ``block_module`` is ``onnxblocks.blocks`` or the reference's
    ``onnxruntime.training.onnxblock.blocks``; both spell these blocks the same way.
    """
    base_cls = block_module.Block

    class ChainLoss(base_cls):
        def __init__(self) -> None:
            super().__init__()
            self.parts = [
                (block_module.Sigmoid() if i % 2 == 0 else block_module.Neg())
                for i in range(n_blocks - 1)
            ]
            self.parts.append(block_module.ReduceMean(keepdims=False))

        def build(self, logits):
            x = logits
            for part in self.parts:
                x = part(x)
            return x

    return ChainLoss()


def run_import_case(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    import onnxblocks  # noqa: F401

    wall = time.perf_counter() - start
    heavy = [m for m in ("onnxruntime", "onnxscript", "torch") if m in sys.modules]
    return {
        "wall_s": wall,
        "note": f"imported heavy modules: {heavy}" if heavy else "no onnxruntime/onnxscript/torch",
    }


def _run_loss_pair(args, tool, blocks_mod, model, extra, import_s, load_s) -> dict:
    """A/B in one process: the same call with two custom losses, alternated, after one warm-up call.

    ``--loss pair:chainA,chainB``. Alternating in one process cancels most of the
    machine's noise that separate processes would add. ``wall_s`` is B's median,
    ``delta_s`` the median of the paired differences B - A.
    """
    import shutil
    import statistics

    names = args.loss[len("pair:") :].split(",")
    params = json.loads(Path(args.params).read_text())
    params = params["model"]["params"] if isinstance(params, dict) else params
    out_root = Path(args.out_dir)
    walls: dict[str, list[float]] = {n: [] for n in names}

    def once(name: str) -> float:
        out = out_root / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        loss = chain_loss(blocks_mod, int(name[len("chain") :]))
        start = time.perf_counter()
        tool.generate_artifacts(
            model,
            requires_grad=params,
            loss=loss,
            optimizer=tool.OptimType.AdamW,
            artifact_directory=str(out),
            **extra,
        )
        wall = time.perf_counter() - start
        shutil.rmtree(out, ignore_errors=True)
        return wall

    warmup = once(names[0])
    for _ in range(args.pair_repeat):
        for name in names:
            walls[name].append(once(name))
    a, b = names
    deltas = [wb - wa for wa, wb in zip(walls[a], walls[b], strict=True)]
    return {
        "wall_s": statistics.median(walls[b]),
        "import_s": import_s,
        "load_s": load_s,
        "warmup_s": warmup,
        "pair": walls,
        "delta_s": statistics.median(deltas),
        "note": (
            f"{b} - {a}: {statistics.median(deltas):+.3f} s (median of {len(deltas)} alternated "
            "pairs in one "
            f"process; {a} {statistics.median(walls[a]):.2f} s, {b} "
            f"{statistics.median(walls[b]):.2f} s)"
        ),
    }


def run_generate_case(args: argparse.Namespace) -> dict:
    import onnx

    t0 = time.perf_counter()
    if args.tool == "reference":
        import onnxruntime.training.artifacts as tool
        from onnxruntime.training import onnxblock as block_api

        blocks_mod = block_api.blocks
    else:
        if args.warm_ort:
            import onnxruntime.capi._pybind_state  # noqa: F401
        import onnxblocks.artifacts as tool
        import onnxblocks.blocks as blocks_mod
    import_s = time.perf_counter() - t0

    # What the caller hands over.
    t0 = time.perf_counter()
    extra: dict = {}
    if args.input == "path":
        model = args.model
    else:
        model = onnx.load(args.model, load_external_data=(args.input == "proto"))
        if args.input == "proto-noext" and args.tool != "reference":
            extra["model_path"] = args.model
    load_s = time.perf_counter() - t0
    if not isinstance(model, str):
        before = model.SerializeToString() if args.check_unmutated else None
    if args.loss.startswith("pair:"):
        return _run_loss_pair(args, tool, blocks_mod, model, extra, import_s, load_s)
    if args.loss == "ce":
        loss = tool.LossType.CrossEntropyLoss
    elif args.loss == "mse":
        loss = tool.LossType.MSELoss
    elif args.loss.startswith("chain"):
        loss = chain_loss(blocks_mod, int(args.loss[len("chain") :]))
    else:
        raise SystemExit(f"unknown loss {args.loss}")

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = json.loads(Path(args.params).read_text()) if args.params else None
    if isinstance(params, dict):  # a bench_models meta.json
        params = params["model"]["params"]
    ort_before, torch_before = "onnxruntime" in sys.modules, "torch" in sys.modules
    base_rss = rss_bytes()
    process_peak = peak_rss_bytes()
    can_reset = reset_peak_rss()
    sampler = RssSampler() if args.rss_trace else None
    if sampler:
        sampler.start()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    cpu_start = time.process_time()
    tool.generate_artifacts(
        model,
        requires_grad=params,
        loss=loss,
        optimizer=tool.OptimType.AdamW,
        artifact_directory=str(out_dir),
        **extra,
    )
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    call_peak = peak_rss_bytes()
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    result: dict = {
        "wall_s": wall,
        "cpu_s": cpu,
        "import_s": import_s,
        "load_s": load_s,
        "base_rss_gb": base_rss / GB,
        "process_peak_before_call_gb": process_peak / GB,
    }
    if can_reset:
        result["call_peak_rss_gb"] = call_peak / GB
    notes = []
    if not ort_before and "onnxruntime" in sys.modules:
        notes.append(
            "the call imported onnxruntime"
            + (" and torch" if not torch_before and "torch" in sys.modules else "")
        )
    if notes:
        result["note"] = "; ".join(notes)
    if sampler:
        result["rss"] = sampler.stop()
    if not isinstance(model, str) and args.check_unmutated:
        result["caller_model_unchanged"] = model.SerializeToString() == before
    result["artifacts"] = {
        p.name: p.stat().st_size if p.is_file() else sum(q.stat().st_size for q in p.rglob("*"))
        for p in sorted(out_dir.iterdir())
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=["generate", "import"], default="generate")
    parser.add_argument("--tool", choices=["onnxblocks", "reference"], default="onnxblocks")
    parser.add_argument("--model", help="path of the .onnx file")
    parser.add_argument("--params", help="JSON file with the list of trainable parameter names")
    parser.add_argument("--input", choices=["path", "proto", "proto-noext"], default="path")
    parser.add_argument(
        "--loss",
        default="ce",
        help="ce, mse, chainN (custom Block of N blocks), or pair:chainA,chainB (A/B in one "
        "process)",
    )
    parser.add_argument("--out-dir", help="artifact directory")
    parser.add_argument(
        "--pair-repeat", type=int, default=3, help="alternations for --loss pair:A,B"
    )
    parser.add_argument("--profile", help="write a cProfile of the call to this file")
    parser.add_argument("--rss-trace", action="store_true")
    parser.add_argument("--check-unmutated", action="store_true")
    parser.add_argument(
        "--warm-ort", action="store_true", help="import onnxruntime before timing (onnxblocks)"
    )
    args = parser.parse_args()
    try:
        result = run_import_case(args) if args.case == "import" else run_generate_case(args)
        result["ok"] = True
    except BaseException as exc:
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    result["peak_rss_gb"] = (
        max(peak_rss_bytes(), int(result.get("process_peak_before_call_gb", 0) * GB)) / GB
    )
    result["torch_imported"] = "torch" in sys.modules
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

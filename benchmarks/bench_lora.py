"""LoRA on a SmolLM2-135M-shaped LLaMA: artifacts, step time and peak memory, side by side
(docs/lora.md).

    python benchmarks/bench_lora.py                  # everything
    python benchmarks/bench_lora.py --layers 4       # a shallow copy of the shape, to try the
    script
    python benchmarks/bench_lora.py --only torch-peft portable-fp16
    python benchmarks/bench_lora.py --shape 360m --only training-int4-rc --lean-loss 64

The model is ``transformers.LlamaForCausalLM`` with SmolLM2-135M's shape (hidden 576,
30 layers, 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings), batch
4 x 128, or with ``--shape 360m`` SmolLM2-360M's (hidden 960, 32 layers, 15 heads, 5 KV heads,
intermediate 2560, the same vocabulary, tied), batch 1 x 256; random weights (seed 0, no
download), exported once by torch's TorchScript exporter without its weights (batch and sequence
dynamic), the weights then written one at a time to ``model.onnx.data``, in
``~/.cache/onnxblocks-bench/smollm2-<shape>-L<layers>-v1``. LoRA r=8, alpha=16 on ``q_proj`` and
``v_proj``; AdamW; cross entropy over the batch's tokens.

Every configuration runs in its own subprocess, so each peak RSS (``VmHWM``) is its own:

* ``generate-*``: ``generate_artifacts(..., lora=...)``: seconds and peak RSS;
* ``training-*`` (onnxruntime-training's training API), ``portable-*`` (this venv's onnxruntime,
  portable artifacts, fused step), ``stock-*`` (stock onnxruntime in the Python 3.13 environment
  of ``tests/support/portable_env.py``, when it exists), ``torch-peft`` (transformers + peft,
  eager, ``torch.optim.AdamW``): seconds to open, RSS once open, median seconds per step
  (after one warm-up step) and peak RSS; ``-fp32`` / ``-fp16`` is the frozen base's storage
  (``generate_artifacts(base_dtype="float16")``), ``-int8`` / ``-int4`` the quantized base
  (``base_dtype="int8"``/``"int4"``, blocks of 32); ``node-fp32``: the JavaScript client's
  ``onnxruntime-node`` (``js/bin/onnxblocks-train.mjs``, all cores; npm-installed once by
  ``tests/support/web_support.py``), the same portable artifacts; ``browser-fp32``: the LoRA page
  (``js/demo/lora.html``, onnxruntime-web WASM, one thread) in headless Chromium, on portable
  artifacts of
  its own (with ``logits``), step time from the wall times of two visits (its peak RSS is not
  measured);
* ``*-rc``: the same artifacts with ``recompute="layers"`` (each layer's forward recomputed in the
  backward, docs/training.md); ``torch-peft-gc``: torch + PEFT with
  ``model.gradient_checkpointing_enable()``;
* ``--lean-loss N``: every configuration with ``CrossEntropyLoss(chunk_size=N, head_weight=...)``
  (the tied head inside the loss, docs/lora.md);
* the sizes of ``base_weights.bin``, the checkpoint and the web state file (``params.safetensors``).

The frozen base's size (fp32) is printed first: the peaks are compared with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "onnxblocks-bench"
#: ``--shape``: name -> (LLaMA config, batch, sequence length).
SHAPES = {
    "135m": (
        {
            "hidden_size": 576,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "intermediate_size": 1536,
            "vocab_size": 49152,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
        },
        4,
        128,
    ),
    "360m": (
        {
            "hidden_size": 960,
            "num_hidden_layers": 32,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "intermediate_size": 2560,
            "vocab_size": 49152,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
        },
        1,
        256,
    ),
}
SHAPE_NAME = "135m"
SHAPE, BATCH, SEQ = SHAPES[SHAPE_NAME]
R, ALPHA, TARGETS, LR = 8, 16, ["q_proj", "v_proj"], 1e-3
#: The tied LM head's weight in the export (``--lean-loss``).
HEAD = "model.model.embed_tokens.weight"
#: Step configurations: name -> (kind, portable, base dtype); ``-rc`` rows: ``recompute="layers"``
#: (``torch-peft-gc``: ``model.gradient_checkpointing_enable()``).
STEPS = {
    "training-fp32": ("session", False, None),
    "training-fp16": ("session", False, "float16"),
    "portable-fp32": ("session", True, None),
    "portable-fp16": ("session", True, "float16"),
    "training-int8": ("session", False, "int8"),
    "training-int4": ("session", False, "int4"),
    "portable-int8": ("session", True, "int8"),
    "portable-int4": ("session", True, "int4"),
    "stock-fp32": ("stock", True, None),
    "stock-fp16": ("stock", True, "float16"),
    "node-fp32": ("node", True, None),
    "browser-fp32": ("browser", True, None),
    "torch-peft": ("torch", False, None),
    "training-fp32-rc": ("session", False, None),
    "portable-fp32-rc": ("session", True, None),
    "training-int8-rc": ("session", False, "int8"),
    "training-int4-rc": ("session", False, "int4"),
    "portable-int4-rc": ("session", True, "int4"),
    "torch-peft-gc": ("torch", False, None),
}


def select_shape(name: str) -> None:
    """Make ``name``'s shape, batch and sequence length the ones every function here uses."""
    global SHAPE_NAME, SHAPE, BATCH, SEQ
    SHAPE_NAME = name
    SHAPE, BATCH, SEQ = SHAPES[name]


def peak_mib() -> float:
    """This process's peak RSS (``VmHWM``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------ children (one configuration
# each)
def torch_model(layers: int):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**SHAPE, "num_hidden_layers": layers}, use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation("eager")
    return model


def logits_module(model):
    """``input_ids -> logits`` with an all-ones attention mask (what the export traces)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits

    return Logits()


def batch() -> tuple:
    import numpy as np

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, SHAPE["vocab_size"], (BATCH, SEQ + 1)).astype(np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def child_export(layers: int, target: Path) -> dict:
    """The TorchScript export without its weights, then each weight written to ``model.onnx.data``
    one tensor at a time: the process never holds a second copy of the weights (the 360M shape's
    are 1.4 GiB)."""
    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto, numpy_helper

    module = logits_module(torch_model(layers)).train()
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    start = time.perf_counter()
    torch.onnx.export(
        module,
        (torch.from_numpy(batch()[0]),),
        tmp / "raw.onnx",
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
        dynamo=False,
        do_constant_folding=False,
        export_params=False,
        opset_version=17,
        training=torch.onnx.TrainingMode.TRAINING,
    )
    proto = onnx.load(tmp / "raw.onnx")
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    inputs = [i for i in proto.graph.input if i.name not in tensors]
    with open(tmp / "model.onnx.data", "wb") as data:
        for value in proto.graph.input:
            if value.name not in tensors:
                continue
            array = np.ascontiguousarray(tensors[value.name].detach().numpy())
            if array.nbytes < 1024:
                proto.graph.initializer.append(numpy_helper.from_array(array, value.name))
                continue
            data.seek(-data.tell() % 4096, os.SEEK_CUR)  # page-aligned: mapped, not read
            init = numpy_helper.from_array(np.zeros(0, array.dtype), value.name)
            init.dims[:] = array.shape
            init.ClearField("raw_data")
            init.data_location = TensorProto.EXTERNAL
            for key, val in (
                ("location", "model.onnx.data"),
                ("offset", str(data.tell())),
                ("length", str(array.nbytes)),
            ):
                init.external_data.add(key=key, value=val)
            data.write(array.tobytes())
            proto.graph.initializer.append(init)
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    if [i.name for i in inputs] != ["input_ids"]:
        raise RuntimeError(f"inputs left that are not weights: {[i.name for i in inputs]}")
    onnx.save(proto, tmp / "model.onnx")
    (tmp / "raw.onnx").unlink()
    for leftover in tmp.iterdir():
        if leftover.name not in ("model.onnx", "model.onnx.data"):
            leftover.unlink()
    os.rename(tmp, target)
    return {"export_s": time.perf_counter() - start, "peak_mib": peak_mib()}


def child_generate(
    model: Path,
    directory: Path,
    portable: bool,
    base_dtype: str | None,
    chunk: int = 0,
    recompute: str = "none",
) -> dict:
    import onnxblocks
    from onnxblocks import losses
    from onnxblocks.peft import LoraConfig

    lean = {"chunk_size": chunk, "head_weight": HEAD} if chunk else {}
    start = time.perf_counter()
    art = onnxblocks.generate_artifacts(
        model,
        loss=losses.CrossEntropyLoss(class_axis=-1, **lean),
        optimizer=onnxblocks.OptimType.AdamW,
        artifact_directory=directory,
        lora=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS),
        portable=portable,
        base_dtype=base_dtype,
        recompute=recompute,
    )
    seconds = time.perf_counter() - start
    linked = art.base_weights is not None and art.base_weights.stat().st_nlink > 1
    return {
        "generate_s": seconds,
        "peak_mib": peak_mib(),
        "trainable": len(art.requires_grad),
        "linked": linked,
    }


def child_session(directory: Path, steps: int) -> dict:
    import numpy as np

    from onnxblocks.runtime import TrainingSession

    start = time.perf_counter()
    session = TrainingSession(directory)
    opened, open_s = rss_mib(), time.perf_counter() - start
    session.learning_rate = LR
    x, y = batch()
    times, losses = [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        losses.append(float(np.asarray(session.train_and_update(x, y)[0])))
        times.append(time.perf_counter() - t)
    return {
        "backend": session.backend,
        "open_s": open_s,
        "rss_open_mib": opened,
        "step_s": statistics.median(times[1:]),
        "peak_mib": peak_mib(),
        "losses": losses,
    }


def child_torch(layers: int, steps: int, checkpointing: bool = False) -> dict:
    import peft
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model = torch_model(layers)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()  # PEFT's rule: checkpointed blocks need an input grad
    opened = rss_mib()
    config = peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0)
    lora = peft.get_peft_model(model, config).train()
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=LR)
    x, y = (torch.from_numpy(a) for a in batch())
    times, losses = [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        optimizer.zero_grad()
        logits = lora(input_ids=x, attention_mask=torch.ones_like(x)).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        )
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t)
    return {
        "backend": f"torch {torch.__version__} + peft {peft.__version__}",
        "rss_open_mib": opened,
        "step_s": statistics.median(times[1:]),
        "peak_mib": peak_mib(),
        "losses": losses,
    }


def child_node(directory: Path, steps: int) -> dict:
    """``onnxblocks-train`` (onnxruntime-node) on the artifacts: one run of 1 step, one of ``steps +
    1``.

    The step time is the difference over ``steps``, so neither opening nor the warm-up step counts;
    the peak
    is the larger run's node process (``RUSAGE_CHILDREN``).
    """
    sys.path.insert(0, str(ROOT / "tests"))
    from support import web_support

    from onnxblocks.runtime import TrainingSession
    from onnxblocks.web import write_safetensors

    work = Path(tempfile.mkdtemp(prefix="node-", dir=directory.parent))
    js = web_support.workspace(work)
    names = TrainingSession(directory).input_names
    write_safetensors(
        work / "plan.safetensors", {f"train/0/{n}": v for n, v in zip(names, batch(), strict=True)}
    )
    threads = str(os.cpu_count() or 1)
    runs = {}
    for n in (1, steps + 1):
        args = [
            str(directory),
            "--plan",
            str(work / "plan.safetensors"),
            "--steps",
            str(n),
            "--lr",
            str(LR),
        ]
        runs[n] = web_support.run_node(
            js, "bin/onnxblocks-train.mjs", *args, "--threads", threads, timeout=1800
        )
    big = runs[steps + 1]
    return {
        "backend": f"onnxruntime-node {big['onnxruntime']}",
        "step_s": (big["seconds"] - runs[1]["seconds"]) / steps,
        "peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "losses": big["losses"],
    }


def child_browser(model: Path, site: Path, steps: int) -> dict:
    """The LoRA page (``js/demo/lora.html``, onnxruntime-web WASM, one thread) in headless Chromium,
    on this model.

    The site holds its own portable artifacts (with ``logits``, which the page's generation reads)
    and a plan of
    the benchmark's batch; the held-out set and prompt are 5 tokens, so the page's evaluation stays
    small.
    The step time is the difference of the wall times of a 1-step and a ``steps + 1``-step visit,
    over ``steps``.
    """

    sys.path.insert(0, str(ROOT / "tests"))
    from support import web_support

    import onnxblocks
    from onnxblocks import losses
    from onnxblocks.peft import LoraConfig
    from onnxblocks.runtime import TrainingSession
    from onnxblocks.web import write_safetensors, write_state
    from onnxblocks.web.server import serving
    from onnxblocks.web.site import copy_client

    site.mkdir(parents=True)
    art = site / "lora"
    onnxblocks.generate_artifacts(
        model,
        loss=losses.CrossEntropyLoss(class_axis=-1),
        optimizer=onnxblocks.OptimType.AdamW,
        artifact_directory=art,
        additional_output_names=["logits"],
        lora=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS),
        portable=True,
    )
    write_state(art)
    copy_client(site, "demo/lora.html")
    ids, labels = TrainingSession(art).input_names
    x, y = batch()
    held = x[:1, :5].copy()
    tensors = {
        f"train/0/{ids}": x,
        f"train/0/{labels}": y,
        f"held_out/{ids}": held,
        f"held_out/{labels}": held,
    }
    tensors["prompts"] = held[:, :3].copy()
    js, chromium = web_support.workspace(site.parent / "client"), web_support.chromium()
    walls, report = {}, {}
    with serving(site) as url:
        for n in (1, steps + 1):
            write_safetensors(
                site / "lora_plan.safetensors", tensors, {"learning_rate": str(LR), "steps": str(n)}
            )
            start = time.perf_counter()
            report = web_support.run_node(
                js,
                "tools/browser-run.mjs",
                url + "demo/lora.html",
                "--chromium",
                str(chromium),
                "--timeout",
                "3000",
                timeout=3600,
            )
            walls[n] = time.perf_counter() - start
            if report.get("status") != "done":
                raise RuntimeError(f"the page did not finish: {report.get('error')}")
    return {
        "backend": f"onnxruntime-web {report.get('onnxruntime')} (WASM, 1 thread), headless "
        "Chromium",
        "step_s": (walls[steps + 1] - walls[1]) / steps,
        "losses": report["losses"],
    }


# ------------------------------------------------------------------ the parent
def run_child(args: list[str], python: str = sys.executable) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    out = subprocess.run(
        [python, __file__, "--shape", SHAPE_NAME, "--child", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=ROOT,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def stock_python() -> str | None:
    """The Python 3.13 of tests/support/portable_env.py's environment (stock onnxruntime), if it
    is built.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from support.portable_env import ensure_python313

        return str(ensure_python313())
    except Exception as exc:  # no CPython 3.13 here: the stock rows are left out, saying why
        print(f"(stock onnxruntime rows left out: {exc})")
        return None
    finally:
        sys.path.pop(0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="135m",
        help="SmolLM2-135M's shape, batch 4 x 128 (default), or SmolLM2-360M's, batch 1 x 256",
    )
    parser.add_argument("--layers", type=int, help="layers of the shape (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--only", nargs="*", help="configurations to run (names of the table)")
    parser.add_argument(
        "--lean-loss",
        type=int,
        default=0,
        metavar="N",
        help="the chunked loss with the tied head inside it (chunk_size=N) in every configuration",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="generate the artifacts into DIR (named after the configuration) and keep them; "
        "artifacts already there are reused (benchmarks/bench_open_memory.py reads them)",
    )
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    select_shape(args.shape)
    if args.layers is None:
        args.layers = SHAPE["num_hidden_layers"]
    if args.child is not None:
        kind, *rest = args.child
        result = {
            "export": lambda: child_export(int(rest[0]), Path(rest[1])),
            "generate": lambda: child_generate(
                Path(rest[0]),
                Path(rest[1]),
                rest[2] == "1",
                rest[3] or None,
                int(rest[4]),
                rest[5],
            ),
            "session": lambda: child_session(Path(rest[0]), int(rest[1])),
            "torch": lambda: child_torch(int(rest[0]), int(rest[1]), rest[2:] == ["gc"]),
            "node": lambda: child_node(Path(rest[0]), int(rest[1])),
            "browser": lambda: child_browser(Path(rest[0]), Path(rest[1]), int(rest[2])),
        }[kind]()
        print(json.dumps(result))
        return

    cache = CACHE / f"smollm2-{SHAPE_NAME}-L{args.layers}-v1"
    if not (cache / "model.onnx").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"exporting the model to {cache} ...", flush=True)
        print("export:", run_child(["export", str(args.layers), str(cache)]), flush=True)
    model = cache / "model.onnx"
    base = (cache / "model.onnx.data").stat().st_size
    print(
        f"model: LLaMA {args.layers} layers (SmolLM2-{SHAPE_NAME.upper()}'s shape), batch "
        f"{BATCH} x {SEQ}, weights {base / 2**20:.0f} MiB fp32"
    )
    wanted = set(args.only or [])
    chosen = [n for n in STEPS if not wanted or n in wanted]
    stock = stock_python() if any(STEPS[n][0] == "stock" for n in chosen) else None
    rows: list[tuple[str, dict]] = []
    made: dict[tuple[bool, str | None, str], Path] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lora-", dir=CACHE) as tmp:
        if args.keep is not None:  # the artifacts stay (and are reused) there
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        for name in chosen:
            kind, portable, dtype = STEPS[name]
            if kind == "torch":
                gc = ["gc"] if name.endswith("-gc") else []
                rows.append((name, run_child(["torch", str(args.layers), str(args.steps), *gc])))
                print(name, rows[-1][1], flush=True)
                continue
            if kind == "browser":  # its own artifacts (with logits, for the page)
                rows.append(
                    (
                        name,
                        run_child(
                            ["browser", str(model), str(Path(tmp) / "browser"), str(args.steps)]
                        ),
                    )
                )
                print(name, rows[-1][1], flush=True)
                continue
            recompute = "layers" if name.endswith("-rc") else "none"
            key = (portable, dtype, recompute)
            if key not in made:
                rc = "-rc" if recompute != "none" else ""
                directory = (
                    Path(tmp) / f"{'portable' if portable else 'training'}-{dtype or 'fp32'}{rc}"
                )
                reuse = args.keep is not None and (directory / "checkpoint").exists()
                gen = (
                    {"reused": str(directory)}
                    if reuse
                    else run_child(
                        [
                            "generate",
                            str(model),
                            str(directory),
                            "1" if portable else "0",
                            dtype or "",
                            str(args.lean_loss),
                            recompute,
                        ]
                    )
                )
                rows.append((f"generate-{directory.name}", gen))
                print(rows[-1][0], gen, flush=True)
                if "error" in gen:
                    continue
                from onnxblocks.web import write_state

                write_state(directory)
                made[key] = directory
                files = {p.name: p.stat().st_size for p in directory.iterdir()}
                print(
                    f"  files of {directory.name}: "
                    + ", ".join(f"{n} {s / 2**20:.2f} MiB" for n, s in sorted(files.items()))
                )
            if kind == "stock" and stock is None:
                continue
            python = stock if kind == "stock" and stock else sys.executable
            child = "node" if kind == "node" else "session"
            rows.append((name, run_child([child, str(made[key]), str(args.steps)], python=python)))
            print(name, rows[-1][1], flush=True)
    print()
    print(
        f"{'configuration':<28} {'seconds':>9} {'step s':>8} {'RSS open':>9} {'peak RSS':>9} "
        f"{'peak/base':>9}"
    )
    for name, r in rows:
        if "error" in r:
            print(f"{name:<28} error: {r['error']}")
            continue
        seconds = r.get("generate_s", r.get("open_s", float("nan")))
        step = r.get("step_s", float("nan"))
        opened = r.get("rss_open_mib", float("nan"))
        print(
            f"{name:<28} {seconds:>9.2f} {step:>8.2f} {opened:>9.0f} "
            f"{r.get('peak_mib', float('nan')):>9.0f} "
            f"{r.get('peak_mib', float('nan')) * 2**20 / base:>9.2f}"
        )


if __name__ == "__main__":
    main()

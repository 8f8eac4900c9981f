"""Per-step time of portable artifacts on stock onnxruntime against the training build, and the
session's overhead.

One run measures, side by side:

* **step time** (``--only steps``): one training step (forward, backward, AdamW
  update; ``TrainingSession.train_and_update``) of real architectures
  (``portable_real_models.py``: ResNet-18, MobileNetV2, EfficientNet-B0, ViT, GPT-2,
  LLaMA, BERT configs from ``transformers`` with random init, and an LSTM; or the
  small ``mlp``, ``cnn``, ``gpt``) on the training build (onnxruntime-training 1.19.2,
  this Python) and as portable artifacts (``generate_artifacts(..., portable=True)``,
  the fused step model) on stock onnxruntime under Python 3.13 (a cached venv, see
  ``tests/support/portable_env.py``), run by a worker process kept open. The two
  runtimes **alternate** in blocks of ``--steps`` steps (the order flips every round),
  and each side's time is the median of its single steps. It prints each model's
  ratio and the median ratio; a model that fails to export or generate is reported
  and skipped. ``--profile`` adds ORT's per-op-type profile of each step model
  (``SessionOptions.enable_profiling``); ``--unfused`` also times the training +
  optimizer models;
* **session overhead** (``--only overhead``): ``TrainingSession.step`` against ONNX
  Runtime's bare API on the same artifacts (784-128-10 MLP), on both backends. The
  bare loop of the training build is the C bindings' ``Module.train_step`` +
  ``Optimizer.optimizer_step`` + ``lazy_reset_grad``, every output turned into numpy
  (what ``onnxruntime.training.api.Module.__call__`` returns). The bare loop of the
  portable backend is the same artifacts on a stock ``InferenceSession`` with two
  IOBindings bound once (ping-pong buffers), the batch bound per step. The loops take
  turns step by step, without spinning thread pools.

    python benchmarks/bench_portable.py                      # everything
    python benchmarks/bench_portable.py --only steps --models resnet18,gpt2 --profile
    python benchmarks/bench_portable.py --only overhead      # the overhead table
    python benchmarks/bench_portable.py --json out.json

Needs ``transformers`` for the real models (``pip install torch==2.13.0 transformers``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from portable_real_models import REAL_MODELS, export_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

BATCH = 64
#: The models measured by default: real architectures (``portable_real_models.py``).
REAL = "resnet18,mobilenet_v2,efficientnet_b0,vit,gpt2,llama,bert,lstm"


# ------------------------------------------------------------------ models (built with onnx, no
# torch)
def _mlp(dims: tuple[int, ...], seed: int = 0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, params, x = [], [], [], "input"
    for i in range(len(dims) - 1):
        w, b = f"fc{i}.weight", f"fc{i}.bias"
        inits += [
            numpy_helper.from_array(
                (rng.standard_normal((dims[i], dims[i + 1])) / dims[i] ** 0.5).astype(np.float32), w
            ),
            numpy_helper.from_array(np.zeros(dims[i + 1], np.float32) + 0.01 * i, b),
        ]
        params += [w, b]
        y = "logits" if i == len(dims) - 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [y if y == "logits" else y + "_pre"]))
        if y != "logits":
            nodes.append(helper.make_node("Relu", [y + "_pre"], [y]))
        x = y
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", dims[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return (
        model,
        params,
        [np.random.default_rng(1).standard_normal((BATCH, dims[0])).astype(np.float32)],
    )


def _cnn(seed: int = 0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    inits = [
        init("conv1.weight", (8, 1, 3, 3), 0.3),
        init("conv1.bias", (8,), 0.01),
        init("conv2.weight", (16, 8, 3, 3), 0.1),
        init("conv2.bias", (16,), 0.01),
        init("fc.weight", (16 * 7 * 7, 10), 0.03),
        init("fc.bias", (10,), 0.01),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return (
        model,
        [i.name for i in inits],
        [np.random.default_rng(1).standard_normal((BATCH, 1, 28, 28)).astype(np.float32)],
    )


def _gpt():
    import bench_models
    import onnx

    spec = bench_models.ModelSpec(
        "gpt-small", "gpt", vocab=256, d_model=64, layers=2, heads=4, seq=32
    )
    bench_models.SPECS[spec.name] = spec
    built = bench_models.ensure_model(spec.name, verbose=False)
    model = onnx.load(built.path)
    ids = np.random.default_rng(1).integers(0, spec.vocab, (8, spec.seq)).astype(np.int64)
    return (
        model,
        built.params,
        [ids],
        np.random.default_rng(2).integers(0, spec.vocab, 8 * spec.seq).astype(np.int64),
    )


def build_models(names: list[str]) -> dict:
    out = {}
    for name in names:
        if name == "mlp":
            model, params, inputs = _mlp((784, 512, 512, 10))
            labels = np.random.default_rng(2).integers(0, 10, BATCH).astype(np.int64)
        elif name == "mlp-small":
            model, params, inputs = _mlp((784, 128, 10))
            labels = np.random.default_rng(2).integers(0, 10, BATCH).astype(np.int64)
        elif name == "cnn":
            model, params, inputs = _cnn()
            labels = np.random.default_rng(2).integers(0, 10, BATCH).astype(np.int64)
        elif name == "gpt":
            model, params, inputs, labels = _gpt()
        elif name in REAL_MODELS:
            try:
                model, params, batch = export_model(name)
            except Exception as error:  # a model that fails to export is reported
                print(
                    f"{name}: export failed: {type(error).__name__}: {str(error)[:300]}", flush=True
                )
                continue
            out[name] = (model, params, batch)
            continue
        else:
            raise KeyError(name)
        out[name] = (model, params, [*inputs, labels])
    return out


def generate(model, params, directory: Path, portable: bool, fused: bool = True) -> Path | None:
    from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

    extra = {}
    if portable:
        accepted = inspect.signature(generate_artifacts).parameters
        if "portable" not in accepted:
            return None
        extra = (
            {"portable": True, "fused_step": fused}
            if "fused_step" in accepted
            else {"portable": True}
        )
    generate_artifacts(
        model,
        requires_grad=params,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        **extra,
    )
    return directory


# ------------------------------------------------------------------ loops
def _median_of_rounds(loops: dict, steps: int, rounds: int, warmup: int) -> dict[str, float]:
    """Median step time (us) of each loop, over ``rounds`` blocks of ``steps`` steps each.

    The loops take turns block by block (the order flips every round), so machine noise
    hits all alike; the median of single-step times ignores the first steps of a block,
    which the previous session's spinning thread pool slows down.
    """
    for step in loops.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in loops}
    clock = time.perf_counter
    order = list(loops.items())
    for r in range(rounds):
        for key, step in order if r % 2 == 0 else order[::-1]:
            record = times[key].append
            for _ in range(steps):
                start = clock()
                step()
                record(clock() - start)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _interleaved(loops: dict, steps: int, rounds: int, warmup: int) -> dict[str, float]:
    """Median step time (us) of each loop, the loops taking turns step by step (for the overhead
    table).

    The sessions run without spinning thread pools (``_options``), so one loop's idle workers never
    slow
    the next loop's step; every loop, the bare API included, has the same options.
    """
    for step in loops.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in loops}
    clock = time.perf_counter
    order = list(loops.items())
    n = len(order)
    for _ in range(rounds):
        for turn in range(steps):
            for key, step in (
                order[turn % n :] + order[: turn % n]
            ):  # each loop takes each place equally often
                start = clock()
                step()
                times[key].append(clock() - start)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _options(spin: bool = True):
    from onnxblocks._core.ort import onnxruntime

    options = onnxruntime().SessionOptions()
    options.log_severity_level = (
        3  # no "Removing initializer" warnings of the training build's eval models
    )
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class _NullBackend:
    """Stands in for a backend's ONNX Runtime calls: timing ``session.step`` with it gives the
    session's own cost.
    """

    has_optimizer = True

    def __init__(self, outputs: tuple) -> None:
        self.outputs = outputs

    def step(self, arrays):
        return self.outputs


def session_layer_us(session, batch: list[np.ndarray], steps: int = 20000) -> dict[str, float]:
    """Microseconds per ``session.step`` spent outside ONNX Runtime (checked and unchecked),
    backend calls stubbed.
    """
    real = session._impl
    session._impl = _NullBackend(tuple(session.train_and_update(*batch)))
    out = {}
    try:
        for check in (True, False):
            session.check_inputs = check
            for _ in range(200):
                session.train_and_update(*batch)
            best = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(steps // 5):
                    session.train_and_update(*batch)
                best.append((time.perf_counter() - start) / (steps // 5) * 1e6)
            out["layer" if check else "layer unchecked"] = min(best)
    finally:
        session._impl, session.check_inputs = real, True
    return out


def training_build_loops(directory: Path, batch: list[np.ndarray], spin: bool = True) -> dict:
    from onnxblocks._core.ort import capi
    from onnxblocks.runtime import TrainingSession

    C = capi()
    device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    state = C.load_checkpoint(str(directory / "checkpoint"))
    module = C.Module(
        str(directory / "training_model.onnx"),
        state,
        str(directory / "eval_model.onnx"),
        device,
        _options(spin),
    )
    optimizer = C.Optimizer(str(directory / "optimizer_model.onnx"), state, device, _options(spin))
    session = TrainingSession(directory, backend="training", session_options=_options(spin))

    unchecked = TrainingSession(
        directory, backend="training", check_inputs=False, session_options=_options(spin)
    )

    def bare(state=state) -> None:  # the Module points into the state: keep it alive
        fetches = C.OrtValueVector()
        module.train_step(batch, fetches)
        optimizer.optimizer_step()
        module.lazy_reset_grad()
        tuple(f.numpy() for f in fetches)

    return {
        "bare": bare,
        "session": lambda: session.train_and_update(*batch),
        "session unchecked": lambda: unchecked.train_and_update(*batch),
    }


def portable_loops(directory: Path, batch: list[np.ndarray], spin: bool = True) -> dict:
    """The session and a hand-written IOBinding loop on portable artifacts (fused step model when
    present).
    """
    from onnxblocks._core.contracts import moment_names, updated_name
    from onnxblocks._core.ort import capi, onnxruntime
    from onnxblocks.checkpoint import load_checkpoint
    from onnxblocks.runtime import TrainingSession

    session = TrainingSession(directory, backend="portable", session_options=_options(spin))
    unchecked = TrainingSession(
        directory, backend="portable", check_inputs=False, session_options=_options(spin)
    )
    loops: dict = {
        "session": lambda: session.train_and_update(*batch),
        "session unchecked": lambda: unchecked.train_and_update(*batch),
    }
    step_model = directory / "step_model.onnx"
    if not step_model.exists():
        return loops
    ort, C = onnxruntime(), capi()
    sess = ort.InferenceSession(
        str(step_model), sess_options=_options(spin), providers=["CPUExecutionProvider"]
    )
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    ck = load_checkpoint(directory / "checkpoint")
    inputs = {i.name for i in sess.get_inputs()}
    keep, pairs = [], {}
    for p, value in ck.trainable.items():
        for name in (p, *moment_names(p)):
            if name in inputs:
                a = np.array(value if name == p else np.zeros_like(value))
                b = np.empty_like(a)
                keep += [a, b]
                pairs[name] = (
                    C.OrtValue.ortvalue_from_numpy(a, cpu),
                    C.OrtValue.ortvalue_from_numpy(b, cpu),
                )
    lr, stepno = np.array([1e-3], np.float32), np.zeros(1, np.int64)
    lr_v, step_v = (
        C.OrtValue.ortvalue_from_numpy(lr, cpu),
        C.OrtValue.ortvalue_from_numpy(stepno, cpu),
    )
    user_in = [
        n
        for n in (i.name for i in sess.get_inputs())
        if n not in pairs and n not in ("learning_rate", "step") and n not in ck.frozen
    ]
    user_out = session.output_names
    bindings = []
    for parity in (0, 1):
        b = C.SessionIOBinding(sess._sess)
        for name in user_out:
            b.bind_output(name, cpu)
        b.bind_ortvalue_input("learning_rate", lr_v)
        b.bind_ortvalue_input("step", step_v)
        for name, frozen in ck.frozen.items():
            if name in inputs:
                a = np.array(frozen)
                keep.append(a)
                b.bind_ortvalue_input(name, C.OrtValue.ortvalue_from_numpy(a, cpu))
        for name, pair in pairs.items():
            b.bind_ortvalue_input(name, pair[parity])
            b.bind_ortvalue_output(updated_name(name), pair[1 - parity])
        bindings.append(b)
    # the OrtValues share the arrays' memory: the loop must keep them alive
    run, options, state = (
        sess._sess.run_with_iobinding,
        C.RunOptions(),
        {"parity": 0, "step": 0, "keep": keep, "lr": lr},
    )
    count = len(user_out)

    def bare() -> None:
        b = bindings[state["parity"]]
        for name, array in zip(user_in, batch, strict=True):
            b.bind_input(name, array)
        state["step"] += 1
        stepno[0] = state["step"]
        run(b, options)
        outs = b.get_outputs()
        tuple(
            np.array(outs[i].numpy()) for i in range(count)
        )  # copies: the binding reuses its output buffers
        state["parity"] ^= 1

    loops["bare"] = bare
    return loops


def measure(
    kind: str,
    directory: Path,
    batch: list[np.ndarray],
    steps: int,
    rounds: int,
    warmup: int,
    overhead: bool = False,
) -> dict:
    """Step times of the session and the bare API; for the overhead table interleaved, without
    spinning, plus the
    session's own cost per step (:func:`session_layer_us`)."""
    make = training_build_loops if kind == "training" else portable_loops
    loops = make(directory, batch, spin=not overhead)
    if not overhead:
        return _median_of_rounds(loops, steps, rounds, warmup)
    from onnxblocks.runtime import TrainingSession

    got = _interleaved(loops, steps, rounds, warmup)
    return {**got, **session_layer_us(TrainingSession(directory, backend=kind), batch)}


# ------------------------------------------------------------------ the Python 3.13 side
def worker() -> int:
    """``--worker``: read jobs as JSON on stdin, measure each on this Python's (stock)
    onnxruntime, print JSON.
    """
    jobs = json.load(sys.stdin)
    results = []
    for job in jobs["jobs"]:
        with np.load(job["batch"]) as data:
            batch = [data[k] for k in sorted(data.files, key=lambda k: int(k[1:]))]
        results.append(
            measure(
                "portable",
                Path(job["directory"]),
                batch,
                job["steps"],
                job["rounds"],
                job["warmup"],
                job["overhead"],
            )
        )
    import onnxruntime

    print(
        json.dumps(
            {
                "results": results,
                "onnxruntime": onnxruntime.__version__,
                "python": sys.version.split()[0],
            }
        )
    )
    return 0


def run_py313(jobs: list[dict]) -> dict:
    from support.portable_env import ensure_python313

    python = ensure_python313()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run(
        [str(python), __file__, "--worker"],
        input=json.dumps({"jobs": jobs}),
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"the Python 3.13 worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the step table: both runtimes,
# alternating
def _load_batch(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[k] for k in sorted(data.files, key=lambda k: int(k[1:]))]


def _block(step, steps: int) -> list[float]:
    """Times (s) of ``steps`` calls of ``step``."""
    clock, out = time.perf_counter, []
    for _ in range(steps):
        start = clock()
        step()
        out.append(clock() - start)
    return out


def profile_step(directory: Path, batch: list[np.ndarray], steps: int, top: int = 12) -> dict:
    """Per-op-type time (ms per step) of the step model (or training + optimizer model) from ORT's
    profiler.

    The session runs ``steps`` steps with ``SessionOptions.enable_profiling``; the profile's node
    events
    (``*_kernel_time``) are summed per op type and divided by the steps (the warm-up step excluded).
    """
    from onnxblocks.runtime import TrainingSession

    options = _options()
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / "profile")
    session = TrainingSession(directory, backend="portable", session_options=options)
    session.train_and_update(*batch)
    for _ in range(steps):
        session.train_and_update(*batch)
    impl = session._impl
    files = []
    for sess in _inference_sessions(impl):
        files.append(sess.end_profiling())
    by_op: dict[str, list[float]] = {}
    runs = 0
    for name in files:
        events = json.loads(Path(name).read_text())
        runs = max(runs, sum(1 for e in events if e.get("name") == "model_run"))
        for e in events:
            if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
                op = e.get("args", {}).get("op_name", "?")
                by_op.setdefault(op, []).append(e["dur"])
    total = {op: sum(v) / 1e3 / max(runs, 1) for op, v in by_op.items()}
    nodes = {op: len(v) // max(runs, 1) for op, v in by_op.items()}
    ranked = sorted(total, key=total.__getitem__, reverse=True)[:top]
    return {
        "ms_per_step": sum(total.values()),
        "ops": [[op, round(total[op], 3), nodes[op]] for op in ranked],
        "nodes": sum(nodes.values()),
    }


def _inference_sessions(impl) -> list:
    """The stock ``InferenceSession`` objects the portable backend ran (the step model's, else
    training + optimizer).
    """
    fused = getattr(impl, "_fused", None)
    if fused is not None:
        return [fused.session]
    return [m.session for m in (impl._train, impl._optimizer) if m is not None]


def step_worker() -> int:
    """``--step-worker``: a JSON line per command on stdin, a JSON line per answer on stdout.

    ``{"open": directory, "batch": npz}`` opens a portable session; ``{"run": steps}`` runs a block
    and
    answers its step times; ``{"profile": steps}`` profiles the open model; ``{"quit": true}`` ends.
    """
    import onnxruntime

    from onnxblocks.runtime import TrainingSession

    session = batch = directory = None
    print(
        json.dumps({"onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0]}),
        flush=True,
    )
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if "open" in command:
                directory = Path(command["open"])
                batch = _load_batch(command["batch"])
                session = TrainingSession(directory, backend="portable", session_options=_options())
                answer: dict = {"ok": True}
            elif "run" in command:
                assert session is not None and batch is not None
                answer = {
                    "times": _block(
                        functools.partial(session.train_and_update, *batch), command["run"]
                    )
                }
            elif "profile" in command:
                assert directory is not None and batch is not None
                answer = profile_step(directory, batch, command["profile"])
            else:
                return 0
        except Exception as error:  # reported to the parent, which prints it
            answer = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
        print(json.dumps(answer), flush=True)
    return 0


class Remote:
    """The Python 3.13 step worker, kept running: the parent alternates blocks between it and its
    own loop.
    """

    def __init__(self) -> None:
        from support.portable_env import ensure_python313

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
        self.process = subprocess.Popen(
            [str(ensure_python313()), __file__, "--step-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.version = self._read()

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("the Python 3.13 step worker ended (see its stderr above)")
        return json.loads(line)

    def ask(self, command: dict) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.ask({"quit": True}) if self.process.poll() is None else None
        self.process.wait(timeout=60)


def _generate_cases(names: list[str], work: Path, unfused: bool) -> list[dict]:
    """Export and generate each model's artifacts; a model that fails to export or generate is
    reported.
    """
    cases = []
    for name in names:
        built = build_models([name])
        if name not in built:
            cases.append({"model": name, "error": "export failed"})
            continue
        model, params, batch = built[name]
        npz = work / f"{name}.npz"
        np.savez(npz, **{f"a{i}": a for i, a in enumerate(batch)})
        case: dict = {"model": name, "batch": str(npz), "params": len(params)}
        try:
            case["training"] = str(
                generate(model, params, work / name / "training", portable=False)
            )
            case["portable fused"] = str(
                generate(model, params, work / name / "portable", portable=True)
            )
            if unfused:
                case["portable unfused"] = str(
                    generate(
                        model, params, work / name / "portable-unfused", portable=True, fused=False
                    )
                )
        except Exception as error:  # reported in the table
            case["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        cases.append(case)
        print(f"generated {name:16} {case.get('error', 'ok')}", flush=True)
    return cases


def step_table(args: argparse.Namespace, work: Path) -> list[dict]:
    """Step time of each model, training build (here) and portable artifacts (the 3.13 worker),
    alternating.
    """
    from onnxblocks.runtime import TrainingSession

    cases = _generate_cases(args.models.split(","), work, args.unfused)
    remote = Remote()
    label = f"py{remote.version['python']}, ort {remote.version['onnxruntime']}"
    print(f"portable side: {label}; training build: py{sys.version.split()[0]}", flush=True)
    rows = []
    try:
        for case in cases:
            row = {"model": case["model"], "params": case.get("params")}
            rows.append(row)
            if "error" in case:
                row["error"] = case["error"]
                print(f"step  {case['model']:16} not measured: {case['error']}", flush=True)
                continue
            batch = _load_batch(case["batch"])
            local = TrainingSession(
                Path(case["training"]), backend="training", session_options=_options()
            )
            step = functools.partial(local.train_and_update, *batch)
            kinds = [k for k in ("portable fused", "portable unfused") if k in case]
            times: dict[str, list[float]] = {"training": [], **{k: [] for k in kinds}}
            for kind in kinds:
                opened = remote.ask({"open": case[kind], "batch": case["batch"]})
                if "error" in opened:
                    row["error"] = opened["error"]
                    break
                remote.ask({"run": args.warmup})
                _block(step, args.warmup)
                for r in range(args.rounds):
                    order = [("local", step), ("remote", None)]
                    for where, _ in order if r % 2 == 0 else order[::-1]:
                        if where == "local":
                            times["training"] += _block(step, args.steps)
                        else:
                            times[kind] += remote.ask({"run": args.steps})["times"]
                if args.profile and kind == "portable fused":
                    row["profile"] = remote.ask({"profile": args.steps})
            if "error" in row:
                print(
                    f"step  {case['model']:16} failed on stock onnxruntime: {row['error']}",
                    flush=True,
                )
                continue
            for key, values in times.items():
                row[key] = statistics.median(values) * 1e3
            row["ratio"] = row["portable fused"] / row["training"]
            print(
                f"step  {case['model']:16} training build {row['training']:8.2f} ms   "
                + "   ".join(
                    f"{k} {row[k]:8.2f} ms ({row[k] / row['training']:.2f}x)" for k in kinds
                ),
                flush=True,
            )
            if "profile" in row:
                p = row["profile"]
                print(
                    f"      profile: {p['nodes']} nodes, {p['ms_per_step']:.1f} ms/step in "
                    "kernels; by op type:"
                )
                for op, ms, count in p["ops"]:
                    print(f"        {op:28} {ms:8.2f} ms  x{count}")
    finally:
        remote.close()
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    print()
    print("| model | params | training build (ms) | portable fused (ms) | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "ratio" in r:
            times = f"{r['training']:.2f} | {r['portable fused']:.2f}"
            print(f"| {r['model']} | {r['params']} | {times} | {r['ratio']:.2f}x |")
        else:
            print(f"| {r['model']} | {r.get('params')} | - | - | {r['error']} |")
    if ratios:
        print(f"median ratio over {len(ratios)} models: {statistics.median(ratios):.2f}x")
    return rows


def overhead_table(args: argparse.Namespace, work: Path, report: dict) -> None:
    """The session's overhead against ONNX Runtime's bare API (784-128-10 MLP), on both backends."""
    model, params, batch = build_models(["mlp-small"])["mlp-small"]
    np.savez(work / "mlp-small.npz", **{f"a{i}": a for i, a in enumerate(batch)})
    training = generate(model, params, work / "mlp-small" / "training", portable=False)
    fused = generate(model, params, work / "mlp-small" / "portable", portable=True, fused=True)
    assert training is not None
    got = measure(
        "training", training, batch, args.overhead_steps, args.rounds, args.warmup, overhead=True
    )
    report["overhead"].append(
        {"model": "mlp-small", "label": "training build (py3.11, ort-training 1.19.2)", **got}
    )
    job = {
        "directory": str(fused),
        "batch": str(work / "mlp-small.npz"),
        "steps": args.overhead_steps,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "overhead": True,
    }
    remote = run_py313([job])
    label = f"portable fused (py{remote['python']}, ort {remote['onnxruntime']})"
    report["overhead"].append({"model": "mlp-small", "label": label, **remote["results"][0]})
    _summary(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("steps", "overhead"), default=None)
    parser.add_argument("--models", default=REAL, help=f"comma-separated: {REAL},mlp,cnn,gpt")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--unfused", action="store_true", help="also time training + optimizer models"
    )
    parser.add_argument(
        "--profile", action="store_true", help="ORT's per-op-type profile of each step model"
    )
    parser.add_argument("--overhead-steps", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.worker:
        return worker()
    if args.step_worker:
        return step_worker()
    import onnxruntime  # noqa: F401  (the training build, for the version line)

    from onnxblocks._core.ort import onnxruntime as ort_module

    report: dict = {
        "python": sys.version.split()[0],
        "onnxruntime": ort_module().__version__,
        "steps": [],
        "overhead": [],
    }
    work = Path(tempfile.mkdtemp(prefix="bench-portable-"))
    if args.only != "overhead":
        report["steps"] = step_table(args, work)
    if args.only != "steps":
        overhead_table(args, work, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _summary(report: dict) -> None:
    for row in report["overhead"]:
        if "bare" in row:
            for key, layer in (("session", "layer"), ("session unchecked", "layer unchecked")):
                print(
                    f"overhead   {row['model']:9} {row['label']:60} {key:17} {row[key]:7.1f} us / "
                    f"bare {row['bare']:7.1f} us = {row[key] / row['bare']:.3f}x "
                    f"({row[key] - row['bare']:+.1f} us); "
                    f"session's own code {row[layer]:.1f} us/step = "
                    f"{(row['bare'] + row[layer]) / row['bare']:.3f}x"
                )


if __name__ == "__main__":
    sys.exit(main())

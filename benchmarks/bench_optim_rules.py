"""What the torch-exact standard-op optimizers cost against the float32 AdamW of the contrib op, on
stock shapes.

For the parameter shapes of a real architecture (ResNet-18 or GPT-2 small, from a
transformers / torchvision-free list of shapes written here), it builds the
per-tensor portable optimizer model (``optimizer_model.onnx``) of:

* ``AdamW()`` (ONNX Runtime's ``AdamWOptimizer`` written in float32 standard ops),
* ``AdamW(param_groups=no_decay_norm_bias())`` (the torch-exact rule: FMA and sqrt in double), and
  with
  ``exact=False`` (the same rule in float32 ops),
* ``SGD(momentum=0.9)``, ``Adam(amsgrad=True)``, ``RMSprop(momentum=0.9)``, ``Adagrad()``,

and times one optimizer step of each on onnxruntime, alternating the models in one
run (median of ``--repeats`` rounds), then prints milliseconds per step and the
ratio to ``AdamW()``.

    python benchmarks/bench_optim_rules.py --model resnet18 --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np
import onnx
import onnx_ir as ir

import onnxblocks
from onnxblocks import optim
from onnxblocks._core.ort import onnxruntime
from onnxblocks.portable.optimizer import optimizer_model


def _resnet18() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "conv1.weight": (64, 3, 7, 7),
        "bn1.weight": (64,),
        "bn1.bias": (64,),
    }
    channels = [64, 128, 256, 512]
    previous = 64
    for layer, width in enumerate(channels, start=1):
        for block in range(2):
            prefix = f"layer{layer}.{block}"
            shapes[f"{prefix}.conv1.weight"] = (width, previous if block == 0 else width, 3, 3)
            shapes[f"{prefix}.conv2.weight"] = (width, width, 3, 3)
            for bn in ("bn1", "bn2"):
                shapes[f"{prefix}.{bn}.weight"] = shapes[f"{prefix}.{bn}.bias"] = (width,)
            if block == 0 and previous != width:
                shapes[f"{prefix}.downsample.0.weight"] = (width, previous, 1, 1)
                shapes[f"{prefix}.downsample.1.weight"] = shapes[f"{prefix}.downsample.1.bias"] = (
                    width,
                )
        previous = width
    shapes["fc.weight"], shapes["fc.bias"] = (1000, 512), (1000,)
    return shapes


def _gpt2_small() -> dict[str, tuple[int, ...]]:
    d, vocab, positions = 768, 50257, 1024
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (vocab, d), "wpe.weight": (positions, d)}
    for i in range(12):
        p = f"h.{i}"
        shapes |= {
            f"{p}.ln_1.weight": (d,),
            f"{p}.ln_1.bias": (d,),
            f"{p}.attn.c_attn.weight": (d, 3 * d),
            f"{p}.attn.c_attn.bias": (3 * d,),
            f"{p}.attn.c_proj.weight": (d, d),
            f"{p}.attn.c_proj.bias": (d,),
            f"{p}.ln_2.weight": (d,),
            f"{p}.ln_2.bias": (d,),
            f"{p}.mlp.c_fc.weight": (d, 4 * d),
            f"{p}.mlp.c_fc.bias": (4 * d,),
            f"{p}.mlp.c_proj.weight": (4 * d, d),
            f"{p}.mlp.c_proj.bias": (d,),
        }
    shapes["ln_f.weight"] = shapes["ln_f.bias"] = (d,)
    return shapes


MODELS = {"resnet18": _resnet18, "gpt2": _gpt2_small}
OPTIMIZERS = {
    "AdamW() contrib, float32": lambda: optim.AdamW(),
    "AdamW + no-decay groups (torch-exact)": lambda: optim.AdamW(
        param_groups=optim.no_decay_norm_bias()
    ),
    "AdamW + no-decay groups, exact=False": lambda: optim.AdamW(
        param_groups=optim.no_decay_norm_bias(), exact=False
    ),
    "SGD(momentum=0.9)": lambda: optim.SGD(momentum=0.9),
    "SGD(momentum=0.9, exact=False)": lambda: optim.SGD(momentum=0.9, exact=False),
    "Adam(amsgrad=True)": lambda: optim.Adam(amsgrad=True),
    "RMSprop(momentum=0.9)": lambda: optim.RMSprop(momentum=0.9),
    "Adagrad()": lambda: optim.Adagrad(),
}


def _session(block, shapes: dict[str, tuple[int, ...]]):
    # the optimizer reads names, element types and shapes only
    trainable = [
        SimpleNamespace(name=n, data_type=onnx.TensorProto.FLOAT, dims=s) for n, s in shapes.items()
    ]
    with onnxblocks.empty_base():
        block((trainable, []))
    values = [
        ir.Value(name=n, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(s))
        for n, s in shapes.items()
    ]
    model = optimizer_model(block.to_model_proto(), values)
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        if i.name == "learning_rate":
            feeds[i.name] = np.array([1e-3], np.float32)
        elif i.name == "step":
            feeds[i.name] = np.array([3], np.int64)
        else:
            feeds[i.name] = rng.standard_normal([int(d) for d in i.shape]).astype(np.float32) ** 2
    return session, feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    shapes = MODELS[args.model]()
    count = sum(int(np.prod(s)) for s in shapes.values())
    runs = {name: _session(make(), shapes) for name, make in OPTIMIZERS.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for session, feeds in runs.values():  # warm up
        session.run(None, feeds)
    for _ in range(args.repeats):
        for name, (session, feeds) in runs.items():  # alternating: each round runs every model once
            start = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["AdamW() contrib, float32"])
    print(
        f"{args.model}: {len(shapes)} tensors, {count / 1e6:.1f} M parameters, onnxruntime "
        f"{onnxruntime().__version__}"
    )
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:40s} {median * 1e3:8.2f} ms/step   {median / base:5.2f}x AdamW()")


if __name__ == "__main__":
    main()

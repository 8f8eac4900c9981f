"""Benchmark models built locally with torch (random weights, no downloads), cached on disk.

Each model is described by a :class:`ModelSpec`. :func:`ensure_model` exports it
once into the cache directory and writes a sidecar JSON with the names of its
trainable parameters, the graph output to put a loss on, and the label shape.

* ``mlp``: a 3-layer MLP (about 1 M parameters), one file.
* ``gpt162m``: GPT-2-small shape with an untied LM head (about 162 M parameters,
  650 MB), exported to a single ``.onnx`` file.
* ``gpt830m``: d=1536, 24 layers, untied head (about 834 M parameters, 3.3 GB),
  stored as a ``.onnx`` file plus one external ``.data`` file.

LayerNormalization nodes get their optional statistics outputs (see
:func:`add_layernorm_stats_outputs`) so that onnxruntime's gradient builder
accepts them.

The GPT models return logits reshaped to ``[batch * seq, vocab]`` so that a
cross-entropy loss takes them directly, with int64 labels ``[batch * seq]``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_CACHE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "onnxblocks-bench"
)
#: Bump when the way models are built changes, so stale caches are rebuilt.
BUILD_VERSION = 2


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one benchmark model."""

    name: str
    kind: str  # "mlp" or "gpt"
    vocab: int = 0
    d_model: int = 0
    layers: int = 0
    heads: int = 0
    seq: int = 0
    hidden: tuple[int, ...] = ()
    external_data: bool = False
    seed: int = 0


SPECS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", "mlp", hidden=(784, 1024, 512, 10)),
    "gpt162m": ModelSpec("gpt162m", "gpt", vocab=50257, d_model=768, layers=12, heads=12, seq=128),
    "gpt830m": ModelSpec(
        "gpt830m",
        "gpt",
        vocab=50257,
        d_model=1536,
        layers=24,
        heads=16,
        seq=128,
        external_data=True,
    ),
    # Tiny GPT used by tests and --quick runs.
    "gpt-tiny": ModelSpec("gpt-tiny", "gpt", vocab=97, d_model=32, layers=2, heads=4, seq=8),
}


@dataclass
class BuiltModel:
    """A model in the cache: where it is and how to train it."""

    name: str
    path: str
    data_path: str | None
    params: list[str]
    num_params: int
    output: str
    label_shape: list[int]
    label_dtype: str
    file_bytes: int


def _torch_module(spec: ModelSpec):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, seq: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln_1 = nn.LayerNorm(d)
            self.attn_qkv = nn.Linear(d, 3 * d)
            self.attn_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp_fc = nn.Linear(d, 4 * d)
            self.mlp_proj = nn.Linear(4 * d, d)
            self.register_buffer(
                "mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False
            )

        def forward(self, x):
            b, t, d = x.shape
            h = self.ln_1(x)
            q, k, v = self.attn_qkv(h).split(d, dim=2)
            hd = d // self.heads
            q = q.view(b, t, self.heads, hd).transpose(1, 2)
            k = k.view(b, t, self.heads, hd).transpose(1, 2)
            v = v.view(b, t, self.heads, hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / hd**0.5)
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            att = torch.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.attn_proj(y)
            x = x + self.mlp_proj(
                torch.nn.functional.gelu(self.mlp_fc(self.ln_2(x)), approximate="tanh")
            )
            return x

    class GPT(nn.Module):
        def __init__(self, s: ModelSpec) -> None:
            super().__init__()
            self.vocab = s.vocab
            self.wte = nn.Embedding(s.vocab, s.d_model)
            self.wpe = nn.Embedding(s.seq, s.d_model)
            self.h = nn.ModuleList(Block(s.d_model, s.heads, s.seq) for _ in range(s.layers))
            self.ln_f = nn.LayerNorm(s.d_model)
            self.lm_head = nn.Linear(s.d_model, s.vocab, bias=False)

        def forward(self, input_ids):
            t = input_ids.shape[1]
            pos = torch.arange(t, dtype=torch.long).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x)).reshape(-1, self.vocab)

    class MLP(nn.Module):
        def __init__(self, s: ModelSpec) -> None:
            super().__init__()
            dims = s.hidden
            layers: list[nn.Module] = []
            for i in range(len(dims) - 1):
                layers.append(nn.Linear(dims[i], dims[i + 1]))
                if i < len(dims) - 2:
                    layers.append(nn.ReLU())
            self.net = nn.Sequential(*layers)

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(spec.seed)
    with torch.no_grad():
        module = GPT(spec) if spec.kind == "gpt" else MLP(spec)
        # Perturb every parameter: the exporter merges initializers with equal
        # values (fresh LayerNorms are all ones), which would drop parameter names.
        for p in module.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    return module


def add_layernorm_stats_outputs(model) -> int:
    """Give every one-output LayerNormalization node its optional Mean and InvStdDev outputs, in
    place.

    torch exports ``nn.LayerNorm`` at opset >= 17 as a LayerNormalization node
    with only its first output. onnxruntime-training 1.19.2's gradient builder
    for LayerNormalization reads outputs 1 and 2 and fails on such a node
    ("i < node_->OutputDefs().size() was false"), in the reference as well. The
    outputs are part of the op's schema and do not change what the model computes.

    Returns:
        The number of nodes changed.
    """
    changed = 0
    for node in model.graph.node:
        if (
            node.op_type == "LayerNormalization"
            and node.domain in ("", "ai.onnx")
            and len(node.output) == 1
        ):
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_inv_std_dev"])
            changed += 1
    return changed


def _export(spec: ModelSpec, out_dir: Path) -> BuiltModel:
    """Export ``spec`` with torch's TorchScript exporter into ``out_dir``."""
    import onnx
    import torch

    module = _torch_module(spec).eval()
    names = [n for n, _ in module.named_parameters()]
    num_params = sum(p.numel() for p in module.parameters())
    if spec.kind == "gpt":
        example = (torch.zeros(2, spec.seq, dtype=torch.long),)
        input_names, dyn = ["input_ids"], {"input_ids": {0: "batch"}, "logits": {0: "tokens"}}
        output, label_shape = "logits", [2 * spec.seq]
    else:
        example = (torch.zeros(4, spec.hidden[0]),)
        input_names, dyn = ["input"], {"input": {0: "batch"}, "logits": {0: "batch"}}
        output, label_shape = "logits", [4]
    onnx_path = out_dir / f"{spec.name}.onnx"
    raw_dir = out_dir / "raw"
    raw_dir.mkdir()
    raw_path = raw_dir / f"{spec.name}.onnx"
    with torch.no_grad():
        torch.onnx.export(
            module,
            example,
            str(raw_path),
            input_names=input_names,
            output_names=["logits"],
            dynamic_axes=dyn,
            opset_version=17,
            do_constant_folding=False,
            dynamo=False,
        )
    del module, example
    gc.collect()
    # Re-save in the layout the benchmark wants: one file, or one .onnx + one .data file.
    model = onnx.load(str(raw_path), load_external_data=True)
    model.producer_name = "onnxblocks-bench"
    add_layernorm_stats_outputs(model)
    data_path = None
    if spec.external_data:
        location = f"{spec.name}.onnx.data"
        onnx.save_model(
            model,
            str(onnx_path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=location,
            size_threshold=1024,
        )
        data_path = str(out_dir / location)
    else:
        onnx.save_model(model, str(onnx_path))
    inits = {i.name for i in model.graph.initializer}
    del model
    gc.collect()
    shutil.rmtree(raw_dir)
    missing = [n for n in names if n not in inits]
    if missing:
        raise RuntimeError(
            f"Exported {spec.name} lacks parameter initializers {missing[:5]}; export changed "
            "names."
        )
    size = onnx_path.stat().st_size + (Path(data_path).stat().st_size if data_path else 0)
    return BuiltModel(
        spec.name, str(onnx_path), data_path, names, num_params, output, label_shape, "int64", size
    )


def ensure_model(
    name: str, cache_dir: str | os.PathLike = DEFAULT_CACHE_DIR, verbose: bool = True
) -> BuiltModel:
    """The cached model ``name``, exported first if it is not in ``cache_dir``."""
    spec = SPECS[name]
    cache = Path(cache_dir)
    target = cache / f"{spec.name}-v{BUILD_VERSION}"
    meta_path = target / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("spec") == asdict(spec) | {"hidden": list(spec.hidden)}:
            return BuiltModel(**meta["model"])
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=cache))
    start = time.perf_counter()
    if verbose:
        print(
            f"[bench] exporting {spec.name} into {target} (one-time) ...",
            file=sys.stderr,
            flush=True,
        )
    try:
        built = _export(spec, tmp)
        built_final = BuiltModel(
            **{
                **asdict(built),
                "path": str(target / Path(built.path).name),
                "data_path": str(target / Path(built.data_path).name) if built.data_path else None,
            }
        )
        (tmp / "meta.json").write_text(
            json.dumps(
                {
                    "spec": asdict(spec) | {"hidden": list(spec.hidden)},
                    "model": asdict(built_final),
                },
                indent=1,
            )
        )
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        print(
            f"[bench] exported {spec.name}: {built.num_params / 1e6:.1f} M params, "
            f"{built.file_bytes / 1e6:.0f} MB in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return built_final


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Export the benchmark models into the cache.")
    parser.add_argument("models", nargs="*", default=list(SPECS))
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    args = parser.parse_args()
    for m in args.models:
        print(json.dumps(asdict(ensure_model(m, args.cache_dir))))

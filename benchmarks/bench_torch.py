"""Per-step time of onnxblocks.torch.OrtModule against torch eager, side by side in one process.

Usage::

    python benchmarks/bench_torch.py                 # MLP, CNN, small GPT, both exporters
    python benchmarks/bench_torch.py --steps 50 --models mlp,gpt --exporters dynamo
    python benchmarks/bench_torch.py --quick         # small sizes, few steps (a smoke run)
    python benchmarks/bench_torch.py --threads 1     # one intra-op thread each (steadier on a busy
    machine)

A step is what a training loop does: ``zero_grad``, forward, the loss, backward
and ``torch.optim.AdamW.step``. Each model is built once; the eager copy and the
wrapped copy start from the same weights. After a warm-up (the wrapper exports on
its first call), the two run in alternating blocks of steps so that both see the
same machine state. Columns: the fastest and the median step (wall clock, ms) of
each; ``ratio`` is wrapper / eager on the fastest step and on the median (below 1:
the wrapper is faster); ``cpu`` is the same ratio on the process's CPU time per
step (all threads), which a busy machine disturbs less; ``1st s`` is the wrapper's
first call (export and graph building); ``drift`` is the relative difference of the
last losses (they train the same weights; Dropout draws different masks in the
CNN, so it drifts there). The machine's load average is printed before and after:
on a shared machine, compare ratios taken under a low load.

Models (float32, CPU):

* ``mlp``: 784-1024-512-10 with ReLU, batch 64, cross-entropy;
* ``cnn``: two Conv-BatchNorm-ReLU-MaxPool stages (32, 64 channels) on 3x32x32,
  Dropout, a linear head, batch 32, cross-entropy (training mode: batch statistics);
* ``gpt``: 2 pre-norm transformer blocks, d=128, 4 heads, sequence 64, vocabulary
  1000, batch 8, next-token cross-entropy.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxblocks.torch import OrtModule


class MLP(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (784, 1024, 512, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(
        self, channels: tuple[int, int] = (32, 64), classes: int = 10, size: int = 32
    ) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1, bias=False),
            nn.BatchNorm2d(c1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1, bias=False),
            nn.BatchNorm2d(c2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(c2 * (size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.flatten(self.features(x), 1)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.register_buffer(
            "mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        hd = d // self.heads
        q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / hd**0.5)
        att = torch.softmax(att.masked_fill(~self.mask[:t, :t], float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(
        self, vocab: int = 1000, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x)).reshape(b * t, -1)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, and a projected shortcut when
    the shape changes.
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2015; torchvision's ``resnet18`` layout): a 7x7 stem, 4 stages of 2
    basic blocks.
    """

    def __init__(self, classes: int = 10, widths: tuple[int, ...] = (64, 128, 256, 512)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, c_in = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [BasicBlock(c_in, width, 1 if i == 0 else 2), BasicBlock(width, width, 1)]
            c_in = width
        self.layers = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(
            torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1)
        )


class LSTMTagger(nn.Module):
    def __init__(
        self, vocab: int = 1000, d: int = 64, hidden: int = 128, classes: int = 10
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(idx))
        return self.head(out[:, -1])


class Logits(nn.Module):
    """A Hugging Face model's ``.logits``, flattened to ``[rows, classes]`` (random init from a
    config).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model(x).logits
        return logits.reshape(-1, logits.shape[-1])


def _hf(name: str, quick: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    import transformers as tf

    layers, d, seq, vocab, batch = (1, 32, 16, 100, 4) if quick else (2, 128, 64, 1000, 8)
    common = {"attn_implementation": "eager"}
    if name == "bert":
        config = tf.BertConfig(
            vocab_size=vocab,
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=4 * d,
            max_position_embeddings=seq,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=10,
            **common,
        )
        return (
            Logits(tf.BertForSequenceClassification(config)),
            torch.randint(0, vocab, (batch, seq)),
            (torch.randint(0, 10, (batch,))),
        )
    if name == "gpt2":
        config = tf.GPT2Config(
            vocab_size=vocab,
            n_embd=d,
            n_layer=layers,
            n_head=4,
            n_positions=seq,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
        ids = torch.randint(0, vocab, (batch, seq))
        return Logits(tf.GPT2LMHeadModel(config)), ids, torch.randint(0, vocab, (batch * seq,))
    if name == "vit":
        size = 16 if quick else 32
        config = tf.ViTConfig(
            image_size=size,
            patch_size=4,
            num_channels=3,
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=4 * d,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=10,
            **common,
        )
        return (
            Logits(tf.ViTForImageClassification(config)),
            torch.randn(batch, 3, size, size),
            (torch.randint(0, 10, (batch,))),
        )
    raise KeyError(name)


def make_case(name: str, quick: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        dims = (64, 128, 64, 10) if quick else (784, 1024, 512, 10)
        return MLP(dims), torch.randn(64, dims[0]), torch.randint(0, 10, (64,))
    if name == "cnn":
        size = 16 if quick else 32
        model = CNN((8, 16) if quick else (32, 64), size=size)
        return model, torch.randn(32, 3, size, size), torch.randint(0, 10, (32,))
    if name == "gpt":
        vocab, seq = (100, 16) if quick else (1000, 64)
        model = GPT(vocab=vocab, d=32 if quick else 128, seq=seq)
        return model, torch.randint(0, vocab, (8, seq)), torch.randint(0, vocab, (8 * seq,))
    if name in ("bert", "gpt2", "vit"):
        return _hf(name, quick)
    if name == "resnet18":
        size = 32 if quick else 64
        model = ResNet18(widths=(16, 32, 64, 128) if quick else (64, 128, 256, 512))
        return model, torch.randn(8, 3, size, size), torch.randint(0, 10, (8,))
    if name == "lstm":
        seq = 8 if quick else 32
        return LSTMTagger(), torch.randint(0, 1000, (16, seq)), torch.randint(0, 10, (16,))
    raise KeyError(name)


def step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def measure(
    name: str, exporter: str, steps: int, blocks: int, quick: bool, threads: int
) -> dict[str, float]:
    base, x, y = make_case(name, quick)
    eager = copy.deepcopy(base).train()
    wrapped = OrtModule(copy.deepcopy(base).train(), exporter=exporter, threads=threads)
    runs = {"eager": (eager, torch.optim.AdamW(eager.parameters(), lr=1e-3))}
    runs["onnxblocks"] = (wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-3))
    start = time.perf_counter()
    step(*runs["onnxblocks"], x, y)  # exports and builds the graphs
    first_call = time.perf_counter() - start
    step(*runs["eager"], x, y)
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    losses: dict[str, float] = {}
    per_block = max(1, steps // blocks)
    for _ in range(blocks):
        for label, (model, optimizer) in runs.items():
            for _ in range(per_block):
                t0, c0 = time.perf_counter(), time.process_time()
                losses[label] = step(model, optimizer, x, y)
                wall[label].append((time.perf_counter() - t0) * 1e3)
                cpu[label].append((time.process_time() - c0) * 1e3)
    result = {"first_s": first_call}
    for label in runs:
        result[f"{label}_min"] = min(wall[label])
        result[f"{label}_median"] = statistics.median(wall[label])
        result[f"{label}_cpu"] = statistics.median(cpu[label])
    result["drift"] = abs(losses["onnxblocks"] - losses["eager"]) / max(abs(losses["eager"]), 1e-12)
    return result


def measure_session(name: str, steps: int, quick: bool, threads: int) -> dict[str, float]:
    """Median ms per step of a TrainingSession: fused, unfused, and unfused with DataParallel on
    1 gloo rank.
    """
    import tempfile

    import torch.distributed as dist

    from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
    from onnxblocks.runtime import TrainingSession
    from onnxblocks.torch.distributed import DataParallel
    from onnxblocks.torch.export import export_module

    base, x, y = make_case(name, quick)
    exported = export_module(base, (x,), {}, "dynamo")
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    arrays = (x.numpy(), y.numpy())
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for portable in (True, False):
            directory = os.path.join(tmp, "portable" if portable else "training")
            generate_artifacts(
                exported.model,
                requires_grad=list(exported.weights),
                loss=LossType.CrossEntropyLoss,
                optimizer=OptimType.AdamW,
                artifact_directory=directory,
                portable=portable,
            )
            kind = "portable" if portable else "training"
            options = None
            if threads:
                from onnxblocks._core.ort import onnxruntime

                options = onnxruntime().SessionOptions()
                options.intra_op_num_threads = threads
            session = TrainingSession(directory, session_options=options)

            def fused(session: TrainingSession = session) -> None:
                session.train_and_update(*arrays)

            def unfused(session: TrainingSession = session) -> None:
                session.train_step(*arrays)
                session.optimizer_step()

            runs = {"fused": fused, "unfused": unfused}
            parallel = None
            for label, run in [*runs.items(), ("data_parallel", unfused)]:
                if label == "data_parallel":
                    parallel = DataParallel(session)
                run()  # warm-up
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - t0) * 1e3)
                result[f"{kind}_{label}"] = statistics.median(times)
            if parallel is not None:
                parallel.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="bert,gpt2,resnet18,vit,lstm", help="also: mlp, cnn, gpt"
    )
    parser.add_argument("--exporters", default="dynamo", help="dynamo, torchscript or both")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per model and side")
    parser.add_argument(
        "--blocks", type=int, default=4, help="alternating blocks the steps are split into"
    )
    parser.add_argument("--quick", action="store_true", help="small models, 8 steps")
    parser.add_argument(
        "--threads",
        default="1,2",
        help="torch and ONNX Runtime intra-op threads, one run per value (0: defaults)",
    )
    parser.add_argument(
        "--session",
        default="",
        help="models whose TrainingSession steps to time: fused, unfused, DataParallel",
    )
    args = parser.parse_args(argv)
    steps = 8 if args.quick else args.steps
    print(
        f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"{steps} steps per "
        "side (zero_grad, forward, loss, backward, AdamW.step)"
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    columns = (
        "model",
        "exporter",
        "eager min",
        "eager med",
        "ours min",
        "ours med",
        "ratio",
        "(med)",
        "cpu",
    )
    widths = (8, 11, 9, 9, 9, 9, 6, 6, 6)
    pairs = list(zip(columns, widths, strict=True))
    header = " ".join(f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, w) in enumerate(pairs))
    warnings.simplefilter("ignore")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or os.cpu_count() or 1)
        print(f"\n{threads or 'default'} thread(s) for torch and ONNX Runtime")
        print(header + f" {'1st s':>6} {'drift':>8}")
        print("-" * (len(header) + 16))
        for name in filter(None, args.models.split(",")):
            for exporter in args.exporters.split(","):
                r = measure(name, exporter, steps, args.blocks, args.quick, threads)
                cells = (
                    r["eager_min"],
                    r["eager_median"],
                    r["onnxblocks_min"],
                    r["onnxblocks_median"],
                    r["onnxblocks_min"] / r["eager_min"],
                    r["onnxblocks_median"] / r["eager_median"],
                    r["onnxblocks_cpu"] / r["eager_cpu"],
                )
                numbers = " ".join(f"{v:>{w}.2f}" for v, w in zip(cells, widths[2:], strict=True))
                print(
                    f"{name:<8} {exporter:<11} {numbers} {r['first_s']:>6.1f} {r['drift']:>8.1e}",
                    flush=True,
                )
        for name in filter(None, args.session.split(",")):
            r = measure_session(name, steps, args.quick, threads)
            for kind in ("portable", "training"):
                fused, unfused, parallel = (
                    r[f"{kind}_{k}"] for k in ("fused", "unfused", "data_parallel")
                )
                print(
                    f"session {name} ({kind}): train_and_update {fused:.2f} ms, train_step + "
                    "optimizer_step "
                    f"{unfused:.2f} ms ({unfused / fused:.2f}x), with DataParallel on 1 gloo "
                    f"rank {parallel:.2f} ms "
                    f"({parallel / fused:.2f}x)",
                    flush=True,
                )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

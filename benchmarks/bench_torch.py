"""Per-step time of onnxblocks.torch.OrtModule against torch eager, side by side in one process.

Usage::

    python benchmarks/bench_torch.py                 # MLP, CNN, small GPT, both exporters
    python benchmarks/bench_torch.py --steps 50 --models mlp,gpt --exporters dynamo
    python benchmarks/bench_torch.py --quick         # small sizes, few steps (a smoke run)
    python benchmarks/bench_torch.py --threads 1     # one intra-op thread each (steadier on a busy machine)

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
    def __init__(self, channels: tuple[int, int] = (32, 64), classes: int = 10, size: int = 32) -> None:
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
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

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
    def __init__(self, vocab: int = 1000, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64) -> None:
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
    raise KeyError(name)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def measure(name: str, exporter: str, steps: int, blocks: int, quick: bool, threads: int) -> dict[str, float]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--exporters", default="dynamo,torchscript")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per model and side")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks the steps are split into")
    parser.add_argument("--quick", action="store_true", help="small models, 8 steps")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch and ONNX Runtime intra-op threads (0: each library's default)"
    )
    args = parser.parse_args(argv)
    steps = 8 if args.quick else args.steps
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {steps} steps per side (zero_grad, forward, loss, backward, AdamW.step)"
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    columns = ("model", "exporter", "eager min", "eager med", "ours min", "ours med", "ratio", "(med)", "cpu")
    widths = (6, 11, 9, 9, 9, 9, 6, 6, 6)
    pairs = list(zip(columns, widths, strict=True))
    header = " ".join(f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, w) in enumerate(pairs))
    print(header + f" {'1st s':>6} {'drift':>8}")
    print("-" * (len(header) + 16))
    warnings.simplefilter("ignore")
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            r = measure(name, exporter, steps, args.blocks, args.quick, args.threads)
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
            print(f"{name:<6} {exporter:<11} {numbers} {r['first_s']:>6.1f} {r['drift']:>8.1e}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

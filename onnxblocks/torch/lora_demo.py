"""``onnxblocks demo --lora``: LoRA adapters fine-tuned on a small LLaMA, end to end, without
downloads.

:func:`run_lora_demo` does, in order:

1. builds a small LLaMA-architecture causal LM from a ``transformers.LlamaConfig`` (random init,
   no download) and pre-trains it briefly in torch on a synthetic language: sequences that count
   up by one modulo :data:`VOCAB` (``3 4 5 6 ...``), so the fine-tune has something to adapt;
2. exports it to ONNX (TorchScript exporter) as ``base_model.onnx``;
3. generates training artifacts with LoRA adapters on the attention projections
   (``generate_artifacts(..., lora=LoraConfig(...))``): only the adapters train;
4. fine-tunes the adapters with :class:`onnxblocks.runtime.TrainingSession` on a shifted task:
   counting up by two (``3 5 7 9 ...``), showing the loss before and after;
5. writes the adapters as a PEFT directory (``TrainingSession.save_adapters``: what
   ``peft.PeftModel.from_pretrained`` loads) and the merged model
   (``export_inference_model(..., merge_adapters=True)``);
6. generates text greedily with ``onnxruntime`` from the base model and from the merged model.

It needs torch and transformers (``pip install 'onnxblocks[torch]' transformers``, torch pinned) for
step 1 and 2 only; the fine-tune runs on ONNX Runtime. It takes under a minute on two CPU cores.
The command line reaches it through ``python -m onnxblocks.torch.lora_demo`` (the CLI never imports
torch);
``demo --lora --web`` through ``python -m onnxblocks.torch.lora_web``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch

from onnxblocks.torch.torchlib import shared_registry

#: Tokens of the synthetic language (the numbers 0 .. VOCAB-1, counted modulo VOCAB).
VOCAB = 16
#: Tokens per training sequence (the model reads SEQ and predicts each next one).
SEQ = 10
#: Strides of the pre-training language and of the fine-tuning task.
PRETRAIN_STRIDE, FINETUNE_STRIDE = 1, 2
#: The modules that get adapters.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
#: What the demo promises (and its test checks): the fine-tune's loss at most this fraction of the
#: loss before.
TARGET_RATIO = 0.25
DEFAULT_OUTPUT_DIR = "onnxblocks-lora-demo"


@dataclass
class LoraDemoResult:
    """What :func:`run_lora_demo` measured and wrote."""

    output_dir: Path
    loss_before: float = float("nan")
    loss_after: float = float("nan")
    base_continuations: list[list[int]] = field(default_factory=list)
    merged_continuations: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    trainable: int = 0
    frozen: int = 0
    seconds: float = 0.0
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when the fine-tune cut the loss to :data:`TARGET_RATIO` of its start or less."""
        return self.loss_after <= TARGET_RATIO * self.loss_before

    @property
    def follows_new_task(self) -> float:
        """Fraction of generated tokens that follow the fine-tuned task (counting by two)."""
        return _fraction(self.prompts, self.merged_continuations, FINETUNE_STRIDE)


def _fraction(prompts: list[list[int]], continuations: list[list[int]], stride: int) -> float:
    good = total = 0
    for prompt, cont in zip(prompts, continuations, strict=True):
        previous = prompt[-1]
        for token in cont:
            good += token == (previous + stride) % VOCAB
            total += 1
            previous = token
    return good / max(total, 1)


def counting(rng: np.random.Generator, rows: int, stride: int, length: int = SEQ + 1) -> np.ndarray:
    """``rows`` sequences ``s, s+stride, s+2*stride, ...`` (mod :data:`VOCAB`) from random
    starts, int64.
    """
    start = rng.integers(0, VOCAB, (rows, 1))
    return ((start + stride * np.arange(length)) % VOCAB).astype(np.int64)


def build_llama(seed: int = 0) -> torch.nn.Module:
    """A small ``LlamaForCausalLM`` (2 layers, hidden 32, 4 heads, 2 KV heads) from its config,
    random init.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def pretrain(
    model: torch.nn.Module, steps: int, seed: int = 0, batch: int = 32, lr: float = 1e-2
) -> list[float]:
    """Train ``model`` in torch on the counting-by-one language; return the losses."""
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        ids = torch.from_numpy(counting(rng, batch, PRETRAIN_STRIDE))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def export_lm(
    model: torch.nn.Module, path: Path, batch: int, seq: int = SEQ, exporter: str = "torchscript"
) -> Path:
    """Export a Hugging Face causal LM as ``input_ids [batch, seq] -> logits [batch, seq, vocab]``.

    The graph keeps the LM's own module paths (``model.layers.0.self_attn.q_proj``), so its LoRA
    adapters carry PEFT's keys for the LM itself. ``exporter`` is ``"torchscript"`` (opset 17) or
    ``"dynamo"`` (opset 18, ``optimize=False``).
    """
    model.eval()
    ids = torch.zeros((batch, seq), dtype=torch.int64)
    full = type(model).forward

    def logits(self: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        # an all-ones mask: without one transformers looks for packed sequences with torch.diff (not
        # exportable)
        return full(
            self, input_ids=input_ids, attention_mask=torch.ones_like(input_ids), return_dict=True
        ).logits

    model.forward = types.MethodType(
        logits, model
    )  # the module paths stay the LM's own (PEFT's keys)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                with shared_registry():
                    program = torch.onnx.export(
                        model,
                        (ids,),
                        dynamo=True,
                        optimize=False,
                        input_names=["input_ids"],
                        output_names=["logits"],
                        opset_version=18,
                    )
                assert program is not None  # torch returns the program when no file is given
                program.save(os.fspath(path))
            else:
                torch.onnx.export(
                    model,
                    (ids,),
                    os.fspath(path),
                    input_names=["input_ids"],
                    output_names=["logits"],
                    dynamo=False,
                    do_constant_folding=False,
                    opset_version=17,
                    training=torch.onnx.TrainingMode.TRAINING,
                )
    finally:
        del model.forward
    return path


def greedy(model_path: Path, prompts: np.ndarray, new_tokens: int) -> list[list[int]]:
    """Continue each prompt by ``new_tokens`` greedy tokens with ``onnxruntime``.

    The model reads a fixed window of :data:`SEQ` tokens; it is causal, so the positions after the
    text do not change the logits read.
    """
    from onnxblocks._core.ort import onnxruntime, session_options

    session = onnxruntime().InferenceSession(
        os.fspath(model_path), session_options(), providers=["CPUExecutionProvider"]
    )
    rows, length = prompts.shape
    window = np.zeros((rows, SEQ), dtype=np.int64)
    window[:, :length] = prompts
    for t in range(length, min(length + new_tokens, SEQ)):
        logits = session.run(["logits"], {"input_ids": window})[0]
        window[:, t] = logits[:, t - 1].argmax(-1)
    return window[:, length : length + new_tokens].tolist()


def run_lora_demo(
    output_dir: str | os.PathLike = DEFAULT_OUTPUT_DIR,
    *,
    seed: int = 0,
    pretrain_steps: int = 50,
    finetune_steps: int = 60,
    batch: int = 16,
    lr: float = 1e-2,
    portable: bool = False,
    stream: IO[str] | None = None,
) -> LoraDemoResult:
    """Pre-train a small LLaMA, fine-tune LoRA adapters on a shifted task, merge, generate (module
    docstring).

    Args:
        output_dir: Where the files go (created).
        seed: Seed of the weights, the data and the adapters.
        pretrain_steps: torch AdamW steps on the counting-by-one language.
        finetune_steps: onnxblocks AdamW steps on the adapters (counting by two).
        batch: Sequences per step.
        lr: The fine-tune's learning rate.
        portable: Portable artifacts (standard ops, trained on the portable backend).
        stream: Where the report goes (default stdout).

    Returns:
        The :class:`LoraDemoResult`.
    """
    from onnxblocks.artifacts import OptimType, generate_artifacts
    from onnxblocks.losses import CrossEntropyLoss
    from onnxblocks.peft import LoraConfig
    from onnxblocks.runtime import TrainingSession

    out = stream or sys.stdout
    started = time.perf_counter()
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    result = LoraDemoResult(output_dir=root)
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731

    lm = build_llama(seed)
    losses = pretrain(lm, pretrain_steps, seed)
    say(
        f"[1/6] pre-trained a small LLaMA ({sum(p.numel() for p in lm.parameters()):,} "
        "parameters) in torch on "
        f"counting by {PRETRAIN_STRIDE}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in "
        f"{pretrain_steps} steps"
    )
    base = export_lm(lm, root / "base_model.onnx", batch)
    say(f"[2/6] exported it to ONNX: {base}")

    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS)
    directory = root / "artifacts"
    generate_artifacts(
        os.fspath(base),
        loss=CrossEntropyLoss(class_axis=-1),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["logits"],
        lora=config,
        portable=portable,
    )
    session = TrainingSession(directory)
    result.trainable = sum(
        session.get_parameter(n).size for n in session.parameter_names(trainable_only=True)
    )
    result.frozen = sum(p.numel() for p in lm.parameters())
    say(
        f"[3/6] artifacts with LoRA r={config.r}, alpha={config.lora_alpha} on "
        f"{', '.join(TARGETS)}: "
        f"{result.trainable:,} trainable parameters, the {result.frozen:,} of the base frozen "
        f"({directory})"
    )

    rng = np.random.default_rng(seed + 1)
    held_out = counting(rng, batch, FINETUNE_STRIDE)
    result.loss_before = float(session.eval_step(held_out[:, :-1], held_out[:, 1:])[0])
    session.learning_rate = lr
    for _ in range(finetune_steps):
        data = counting(rng, batch, FINETUNE_STRIDE)
        session.train_and_update(data[:, :-1], data[:, 1:])
    result.loss_after = float(session.eval_step(held_out[:, :-1], held_out[:, 1:])[0])
    say(
        f"[4/6] fine-tuned the adapters on counting by {FINETUNE_STRIDE} ({finetune_steps} "
        f"steps, {session.backend} "
        f"backend): held-out loss {result.loss_before:.3f} -> {result.loss_after:.3f}"
    )

    adapters = session.save_adapters(root / "adapters")
    merged = session.export_inference_model(
        root / "merged_model.onnx", ["logits"], merge_adapters=True
    )
    result.files = {
        "base model": base,
        "artifacts": directory,
        "PEFT adapters": adapters,
        "merged model": merged,
    }
    say(f"[5/6] wrote the PEFT adapter directory {adapters} and the merged model {merged}")

    starts = np.random.default_rng(seed + 2).choice(VOCAB, 4, replace=False)[:, None]
    prompts = (starts + FINETUNE_STRIDE * np.arange(3)) % VOCAB
    padded = np.zeros((batch, 3), dtype=np.int64)
    padded[: len(prompts)] = prompts
    new = SEQ - 3
    result.prompts = prompts.tolist()
    result.base_continuations = greedy(base, padded, new)[: len(prompts)]
    result.merged_continuations = greedy(merged, padded, new)[: len(prompts)]
    say("[6/6] greedy generation with onnxruntime (prompt | base model | merged model):")
    for prompt, before, after in zip(
        result.prompts, result.base_continuations, result.merged_continuations, strict=True
    ):
        say(
            f"      {' '.join(map(str, prompt)):>9} | {' '.join(map(str, before)):<21} | "
            f"{' '.join(map(str, after))}"
        )
    result.seconds = time.perf_counter() - started
    say(
        f"done in {result.seconds:.1f} s: {100 * result.follows_new_task:.0f}% of the merged "
        "model's tokens count by 2"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxblocks.torch.lora_demo [--output-dir DIR] [--seed N] [--portable]``
    (``demo --lora``).
    """
    parser = argparse.ArgumentParser(
        prog="onnxblocks demo --lora", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--portable", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    result = run_lora_demo(args.output_dir, seed=args.seed, portable=args.portable)
    if not result.passed:
        print(
            f"the fine-tune reached loss {result.loss_after:.3f} from {result.loss_before:.3f}; "
            "the demo promises "
            f"at most {TARGET_RATIO:.0%} of the start.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

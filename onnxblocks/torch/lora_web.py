"""``onnxblocks demo --lora --web``: the LoRA demo's fine-tune in the browser (onnxruntime-web,
WASM).

:func:`build_lora_site` pre-trains the small LLaMA of :mod:`onnxblocks.torch.lora_demo` in torch
(counting by
one), exports it, generates *portable* LoRA artifacts (only the adapters are state:
``params.safetensors``
holds them and their moments) and writes the site: the page ``demo/lora.html`` fine-tunes the
adapters on
counting by two with the JavaScript client, shows the loss and greedy generations before and after,
and
offers the adapters as a PEFT directory ("Download adapters"). :func:`run_lora_web_demo` serves it
on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np

from onnxblocks.torch.lora_demo import (
    FINETUNE_STRIDE,
    SEQ,
    TARGETS,
    VOCAB,
    build_llama,
    counting,
    export_lm,
    pretrain,
)

#: The site's files besides the client: the artifacts folder, the plan, the base model's weights
#: (for peft).
LORA_ARTIFACTS, LORA_PLAN, BASE_WEIGHTS = "lora", "lora_plan.safetensors", "base_model.safetensors"


def build_lora_site(
    directory: str | os.PathLike,
    *,
    seed: int = 0,
    steps: int = 40,
    lr: float = 2e-2,
    batch: int = 8,
    pretrain_steps: int = 50,
    ort_web_dist: str | os.PathLike | None = None,
) -> Path:
    """Write the LoRA browser demo into ``directory`` (see the module docstring).

    Args:
        directory: The site folder (created).
        seed: Seed of the weights, the data and the adapters.
        steps: Fine-tuning steps the page takes.
        lr: The page's learning rate.
        batch: Sequences per step.
        pretrain_steps: torch AdamW steps on counting by one.
        ort_web_dist: onnxruntime-web's ``dist/`` folder; default: npm-installed into the cache
        once.

    Returns:
        The site folder.
    """
    import torch

    from onnxblocks.artifacts import OptimType, generate_artifacts
    from onnxblocks.losses import CrossEntropyLoss
    from onnxblocks.peft import LoraConfig
    from onnxblocks.runtime import TrainingSession
    from onnxblocks.web.safetensors import write_safetensors
    from onnxblocks.web.site import copy_client
    from onnxblocks.web.state import write_state

    site = Path(os.fspath(directory))
    site.mkdir(parents=True, exist_ok=True)
    lm = build_llama(seed)
    pretrain(lm, pretrain_steps, seed)
    base = export_lm(lm, site / "base_model.onnx", batch)
    with torch.no_grad():
        write_safetensors(
            site / BASE_WEIGHTS, {k: v.numpy().copy() for k, v in lm.state_dict().items()}
        )
    artifacts = site / LORA_ARTIFACTS
    generate_artifacts(
        os.fspath(base),
        loss=CrossEntropyLoss(class_axis=-1),
        optimizer=OptimType.AdamW,
        artifact_directory=artifacts,
        additional_output_names=["logits"],
        lora=LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS),
        portable=True,
    )
    write_state(artifacts)
    ids, labels = TrainingSession(artifacts).input_names
    rng = np.random.default_rng(seed + 1)
    tensors: dict[str, np.ndarray] = {}
    for i in range(steps):
        data = counting(rng, batch, FINETUNE_STRIDE)
        tensors[f"train/{i}/{ids}"], tensors[f"train/{i}/{labels}"] = data[:, :-1], data[:, 1:]
    held = counting(rng, batch, FINETUNE_STRIDE)
    tensors[f"held_out/{ids}"], tensors[f"held_out/{labels}"] = held[:, :-1], held[:, 1:]
    starts = np.random.default_rng(seed + 2).choice(VOCAB, min(4, batch), replace=False)[:, None]
    tensors["prompts"] = ((starts + FINETUNE_STRIDE * np.arange(3)) % VOCAB).astype(np.int64)
    metadata = {"learning_rate": repr(float(lr)), "steps": str(steps), "seq": str(SEQ)}
    write_safetensors(site / LORA_PLAN, tensors, metadata=metadata)
    copy_client(site, "demo/lora.html", ort_web_dist)
    return site


def run_lora_web_demo(
    output_dir: str | os.PathLike, *, seed: int = 0, port: int = 8000, stream: IO[str] | None = None
) -> str:
    """Build the LoRA browser demo into ``<output_dir>/web`` and serve it on 127.0.0.1 until Ctrl-C.

    Returns:
        The page's URL.
    """
    from onnxblocks.web.server import serve, url_of

    out = stream if stream is not None else sys.stdout
    started = time.perf_counter()
    site = build_lora_site(Path(os.fspath(output_dir)) / "web", seed=seed)
    try:
        server = serve(site, port)
    except OSError:
        server = serve(site, 0)
    url = url_of(server, "demo/lora.html")
    out.write(
        "onnxblocks demo --lora --web: LoRA adapters of a small LLaMA fine-tuned in the browser "
        "by onnxruntime-web\n"
        f"  site written to {site} in {time.perf_counter() - started:.1f} s\n  open {url}\n"
        "  (served on 127.0.0.1 only; Ctrl-C stops the server)\n"
    )
    out.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        out.write("stopped\n")
    finally:
        server.server_close()
    return url


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxblocks.torch.lora_web [--output-dir DIR] [--seed N] [--port P]`` (``demo
    --lora --web``).
    """
    import torch

    parser = argparse.ArgumentParser(
        prog="onnxblocks demo --lora --web", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output-dir", default="onnxblocks-lora-demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    run_lora_web_demo(args.output_dir, seed=args.seed, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())

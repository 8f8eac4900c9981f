"""Time ``onnxblocks.peft.apply_lora`` on a SmolLM2-135M-shaped LLaMA graph (30 layers, hidden 576,
9 heads).

Usage::

    python benchmarks/bench_lora_transform.py [--vocab 256] [--exporter ts|dynamo]

The model is built from a transformers config (random init, no download) with a small vocabulary by
default
(the graph, not the embedding, is what the transform walks), exported in memory, and adapted with
r=8 on
q_proj/v_proj and on ``all-linear``. Prints the node count, the weights' size, and the seconds of
each
``apply_lora`` call (the ModelProto's inline weights are serialized once by it).
"""

from __future__ import annotations

import argparse
import io
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--exporter", choices=("ts", "dynamo"), default="ts")
    args = parser.parse_args()

    import onnx
    import torch
    import transformers

    from onnxblocks.peft import LoraConfig, apply_lora

    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=128,
        use_cache=False,
        tie_word_embeddings=False,
    )
    module = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros(1, 16, dtype=torch.long)
    inputs = (ids, torch.ones_like(ids))
    names = ["input_ids", "attention_mask"]
    if args.exporter == "ts":
        f = io.BytesIO()
        torch.onnx.export(
            module,
            inputs,
            f,
            dynamo=False,
            input_names=names,
            output_names=["logits"],
            opset_version=17,
        )
        model = onnx.load_from_string(f.getvalue())
    else:
        model = torch.onnx.export(
            module, inputs, dynamo=True, input_names=names, output_names=["logits"]
        ).model_proto
    size = sum(len(i.raw_data) for i in model.graph.initializer) / 1e6
    print(f"{args.exporter}: {len(model.graph.node)} nodes, {size:.0f} MB of weights")
    for targets in (["q_proj", "v_proj"], "all-linear"):
        start = time.perf_counter()
        out = apply_lora(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
        print(
            f"  apply_lora {targets}: {time.perf_counter() - start:.2f} s, {len(out.graph.node)} "
            "nodes after"
        )


if __name__ == "__main__":
    main()

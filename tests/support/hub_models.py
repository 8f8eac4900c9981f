"""A hand-made hub folder of a tiny LLaMA, in the layout Optimum writes, made in the main venv.

``make_hub(directory)`` writes what an Optimum export holds (``config.json``,
``generation_config.json``, a word-level ``tokenizer.json`` with its config, ``model.safetensors``
by ``save_pretrained``, and ``onnx/model.onnx``: TorchScript with constant folding, eval mode, so
Linear weights are stored transposed as ``onnx::MatMul_N`` as in Optimum's files), without the
optimum venv. ``variant="positions"`` exports another graph of the same model (a ``position_ids``
input too), whose folded names differ: the target of ``export_hub(into=...)``. The model and
the tokenizer are :mod:`support.optimum_worker`'s, with four special tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch

from support.optimum_worker import model_config, write_tokenizer
from support.torch_export import export_onnx

SPECIALS = ["[PAD]", "[UNK]", "<s>", "</s>"]


def tiny_llama(seed: int = 0):
    """The optimum worker's random-init 2-layer LLaMA (untied head, eager attention), with this
    folder's special tokens, in eval mode.
    """
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    _, config = model_config("llama", SPECIALS, attn_implementation="eager")
    model = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from one, so no two norm weights are equal
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def export_llama(model, variant: str = "default") -> onnx.ModelProto:
    """``model`` exported by TorchScript (opset 17, constant folding, dynamic batch and sequence).

    The model's own class gets a forward of just these inputs for the export (a wrapper module
    would prefix every parameter name); ``variant="positions"`` adds a ``position_ids`` input,
    which renumbers the folded weights.
    """
    ids = np.array([[2, 5, 6, 7, 8]], dtype=np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if variant == "positions":
        inputs["position_ids"] = np.arange(5, dtype=np.int64)[None]
    axes = {n: {0: "batch", 1: "sequence"} for n in [*inputs, "logits"]}
    own = type(model)

    class Exported(own):  # type: ignore[misc, valid-type]
        def forward(self, input_ids, attention_mask, position_ids=None):
            out = own.forward(
                self, input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids, use_cache=False,
            )  # fmt: skip
            return out.logits

    model.__class__ = Exported
    try:
        with torch.no_grad():
            return export_onnx(
                model, inputs, dynamo=False, opset=17, outputs=["logits"], dynamic_axes=axes,
                training=False, fold=True,
            )  # fmt: skip
    finally:
        model.__class__ = own


def make_hub(directory: Path, *, variant: str = "default", seed: int = 0) -> Path:
    """Write the hub folder of :func:`tiny_llama` ``seed`` into ``directory``; return it."""
    model = tiny_llama(seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    model.generation_config.save_pretrained(directory)
    write_tokenizer(directory, SPECIALS)
    (directory / "onnx").mkdir(exist_ok=True)
    onnx.save(export_llama(model, variant), directory / "onnx" / "model.onnx")
    return directory


def greedy_torch(directory: Path, prompt: list[int], steps: int, dtype=torch.float32) -> list[int]:
    """``steps`` tokens generated greedily by transformers from ``directory``'s safetensors."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(input_ids=ids, use_cache=False).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt) :].tolist()


def greedy_onnx(path: Path, prompt: list[int], steps: int) -> list[int]:
    """``steps`` tokens generated greedily by onnxruntime from a no-cache ``model.onnx``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    ids = list(prompt)
    for _ in range(steps):
        feed = {"input_ids": np.array([ids], dtype=np.int64)}
        if "attention_mask" in names:
            feed["attention_mask"] = np.ones_like(feed["input_ids"])
        if "position_ids" in names:
            feed["position_ids"] = np.arange(len(ids), dtype=np.int64)[None]
        logits = session.run(["logits"], feed)[0]
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]

"""Write one tiny random-init model and export it with Hugging Face Optimum (run in the optimum venv).

Run as ``python optimum_worker.py`` with a JSON request on stdin: ``{"family", "task", "with_past",
"out"}``. Nothing is downloaded (``HF_HUB_OFFLINE=1``): the model is made from a config, saved with
``save_pretrained``, given a word-level tokenizer built with ``tokenizers``, and exported with
``optimum.exporters.onnx.main_export`` into the Transformers.js layout (``config.json``,
``generation_config.json`` for language models, tokenizer files, ``model.safetensors`` and
``onnx/model.onnx``). This script runs in its own venv (optimum needs ``transformers<4.58``), so
it imports nothing of onnxblocks or of the tests.

It is also the tests' one builder of these models and tokenizers: :func:`model_config` and
:func:`write_tokenizer` serve :mod:`support.hub_models` (the hand-made hub folder, main venv) too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: Words of the tokenizer after its special tokens; ids stay below the models' vocabulary of 64.
WORDS = "the a cat dog sat on mat and ran to of in is it was he she they we you".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
#: Each special token's role in ``tokenizer_config.json`` (and the config's token ids).
ROLES = {
    "unk": "[UNK]",
    "pad": "[PAD]",
    "cls": "[CLS]",
    "sep": "[SEP]",
    "mask": "[MASK]",
    "bos": "<s>",
    "eos": "</s>",
}
VOCAB = 64

#: Our task names -> (optimum's task, the transformers class suffix).
TASKS = {
    "causal-lm": ("text-generation", "ForCausalLM"),
    "sequence-classification": ("text-classification", "ForSequenceClassification"),
    "token-classification": ("token-classification", "ForTokenClassification"),
    "masked-lm": ("fill-mask", "ForMaskedLM"),
}


def model_config(family: str, specials: list[str] = SPECIALS, **extra):
    """The class prefix and the config of a tiny ``family`` model (hidden 32, two layers, vocabulary
    64) whose pad, bos and eos ids are ``specials``' positions; ``extra`` goes into the config.
    """
    import transformers as tf

    ids = {"pad": "pad_token_id", "bos": "bos_token_id", "eos": "eos_token_id"}
    common = {"vocab_size": VOCAB, **{ids[r]: specials.index(ROLES[r]) for r in ids}, **extra}
    if family == "llama":
        return "Llama", tf.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False, **common,
        )  # fmt: skip
    if family == "qwen2":
        return "Qwen2", tf.Qwen2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, **common,
        )  # fmt: skip
    if family == "gpt2":
        return "GPT2", tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **common)
    if family == "bert":
        return "Bert", tf.BertConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, **common,
        )  # fmt: skip
    raise SystemExit(f"unknown family {family!r}: use llama, qwen2, gpt2 or bert")


def write_tokenizer(directory: Path, specials: list[str] = SPECIALS) -> None:
    """A word-level ``tokenizer.json`` (``specials``, then :data:`WORDS`) and its config."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate([*specials, *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128}
    settings |= {f"{role}_token": t for role, t in ROLES.items() if t in specials}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    request = json.load(sys.stdin)
    family, task, with_past = request["family"], request["task"], request["with_past"]
    out = Path(request["out"])
    import torch
    import transformers as tf
    from optimum.exporters.onnx import main_export

    prefix, config = model_config(family)
    optimum_task, suffix = TASKS[task]
    if with_past:
        optimum_task += "-with-past"
    torch.manual_seed(request.get("seed", 0))
    name = "GPT2LMHeadModel" if (family, task) == ("gpt2", "causal-lm") else prefix + suffix
    model = getattr(tf, name)(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        pretrained, exported = Path(tmp) / "pretrained", Path(tmp) / "exported"
        model.save_pretrained(pretrained, safe_serialization=True)
        write_tokenizer(pretrained)
        main_export(
            model_name_or_path=str(pretrained),
            output=str(exported),
            task=optimum_task,
            device="cpu",
            do_validation=False,
            no_post_process=True,
        )
        (out / "onnx").mkdir(parents=True, exist_ok=True)
        for item in exported.iterdir():
            into = out / "onnx" if item.name.startswith("model.onnx") else out
            shutil.copy2(item, into / item.name)
        for name in ("model.safetensors", "config.json", "generation_config.json"):
            if (pretrained / name).exists() and not (out / name).exists():
                shutil.copy2(pretrained / name, out / name)
    json.dump({"files": sorted(str(p.relative_to(out)) for p in out.rglob("*"))}, sys.stdout)


if __name__ == "__main__":
    main()

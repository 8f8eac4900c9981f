"""Real architectures for ``bench_portable.py``: torch models exported to ONNX (random init, no
downloads).

Each builder returns ``(torch module, example inputs, labels)``; :func:`export_model`
exports it with the TorchScript exporter (opset 17, training mode, dynamic batch) and
names the trainable initializers. The vision models are Hugging Face ``transformers``
configs (ResNet-18, MobileNetV2, EfficientNet-B0; torchvision's compiled ops do not
load against the CPU torch wheel here, so its models are not used), the language
models GPT-2, LLaMA and BERT configs scaled down, ViT at 64 px, and a 2-layer LSTM
classifier. Language models return ``[batch * seq, vocab]`` logits (cross-entropy,
class last).

Needs ``transformers`` (a benchmark dependency, not a test one), installed with the
pinned torch: ``pip install torch==2.13.0 transformers``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Image side and batch of the vision models; sequence length and batch of the language models.
IMAGE, IMAGE_BATCH = 64, 8
SEQ, TEXT_BATCH, VOCAB = 64, 4, 1000


def _torch():
    import torch

    return torch


def _logits_module(model, flatten: bool):
    """Wrap a Hugging Face model so it returns its logits (``[N, C]``: flattened over tokens when
    ``flatten``).
    """
    torch = _torch()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            out = self.model(x).logits
            return out.reshape(-1, out.shape[-1]) if flatten else out

    return Logits()


def _images(classes: int = 10):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((IMAGE_BATCH, 3, IMAGE, IMAGE)).astype(np.float32)
    return [x], rng.integers(0, classes, IMAGE_BATCH).astype(np.int64)


def _tokens():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (TEXT_BATCH, SEQ)).astype(np.int64)
    return [ids], rng.integers(0, VOCAB, TEXT_BATCH * SEQ).astype(np.int64)


def resnet18():
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        layer_type="basic",
        depths=[2, 2, 2, 2],
        hidden_sizes=[64, 128, 256, 512],
        embedding_size=64,
        num_labels=10,
    )
    return (_logits_module(ResNetForImageClassification(config), False), *_images())


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    config = MobileNetV2Config(image_size=IMAGE, num_labels=10, classifier_dropout_prob=0.0)
    return (_logits_module(MobileNetV2ForImageClassification(config), False), *_images())


def efficientnet_b0():
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    config = EfficientNetConfig(
        image_size=IMAGE, num_labels=10, dropout_rate=0.0, drop_connect_rate=0.0
    )
    model = EfficientNetForImageClassification(config)
    # its pooler is an AveragePool over a window as large as the map, whose gradient needs static
    # dims that the
    # exported graph lacks; a global average pool is the same function here
    model.efficientnet.pooler = _torch().nn.AdaptiveAvgPool2d(1)
    return (_logits_module(model, False), *_images())


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=IMAGE,
        patch_size=8,
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return (_logits_module(ViTForImageClassification(config), False), *_images())


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=128,
        n_layer=4,
        n_head=4,
        resid_pdrop=0,
        embd_pdrop=0,
        attn_pdrop=0,
    )
    return (_logits_module(GPT2LMHeadModel(config), True), *_tokens())


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
    )
    return (_logits_module(LlamaForCausalLM(config), True), *_tokens())


def bert():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return (_logits_module(BertForMaskedLM(config), True), *_tokens())


def lstm():
    torch = _torch()

    class LSTMClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(32, 128, num_layers=2, batch_first=True)
            self.fc = torch.nn.Linear(128, 10)

        def forward(self, x):
            return self.fc(self.lstm(x)[0][:, -1])

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32, 32)).astype(np.float32)
    return LSTMClassifier(), [x], rng.integers(0, 10, 16).astype(np.int64)


#: name -> builder.
REAL_MODELS: dict[str, Callable] = {
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "efficientnet_b0": efficientnet_b0,
    "vit": vit,
    "gpt2": gpt2,
    "llama": llama,
    "bert": bert,
    "lstm": lstm,
}


#: Exported with static shapes.
STATIC: set[str] = set()


def export_model(name: str):
    """``(onnx model, trainable initializer names, [*inputs, labels])`` of the real model
    ``name``.
    """
    import onnx
    from support.torch_export import quiet  # tests/ is on the path (bench_portable.py)

    torch = _torch()
    torch.manual_seed(0)
    module, inputs, labels = REAL_MODELS[name]()
    module.train()
    f = io.BytesIO()
    with quiet():
        torch.onnx.export(
            module,
            tuple(torch.from_numpy(a) for a in inputs),
            f,
            input_names=["input"],
            output_names=["logits"],
            dynamo=False,
            do_constant_folding=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            dynamic_axes=None if name in STATIC else {"input": {0: "batch"}},
        )
    model = onnx.load_from_string(f.getvalue())
    initializers = {i.name: i for i in model.graph.initializer}
    params = []
    for pname, param in module.named_parameters():
        if pname in initializers:
            params.append(pname)
            continue
        value = param.detach().numpy()
        same = [
            k
            for k, i in initializers.items()
            if tuple(i.dims) == value.shape and np.array_equal(onnx.numpy_helper.to_array(i), value)
        ]
        if len(same) == 1 and same[0] not in params:
            params.append(same[0])
    return model, params, [*inputs, labels]

"""Real architectures, tiny: Hugging Face configs (random init, no download) and an LSTM, for the exporter sweep.

``FAMILIES`` names them; ``make(name)`` gives a :class:`Family`: the torch model (dropout 0,
training mode), its inputs, the target and the loss its task uses (cross-entropy on logits,
class-last for language models; MSE on the main output for a model without a classification
head). ``export(family, exporter)`` exports it with TorchScript (``"ts"``, opset 17, training
mode) or dynamo (``"dynamo"``, opset 18). ``torch_losses`` trains a copy with torch's AdamW.

torchvision 0.28's compiled ops do not load against the CPU torch 2.13 here, so the
vision families are the transformers configs of the same architectures (ResNet,
MobileNetV2 for MobileNet, EfficientNet, ConvNeXt, Swin).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from torch import nn

from support.torch_export import export_onnx, initializer_names

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The families of the sweep, in order.
FAMILIES = (
    "llama",
    "qwen2",
    "mistral",
    "t5",
    "gpt2",
    "bert",
    "vit",
    "whisper",
    "wav2vec2",
    "resnet",
    "mobilenet",
    "efficientnet",
    "convnext",
    "swin",
    "lstm",
)
EXPORTERS = ("ts", "dynamo")
VOCAB, SEQ, BATCH, CLASSES = 32, 5, 2, 3


@dataclass
class Family:
    name: str
    model: nn.Module
    inputs: dict[str, np.ndarray]
    target: np.ndarray
    loss: str  # "ce" (classes on axis 1), "ce_last" (classes last: language models) or "mse"


class Logits(nn.Module):
    """A Hugging Face model returning one tensor: ``logits`` (or ``last_hidden_state``).

    A decoder gets an all-ones attention mask (without one, transformers looks for packed
    sequences with ``torch.diff``, which TorchScript's exporter lacks): ``masks`` maps the
    mask's argument to the input it is shaped like.
    """

    def __init__(self, model: nn.Module, names: list[str], masks: dict[str, str]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.masks = masks

    def forward(self, *args):
        kwargs = dict(zip(self.names, args, strict=True))
        for mask, like in self.masks.items():
            kwargs[mask] = torch.ones_like(kwargs[like])
        out = self.model(**kwargs, return_dict=True)
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def decoder_lm(kind: str, **sizes: int) -> nn.Module:
    """A random-init one-layer ``kind`` (llama, qwen2, mistral) causal LM, small unless ``sizes``
    (config fields: ``hidden_size``, ``vocab_size``...) say otherwise.
    """
    t = _transformers()
    config_class, model_class = {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM),
        "mistral": (t.MistralConfig, t.MistralForCausalLM),
    }[kind]
    small = {
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 16,
        "use_cache": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
    }
    return model_class(config_class(**(small | sizes)))


def _builders() -> dict[str, Callable[[np.random.Generator], Family]]:
    t = _transformers()
    tokens = lambda rng: rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)  # noqa: E731
    image = lambda rng, size=16: rng.standard_normal((BATCH, 3, size, size)).astype(np.float32)  # noqa: E731
    classes = lambda rng: rng.integers(0, CLASSES, (BATCH,)).astype(np.int64)  # noqa: E731

    def lm(kind):
        return lambda rng: Family(
            kind, decoder_lm(kind), {"input_ids": tokens(rng)}, tokens(rng), "ce_last"
        )

    def t5(rng):
        config = t.T5Config(
            vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
            dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
        )  # fmt: skip
        inputs = {"input_ids": tokens(rng), "decoder_input_ids": tokens(rng)}
        return Family("t5", t.T5ForConditionalGeneration(config), inputs, tokens(rng), "ce_last")

    def gpt2(rng):
        config = t.GPT2Config(
            vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, use_cache=False,
        )  # fmt: skip
        return Family(
            "gpt2", t.GPT2LMHeadModel(config), {"input_ids": tokens(rng)}, tokens(rng), "ce_last"
        )

    def bert(rng):
        config = t.BertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=CLASSES,
        )  # fmt: skip
        return Family(
            "bert",
            t.BertForSequenceClassification(config),
            {"input_ids": tokens(rng)},
            classes(rng),
            "ce",
        )

    def vit(rng):
        config = t.ViTConfig(
            image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=CLASSES,
        )  # fmt: skip
        model = t.ViTForImageClassification(config)
        return Family("vit", model, {"pixel_values": image(rng, 8)}, classes(rng), "ce")

    def whisper(rng):
        config = t.WhisperConfig(
            vocab_size=VOCAB, num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            max_source_positions=8, max_target_positions=8, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1,
        )  # fmt: skip
        features = rng.standard_normal((BATCH, 8, 16)).astype(np.float32)
        inputs = {"input_features": features, "decoder_input_ids": tokens(rng)}
        return Family(
            "whisper", t.WhisperForConditionalGeneration(config), inputs, tokens(rng), "ce_last"
        )

    def wav2vec2(rng):
        config = t.Wav2Vec2Config(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2, hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
            feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, apply_spec_augment=False, mask_time_prob=0.0,
        )  # fmt: skip
        audio = rng.standard_normal((BATCH, 160)).astype(np.float32)
        model = t.Wav2Vec2Model(config)
        frames = 15  # (160 - 10) // 5 + 1 = 31, then (31 - 3) // 2 + 1 = 15
        return Family(
            "wav2vec2",
            model,
            {"input_values": audio},
            rng.standard_normal((BATCH, frames, 16)).astype(np.float32),
            "mse",
        )

    def resnet(rng):
        config = t.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            num_labels=CLASSES,
        )  # fmt: skip
        return Family(
            "resnet",
            t.ResNetForImageClassification(config),
            {"pixel_values": image(rng, 32)},
            classes(rng),
            "ce",
        )

    def mobilenet(rng):
        config = t.MobileNetV2Config(
            num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=CLASSES, classifier_dropout_prob=0.0,
        )  # fmt: skip
        model = t.MobileNetV2ForImageClassification(config)
        return Family("mobilenet", model, {"pixel_values": image(rng, 32)}, classes(rng), "ce")

    def efficientnet(rng):
        config = t.EfficientNetConfig(
            num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
            dropout_rate=0.0, drop_connect_rate=0.0, num_labels=CLASSES,
        )  # fmt: skip
        model = t.EfficientNetForImageClassification(config)
        # torchvision's efficientnet_b0 pools globally; transformers' AvgPool2d(hidden_dim, ceil_mode=True) is a
        # pool wider than the image, which ORT's AveragePoolGrad cannot take behind TorchScript's unfolded pads
        model.efficientnet.pooler = nn.AdaptiveAvgPool2d(1)
        return Family("efficientnet", model, {"pixel_values": image(rng, 32)}, classes(rng), "ce")

    def convnext(rng):
        config = t.ConvNextConfig(
            num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2, num_labels=CLASSES,
            drop_path_rate=0.0,
        )  # fmt: skip
        return Family(
            "convnext",
            t.ConvNextForImageClassification(config),
            {"pixel_values": image(rng)},
            classes(rng),
            "ce",
        )

    def swin(rng):
        config = t.SwinConfig(
            image_size=16, patch_size=2, num_channels=3, embed_dim=8, depths=[1, 1], num_heads=[1, 2],
            window_size=2, mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0, num_labels=CLASSES,
        )  # fmt: skip
        return Family(
            "swin",
            t.SwinForImageClassification(config),
            {"pixel_values": image(rng)},
            classes(rng),
            "ce",
        )

    def lstm(rng):
        x = rng.standard_normal((BATCH, 4, 4)).astype(np.float32)
        return Family("lstm", LSTMClassifier(), {"x": x}, classes(rng), "ce")

    return {
        "llama": lm("llama"), "qwen2": lm("qwen2"), "mistral": lm("mistral"), "t5": t5, "gpt2": gpt2,
        "bert": bert, "vit": vit, "whisper": whisper, "wav2vec2": wav2vec2, "resnet": resnet,
        "mobilenet": mobilenet, "efficientnet": efficientnet, "convnext": convnext, "swin": swin, "lstm": lstm,
    }  # fmt: skip


#: The all-ones masks each family's wrapper passes (argument -> the input it is shaped like).
_MASKS = {
    "llama": {"attention_mask": "input_ids"},
    "qwen2": {"attention_mask": "input_ids"},
    "mistral": {"attention_mask": "input_ids"},
    "gpt2": {"attention_mask": "input_ids"},
    "whisper": {"decoder_attention_mask": "decoder_input_ids"},
}


def make(name: str) -> Family:
    """The family ``name`` (the same weights and data every call)."""
    torch.manual_seed(0)
    family = _builders()[name](np.random.default_rng(0))
    if name != "lstm":
        family.model.set_attn_implementation(
            "eager"
        )  # dynamo's decompositions fail on some SDPA paths (T5, Swin)
        family.model = Logits(family.model, list(family.inputs), _MASKS.get(name, {}))
    family.model.train()
    return family


def export(family: Family, exporter: str, dynamic: bool = False) -> onnx.ModelProto:
    """The ONNX export of ``family.model`` (training mode; a copy is exported, the model is not changed).

    ``dynamic`` (TorchScript only): the first two dims of every input and of the output are symbolic
    (``batch``, ``seq``), as a model exported for deployment has them.
    """
    model = copy.deepcopy(family.model).train()
    if exporter == "ts":
        names = [*family.inputs, "output"]
        axes = {n: {0: "batch", 1: "seq"} for n in names} if dynamic else None
        return export_onnx(model, family.inputs, dynamo=False, opset=17, dynamic_axes=axes)
    return export_onnx(model, family.inputs, dynamo=True, opset=18)


def trainable(family: Family, model: onnx.ModelProto) -> dict[str, str]:
    """torch parameter name -> initializer name, for every parameter the export kept as an initializer."""
    return initializer_names(family.model, model, strict=False)


#: Families whose 5-step trajectories are chaotic at these tiny sizes: MobileNetV2 (batch 2, 32 px, a batch norm
#: after every convolution) diverges by 1-30% from step 1 or 2 between any two implementations: torch against
#: the training build, the training build against stock onnxruntime, and at 64-128 px or batch 4-8 too. Its
#: first-step gradients differ from torch's by up to 6% of a tensor's largest element, on the training build as
#: in the portable artifacts (cause not found yet). The sweep checks its first loss and that it trains.
CHAOTIC = frozenset({"mobilenet"})


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 for the block: these models are tiny, and with the other
    xdist worker on the second core torch's OpenMP threads wait on each other (EfficientNet's five
    steps: 7 s of CPU in float32 and 20 s in float64 with 2 threads under load, 0.2 and 0.3 s with
    1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@one_torch_thread()
def with_gradient(
    family: Family, params: dict[str, str], threshold: float = 1e-5
) -> dict[str, str]:
    """``params`` without those whose torch gradient at the first step is rounding noise (below ``threshold``
    times the largest gradient): zero in exact arithmetic, e.g. a batch norm's bias that a later batch norm
    cancels (MobileNetV2). AdamW normalises any gradient to a step of ``lr``, so such a parameter moves by the
    noise's sign, which differs between torch's and ONNX Runtime's kernels; it is left untrained on both sides
    (left as a constant of the graph).
    """
    model = copy.deepcopy(family.model).train()
    torch_loss(family, model(*[torch.from_numpy(v) for v in family.inputs.values()])).backward()
    named = dict(model.named_parameters())
    peak = {
        n: float(named[n].grad.abs().max()) if named[n].grad is not None else 0.0 for n in params
    }
    largest = max(peak.values())
    return {n: o for n, o in params.items() if peak[n] > threshold * largest}


def onnxblocks_loss(family: Family):
    """The onnxblocks loss of ``family`` (a Block)."""
    from onnxblocks import losses

    if family.loss == "mse":
        return losses.MSELoss()
    return losses.CrossEntropyLoss(class_axis=-1 if family.loss == "ce_last" else 1)


def torch_loss(family: Family, output: torch.Tensor) -> torch.Tensor:
    target = torch.from_numpy(family.target)
    if family.loss == "mse":
        return nn.functional.mse_loss(output, target)
    if family.loss == "ce_last":
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return nn.functional.cross_entropy(output, target)


@one_torch_thread()
def torch_losses(family: Family, params: list[str], steps: int, lr: float) -> list[float]:
    """The losses of ``steps`` steps of torch's AdamW (defaults but ``lr``) on ``params``, from the family's weights."""
    model = copy.deepcopy(family.model).train()
    named = dict(model.named_parameters())
    for name, p in named.items():
        p.requires_grad_(name in params)
    optimizer = torch.optim.AdamW([named[n] for n in params], lr=lr)
    inputs = [torch.from_numpy(v) for v in family.inputs.values()]
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch_loss(family, model(*inputs))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses

"""LoRA adapters on exported models, compatible with Hugging Face PEFT (docs/lora.md).

The package sits beside ``losses`` and ``optim``: it edits graphs through :mod:`onnxblocks.ir`
(loaded on first use, so ``import onnxblocks.peft`` stays light) and knows nothing of the runtime.
"""

from onnxblocks.peft.config import LoraConfig
from onnxblocks.peft.info import LoraInfo, LoraTarget, lora_info
from onnxblocks.peft.transform import apply_lora

__all__ = [
    "LoraConfig",
    "LoraInfo",
    "LoraTarget",
    "apply_lora",
    "lora_info",
]

"""LoRA adapters on exported models, compatible with Hugging Face PEFT (docs/lora.md).

The package sits beside ``losses`` and ``optim``: it edits graphs through :mod:`onnxblocks.ir`
and knows nothing of the runtime.
"""

from onnxblocks.peft.config import LoraConfig
from onnxblocks.peft.info import LoraInfo, LoraTarget, lora_info

__all__ = [
    "LoraConfig",
    "LoraInfo",
    "LoraTarget",
    "lora_info",
]

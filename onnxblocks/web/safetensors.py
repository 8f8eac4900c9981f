"""The safetensors format of the web state: it lives in :mod:`onnxblocks.safetensors` (PEFT files
use it too).
"""

from __future__ import annotations

from onnxblocks.safetensors import DTYPES, MAX_HEADER_BYTES, read_safetensors, write_safetensors

__all__ = ["DTYPES", "MAX_HEADER_BYTES", "read_safetensors", "write_safetensors"]

"""From a Hugging Face hub folder (Optimum / Transformers.js layout) to training artifacts and back.

docs/hub.md describes the road: :func:`from_hub` generates artifacts from a hub folder, the
:class:`HubRecord` (``hub.json``) remembers where they came from.
"""

from __future__ import annotations

from onnxblocks.hub.generate import from_hub
from onnxblocks.hub.losses import ShiftedCrossEntropyLoss
from onnxblocks.hub.record import TASKS, HubRecord, has_record, read_record, write_record
from onnxblocks.hub.text import TextBatches, empty_past, load_tokenizer

__all__ = [
    "TASKS",
    "HubRecord",
    "ShiftedCrossEntropyLoss",
    "TextBatches",
    "empty_past",
    "from_hub",
    "has_record",
    "load_tokenizer",
    "read_record",
    "write_record",
]

"""One export per process for tests that train the same exported model in several cases.

A dynamo export costs 3-5 s of CPU (a TorchScript one a few tenths) and gives the same graph for the
same module, weights and inputs, so the cases of a module that differ only in what they do with the
graph (backend, recomputation, LoRA or frozen parameters) share one: :func:`shared_export` builds it on
first use and hands every caller its own copy, so a case that edits its model changes no other case's.
Keys are chosen by the calling module and start with its name.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import onnx

_EXPORTS: dict[Hashable, onnx.ModelProto] = {}


def shared_export(key: Hashable, build: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """A copy of ``build()``, which runs once per process for ``key``."""
    if key not in _EXPORTS:
        _EXPORTS[key] = build()
    copy = onnx.ModelProto()
    copy.CopyFrom(_EXPORTS[key])
    return copy

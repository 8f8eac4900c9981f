"""The loss and optimizer ``generate_artifacts`` is given: built-in ones by name
(:class:`LossType`, :class:`OptimType`), or blocks, checked and turned into blocks.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

from onnxblocks import losses, optim
from onnxblocks._core.errors import InvalidTypeError
from onnxblocks.artifacts import arguments as _arguments
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.structural import PassThrough

logger = logging.getLogger(__name__)


class LossType(enum.Enum):
    """Built-in losses for ``generate_artifacts(loss=...)``.

    The first four have the reference's values; the others are onnxblocks additions.
    """

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4
    HuberLoss = 5
    SmoothL1Loss = 6
    NLLLoss = 7
    KLDivLoss = 8


class OptimType(enum.Enum):
    """Built-in optimizers for ``generate_artifacts(optimizer=...)``."""

    AdamW = 1
    SGD = 2


def loss_block(loss: LossType) -> Block:
    """The built-in loss ``loss`` names, with its defaults."""
    block: Block = getattr(losses, loss.name)()
    return block


def optimizer_block(optimizer: OptimType) -> Block:
    """The built-in optimizer ``optimizer`` names, with torch's defaults."""
    return {OptimType.AdamW: optim.AdamW, OptimType.SGD: optim.SGD}[optimizer]()


def resolve_loss(loss: Any, loss_blocks: Callable[[LossType], Block]) -> Block:
    """The loss block of ``generate_artifacts(loss=...)`` (None: the base's first output).

    Raises:
        InvalidTypeError: for anything but a LossType, a Block instance or None.
    """
    if loss is None:
        logger.info("No loss given: the base model's first output is the loss.")
        return PassThrough()
    loss = _arguments.same_named_enum(loss, LossType)
    if isinstance(loss, LossType):
        return loss_blocks(loss)
    if isinstance(loss, Block):
        return loss
    if isinstance(loss, type) and issubclass(loss, Block):
        raise InvalidTypeError(
            f"loss must be a Block instance, not the class {loss.__name__}: pass {loss.__name__}()."
        )
    raise InvalidTypeError(
        f"loss must be a LossType ({', '.join(m.name for m in LossType)}), an onnxblocks Block, "
        "or None; "
        f"got {type(loss).__name__}: {loss!r}."
    )


def resolve_optimizer(
    optimizer: Any, optimizer_blocks: Callable[[OptimType], Block]
) -> Block | None:
    """The optimizer block of ``generate_artifacts(optimizer=...)``, or None.

    Raises:
        InvalidTypeError: for anything but an OptimType, an optimizer Block instance or None.
    """
    if optimizer is None:
        return None
    optimizer = _arguments.same_named_enum(optimizer, OptimType)
    if isinstance(optimizer, OptimType):
        return optimizer_blocks(optimizer)
    if isinstance(optimizer, Block) and hasattr(optimizer, "to_model_proto"):
        return optimizer
    if isinstance(optimizer, type) and issubclass(optimizer, Block):
        raise InvalidTypeError(
            f"optimizer must be a Block instance, not the class {optimizer.__name__}: pass "
            f"{optimizer.__name__}()."
        )
    raise InvalidTypeError(
        f"optimizer must be an OptimType ({', '.join(m.name for m in OptimType)}), an optimizer "
        "ForwardBlock "
        f"(e.g. onnxblocks.optim.AdamW()), or None; got {type(optimizer).__name__}: {optimizer!r}."
    )


__all__ = [
    "LossType",
    "OptimType",
    "loss_block",
    "optimizer_block",
    "resolve_loss",
    "resolve_optimizer",
]

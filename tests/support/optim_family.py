"""The torch.optim family cells the optimizer tests share: each algorithm with each option set.

``CASES`` lists (our class, torch's class, options); ``tests/optim/test_torch_family.py``
runs them through the optimizer model on fixed gradients and
``tests/optim/test_optimizers_node.py`` trains an MLP with them in Node. Both use two
parameter groups, the second with ``GROUP_LR_SCALE`` x the base learning rate (absolute,
as torch spells it) and its own ``GROUP_WEIGHT_DECAY``, under a changing learning rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnxblocks import optim

GROUP_LR_SCALE = 2.5
GROUP_WEIGHT_DECAY = 0.03

CASES: list[tuple[type, type, dict[str, Any]]] = [
    (optim.SGD, torch.optim.SGD, {}),
    (optim.SGD, torch.optim.SGD, {"momentum": 0.9}),
    (optim.SGD, torch.optim.SGD, {"momentum": 0.9, "dampening": 0.3}),
    (optim.SGD, torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    (optim.SGD, torch.optim.SGD, {"weight_decay": 0.1}),
    (optim.SGD, torch.optim.SGD, {"momentum": 0.5, "weight_decay": 0.05, "maximize": True}),
    (optim.Adam, torch.optim.Adam, {}),
    (optim.Adam, torch.optim.Adam, {"amsgrad": True}),
    (optim.Adam, torch.optim.Adam, {"weight_decay": 0.1, "betas": (0.8, 0.99), "eps": 1e-6}),
    (optim.Adam, torch.optim.Adam, {"maximize": True, "amsgrad": True}),
    (optim.AdamW, torch.optim.AdamW, {"amsgrad": True}),
    (optim.AdamW, torch.optim.AdamW, {"weight_decay": 0.1, "maximize": True}),
    (optim.AdamW, torch.optim.AdamW, {}),
    (optim.Adagrad, torch.optim.Adagrad, {}),
    (optim.Adagrad, torch.optim.Adagrad, {"lr_decay": 0.1}),
    (optim.Adagrad, torch.optim.Adagrad, {"initial_accumulator_value": 0.5, "eps": 1e-6}),
    (optim.Adagrad, torch.optim.Adagrad, {"weight_decay": 0.1, "maximize": True}),
    (optim.RMSprop, torch.optim.RMSprop, {}),
    (optim.RMSprop, torch.optim.RMSprop, {"momentum": 0.9}),
    (optim.RMSprop, torch.optim.RMSprop, {"centered": True, "alpha": 0.9}),
    (optim.RMSprop, torch.optim.RMSprop, {"centered": True, "momentum": 0.5, "weight_decay": 0.1}),
    (optim.RMSprop, torch.optim.RMSprop, {"maximize": True, "eps": 1e-4}),
]


def case_id(case: tuple[type, type, dict[str, Any]]) -> str:
    """``SGD-momentum=0.9-nesterov=True``: a readable, unique name of one cell."""
    ours, _, options = case
    return "-".join([ours.__name__, *(f"{k}={v}" for k, v in options.items())]).replace(" ", "")


def ours(cls: type, options: dict[str, Any], base_lr: float, second: list[str]) -> optim.Optimizer:
    """Our optimizer of one cell: the second group named by ``second``."""
    group = {"params": second, "lr": GROUP_LR_SCALE * base_lr, "weight_decay": GROUP_WEIGHT_DECAY}
    return cls(lr=base_lr, param_groups=[group], **options)


def theirs(
    cls: type, options: dict[str, Any], base_lr: float, first: list, second: list
) -> torch.optim.Optimizer:
    """torch's optimizer of one cell over the two groups of tensors."""
    group = {"params": second, "lr": GROUP_LR_SCALE * base_lr, "weight_decay": GROUP_WEIGHT_DECAY}
    return cls([{"params": first}, group], lr=base_lr, **options)


def step_magnitudes(start: np.ndarray, values64: list[np.ndarray]) -> list[np.ndarray]:
    """The magnitude of the terms a value has summed by each step: ``|x_0| + sum_k |x_k - x_(k-1)|`` (float64).

    A parameter after ``k`` optimizer steps is its start plus ``k`` updates; another summation order or kernel
    rounds each of those terms, so the floor of ``assert_close(..., scale=...)`` is their summed magnitude, not
    the value itself, which a run of updates may bring near zero.
    """
    previous = np.asarray(start, np.float64)
    total = np.abs(previous)
    out = []
    for value in values64:
        value = np.asarray(value, np.float64)
        total = total + np.abs(value - previous)
        previous = value
        out.append(total)
    return out


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set the session's learning rate (a float32, as ours feeds it) on torch's groups, keeping the ratio."""
    for group, scale in zip(opt.param_groups, (1.0, GROUP_LR_SCALE), strict=True):
        group["lr"] = float(np.float32(lr)) * scale

"""Float64 references for ``support.numerics.assert_close``: models run in float64, and operands' magnitudes.

* :func:`to64` / :func:`family64`: a torch model, its inputs and a Hugging Face family (``support.hf_families``)
  in float64 (integer inputs stay), to run the same reference twice: in the tested dtype and in float64.
* :func:`gradient_magnitudes`: the floor's ``scale`` of a parameter gradient. A gradient is a sum of products
  over the batch (and the positions a convolution slides over): ``dW = sum g x``. Another kernel adds those
  terms in another order, so two results may differ by a few ``eps * sum |g x|``: the floor is that sum, not
  the gradient itself, which can cancel to zero (a convolution's bias before a training-mode BatchNorm has a
  gradient of exactly zero, made of terms of order one). It runs the torch model in float64 and, for each
  parameter of a ``Linear``, a convolution, a normalization (batch, instance, group, layer) or an
  ``Embedding``, sums ``|g| * |x|`` over the same terms its gradient sums. Parameters of other modules are
  left out (``scale=None`` then falls back to the tensor's own magnitude).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def to64(value: Any) -> Any:
    """A float64 copy of a module, tensor or NumPy array; integers and other values unchanged."""
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).double()
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return value.astype(np.float64)
    return value


def family64(family: Any) -> Any:
    """A ``support.hf_families.Family`` (or any dataclass with ``model``, ``inputs``, ``target``) in float64."""
    return dataclasses.replace(
        family,
        model=to64(family.model),
        inputs={k: to64(v) for k, v in family.inputs.items()},
        target=to64(family.target),
    )


_CONV_WEIGHT_GRAD = {
    1: torch.nn.grad.conv1d_weight,
    2: torch.nn.grad.conv2d_weight,
    3: torch.nn.grad.conv3d_weight,
}


def _channels_last(t: torch.Tensor, channel: int) -> torch.Tensor:
    return t.movedim(channel, -1).reshape(-1, t.shape[channel])


def _normalized(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``|x - mean| / sqrt(var + eps)`` as the module's forward computes it."""
    if isinstance(module, torch.nn.LayerNorm):
        dims = tuple(range(-len(module.normalized_shape), 0))
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, unbiased=False, keepdim=True)
        return ((x - mean) / torch.sqrt(var + module.eps)).abs()
    if isinstance(module, torch.nn.GroupNorm):
        grouped = x.reshape(x.shape[0], module.num_groups, -1)
        mean = grouped.mean(-1, keepdim=True)
        var = grouped.var(-1, unbiased=False, keepdim=True)
        return ((grouped - mean) / torch.sqrt(var + module.eps)).abs().reshape(x.shape)
    shape = [1, -1] + [1] * (x.dim() - 2)
    if isinstance(module, torch.nn.modules.instancenorm._InstanceNorm):
        dims = tuple(
            range(2, x.dim())
        )  # per sample and channel (running statistics are for eval only)
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, unbiased=False, keepdim=True)
    elif module.training or module.running_mean is None:
        dims = tuple(d for d in range(x.dim()) if d != 1)
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, unbiased=False, keepdim=True)
    else:
        mean, var = module.running_mean.view(shape), module.running_var.view(shape)
    return ((x - mean) / torch.sqrt(var + module.eps)).abs()


def _terms(module: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per parameter of ``module``, the sum of ``|terms|`` of its gradient for one call (input x, grad g)."""
    g = g.abs()
    if isinstance(module, torch.nn.Linear):
        g2, x2 = g.reshape(-1, g.shape[-1]), x.abs().reshape(-1, x.shape[-1])
        return {"weight": g2.T @ x2, "bias": g2.sum(0)}
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        weight = _CONV_WEIGHT_GRAD[x.dim() - 2](
            x.abs(),
            module.weight.shape,
            g,
            module.stride,
            module.padding,
            module.dilation,
            module.groups,
        )
        return {"weight": weight, "bias": _channels_last(g, 1).sum(0)}
    if isinstance(module, torch.nn.LayerNorm):
        shape = tuple(module.normalized_shape)
        xhat = _normalized(module, x)
        return {
            "weight": (g * xhat).reshape(-1, *shape).sum(0),
            "bias": g.reshape(-1, *shape).sum(0),
        }
    if isinstance(module, _CHANNEL_NORMS):
        xhat = _normalized(module, x)
        return {"weight": _channels_last(g * xhat, 1).sum(0), "bias": _channels_last(g, 1).sum(0)}
    rows = torch.zeros_like(module.weight)  # Embedding: the rows its indices picked
    return {"weight": rows.index_add(0, x.reshape(-1).long(), g.reshape(-1, g.shape[-1]))}


_CHANNEL_NORMS = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.GroupNorm,
)
_HANDLED = (
    torch.nn.Linear,
    torch.nn.modules.conv._ConvNd,
    *_CHANNEL_NORMS,
    torch.nn.LayerNorm,
    torch.nn.Embedding,
)


def gradient_magnitudes(
    model: torch.nn.Module,
    inputs: Sequence[Any],
    target: Any,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> dict[str, np.ndarray]:
    """Per parameter name, the sum of ``|terms|`` of its gradient, from a float64 copy of ``model``.

    ``inputs`` and ``target`` are NumPy arrays or tensors (floats run in float64, integers stay; ``target`` may
    be a list of them); the model keeps its train/eval mode. Parameters of modules this does not know are absent.
    """
    model64 = to64(model)

    def as64(value: Any) -> Any:
        if isinstance(value, list | tuple):  # several targets
            return [as64(v) for v in value]
        return to64(
            value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        )

    calls: list[tuple[str, torch.nn.Module, torch.Tensor, list[torch.Tensor]]] = []
    handles = []
    for prefix, module in model64.named_modules():
        if not isinstance(module, _HANDLED) or isinstance(
            module, torch.nn.modules.conv._ConvTransposeNd
        ):
            continue

        def forward_hook(mod, args, output, prefix=prefix):
            grads: list[torch.Tensor] = []
            calls.append((prefix, mod, args[0].detach(), grads))
            output.register_hook(lambda g: grads.append(g.detach()))

        handles.append(module.register_forward_hook(forward_hook))
    try:
        value = loss(model64(*[as64(v) for v in inputs]), as64(target))
        value.backward()
    finally:
        for handle in handles:
            handle.remove()
    totals: dict[str, torch.Tensor] = {}
    for prefix, module, x, grads in calls:
        if not grads:
            continue
        for local, magnitude in _terms(module, x, grads[0]).items():
            if getattr(module, local, None) is None:
                continue
            name = f"{prefix}.{local}" if prefix else local
            totals[name] = totals.get(name, 0) + magnitude
    return {name: t.numpy() for name, t in totals.items()}

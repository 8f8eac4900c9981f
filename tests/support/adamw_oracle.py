"""torch eager AdamW on the hand-written portable linear model (``portable_linear``): the reference its steps track."""

from __future__ import annotations

import torch

from support import portable_linear as pl


def torch_adamw(batches, lr=1e-3, accumulate=1, dtype=torch.float32):
    """Losses and final parameters of torch eager AdamW on the linear model (``accumulate`` batches per step).

    ``dtype=torch.float64`` runs the same steps in float64: the reference ``support.numerics`` compares with.
    """
    params = {
        n: torch.tensor(v, dtype=dtype, requires_grad=True)
        for n, v in pl.initial_parameters().items()
    }
    opt = torch.optim.AdamW(
        params.values(), lr=lr, betas=pl.BETAS, eps=pl.EPS, weight_decay=pl.WEIGHT_DECAY
    )
    losses = []
    for i, (x, t) in enumerate(batches):
        x, t = torch.from_numpy(x).to(dtype), torch.from_numpy(t).to(dtype)
        loss = ((x @ params["W"] + params["b"] - t) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
    return losses, {n: p.detach().numpy() for n, p in params.items()}

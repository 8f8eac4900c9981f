"""torch + PEFT as the oracle of onnxblocks' LoRA: the same base weights, the same initial adapters, AdamW.

``peft_model(family, config, adapters)`` injects PEFT's LoRA layers into a copy of the family's
torch model (the module paths are the exported graph's, ``model.model.layers.0.self_attn.q_proj``
under ``hf_families.Logits``) and copies onnxblocks' initial adapters into them;
``peft_steps`` trains the adapters with ``torch.optim.AdamW`` and returns the losses and the final
adapters, by onnxblocks' initializer names; ``assert_steps_match_peft`` trains an artifact
directory's session the same steps and compares both with PEFT's float32 and float64 runs.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from onnxblocks.peft import LoraConfig, LoraInfo
from onnxblocks.runtime import TrainingSession
from support import hf_families
from support.numerics import check_close
from support.reference64 import family64


def peft_config(config: LoraConfig):
    """The ``peft.LoraConfig`` of ``config`` (built from what onnxblocks writes in adapter_config.json)."""
    import peft

    data = config.to_peft_dict()
    keys = (
        "r",
        "lora_alpha",
        "target_modules",
        "exclude_modules",
        "lora_dropout",
        "fan_in_fan_out",
        "bias",
    )
    return peft.LoraConfig(
        **{k: data[k] for k in keys}, init_lora_weights=data["init_lora_weights"]
    )


def peft_model(
    family: hf_families.Family, info: LoraInfo, adapters: dict[str, np.ndarray]
) -> torch.nn.Module:
    """A copy of ``family.model`` with PEFT's LoRA layers, holding ``adapters`` (onnxblocks' names -> values).

    Only the adapters require grad.
    """
    import peft

    model = copy.deepcopy(family.model).train()
    model = peft.inject_adapter_in_model(peft_config(info.config), model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    injected = sorted(
        n for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)
    )
    assert injected == sorted(info.targets), (
        f"PEFT adapted {injected}, onnxblocks {sorted(info.targets)}"
    )
    with torch.no_grad():
        for module, target in info.targets.items():
            layer = model.get_submodule(module)
            layer.lora_A["default"].weight.copy_(torch.from_numpy(adapters[target.lora_A]))
            layer.lora_B["default"].weight.copy_(torch.from_numpy(adapters[target.lora_B]))
    return model


def peft_steps(
    family: hf_families.Family,
    info: LoraInfo,
    adapters: dict[str, np.ndarray],
    steps: int,
    lr: float,
) -> tuple[list[float], dict[str, np.ndarray]]:
    """``steps`` steps of torch's AdamW (defaults but ``lr``) on the adapters: the losses and the final adapters."""
    model = peft_model(family, info, adapters)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    inputs = [torch.from_numpy(v) for v in family.inputs.values()]
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = hf_families.torch_loss(family, model(*inputs))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    final = {}
    for module, target in info.targets.items():
        layer = model.get_submodule(module)
        final[target.lora_A] = layer.lora_A["default"].weight.detach().numpy().copy()
        final[target.lora_B] = layer.lora_B["default"].weight.detach().numpy().copy()
    return losses, final


def assert_steps_match_peft(
    family: hf_families.Family,
    directory,
    info: LoraInfo,
    *,
    steps: int,
    lr: float,
    rtol: float,
    adapter_rtol: float | None = None,
) -> None:
    """``steps`` AdamW steps of the session at ``directory`` on ``family``'s batch: PEFT's loss
    falls, and the losses (``rtol``) and the final adapters (``adapter_rtol``, else ``rtol``)
    match torch + PEFT from the session's initial adapters, or PEFT's float32-vs-float64 distance.
    """
    session = TrainingSession(directory)
    session.learning_rate = lr
    initial = session.parameters()
    batch = [*family.inputs.values(), family.target]
    losses = [float(np.asarray(session.train_and_update(*batch)[0])) for _ in range(steps)]
    (want, adapters32), (want64, adapters64) = (
        peft_steps(family, info, initial, steps, lr),
        peft_steps(family64(family), info, initial, steps, lr),
    )
    assert want[-1] < want[0]
    reports = [check_close(np.float32(losses), np.float32(want), want64, rtol=rtol, name="losses")]
    final = session.parameters()
    bound = rtol if adapter_rtol is None else adapter_rtol
    for name, value in adapters32.items():
        reports.append(check_close(final[name], value, adapters64[name], rtol=bound, name=name))
    problems = [r for r in reports if r is not None]
    assert not problems, "\n".join(problems)

"""LoRA parity with Hugging Face PEFT: 10 AdamW steps on LLaMA, Qwen2, GPT-2 and BERT, from both exporters.

Each cell exports a tiny transformers config (random init, ``support.hf_families``), writes
``generate_artifacts(..., lora=LoraConfig(...))`` and trains the adapters 10 steps on one batch.
torch + PEFT (``peft.inject_adapter_in_model`` on the same module tree, so the module paths are
the graph's) starts from the same base weights and onnxblocks' initial adapters (copied in), and
trains with ``torch.optim.AdamW``, in float32 and in float64 (``support.numerics``). The losses and the
adapters after 10 steps match within 1e-4 relative, or within PEFT's own float32-vs-float64 distance: on
the training build here, and on stock onnxruntime under Python 3.13 (the portable artifacts, one worker
call for every cell).
"""

from __future__ import annotations

import numpy as np
import pytest
from support import hf_families
from support.export_cache import shared_export
from support.numerics import check_close
from support.peft_parity import peft_steps
from support.portable_env import run_worker
from support.reference64 import family64

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

STEPS, LR = 10, 1e-2
#: PEFT's usual targets per family: attention query and value (GPT-2's fused c_attn, a Conv1D).
CONFIGS = {
    "llama": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "qwen2": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "gpt2": LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True),
    "bert": LoraConfig(r=4, lora_alpha=16, target_modules=["query", "value"]),
}
CELLS = [(f, e) for f in CONFIGS for e in hf_families.EXPORTERS]


def _artifacts(
    name: str, exporter: str, directory, portable: bool = False, config: LoraConfig | None = None
):
    family = hf_families.make(name)
    # the training build's and the portable cells train the same export
    model = shared_export((__name__, name, exporter), lambda: hf_families.export(family, exporter))
    artifacts = generate_artifacts(
        model,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        lora=config or CONFIGS[name],
        portable=portable,
    )
    info = lora_info(artifacts.training_model)
    assert info is not None
    assert artifacts.requires_grad == info.adapter_names and artifacts.frozen_params == ()
    return family, artifacts, info


def _peft(family, info, initial) -> tuple:
    """torch + PEFT's losses and final adapters, in float32 and in float64."""
    return peft_steps(family, info, initial, STEPS, LR), peft_steps(
        family64(family), info, initial, STEPS, LR
    )


def _check(label, losses, adapters, reference, reference64) -> list[str]:
    (expected_losses, expected_adapters), (losses64, adapters64) = reference, reference64
    losses, expected_losses = np.float32(losses), np.float32(expected_losses)
    reports = [
        check_close(
            losses, expected_losses, losses64, rtol=1e-4, name=f"{label}: losses against PEFT"
        )
    ]
    for name, value in expected_adapters.items():
        reports.append(
            check_close(adapters[name], value, adapters64[name], rtol=1e-4, name=f"{label}: {name}")
        )
    return [r for r in reports if r is not None]


ALL_LINEAR = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")


@pytest.mark.parametrize(
    ("name", "exporter", "config"),
    [pytest.param(*c, None, id=f"{c[0]}-{c[1]}") for c in CELLS]
    + [pytest.param("llama", "dynamo", ALL_LINEAR, id="llama-dynamo-all-linear")],
)
def test_training_build_matches_peft(name, exporter, config, tmp_path):
    family, artifacts, info = _artifacts(name, exporter, tmp_path, config=config)
    if config is ALL_LINEAR:  # every projection of the block, not the LM head
        assert len(info.targets) == 7 and not any("lm_head" in m for m in info.targets)
    session = TrainingSession(artifacts.directory)
    session.learning_rate = LR
    initial = session.parameters()
    assert sorted(initial) == sorted(info.adapter_names)  # the checkpoint holds the adapters only
    assert not any(initial[t.lora_B].any() for t in info.targets.values())
    batch = [*family.inputs.values(), family.target]
    losses = [
        float(np.asarray(session.train_and_update(*batch)[0]).reshape(-1)[0]) for _ in range(STEPS)
    ]
    reference, reference64 = _peft(family, info, initial)
    assert reference[0][-1] < reference[0][0]
    problems = _check(f"{name}-{exporter}", losses, session.parameters(), reference, reference64)
    assert not problems, "\n".join(problems)


def test_portable_artifacts_match_peft_on_stock_onnxruntime(portable_python, tmp_path):
    tasks, expected, failures = [], {}, []
    for name, exporter in CELLS:
        label = f"{name}-{exporter}"
        family, artifacts, info = _artifacts(name, exporter, tmp_path / label, portable=True)
        initial = TrainingSession(artifacts.directory).parameters()
        expected[label] = _peft(family, info, initial)
        data = tmp_path / f"{label}.npz"
        np.savez(
            data,
            **{
                f"x0_{k}": np.asarray(a)
                for k, a in enumerate([*family.inputs.values(), family.target])
            },
        )
        out = tmp_path / f"{label}-params.npz"
        task = {
            "task": "train",
            "label": label,
            "directory": str(artifacts.directory),
            "data": str(data),
        }
        tasks.append(task | {"steps": STEPS, "lr": LR, "threads": 1, "params_out": str(out)})
    answer = run_worker(portable_python, {"tasks": tasks, "processes": 1})
    for task, result in zip(tasks, answer["results"], strict=True):
        label = task["label"]
        if "error" in result:
            failures.append(f"{label}: stock onnxruntime: {result['error'][:400]}")
            continue
        if result["backend"] != "portable":
            failures.append(f"{label}: ran on {result['backend']}")
        adapters = dict(np.load(task["params_out"]))
        failures += _check(label, result["losses"], adapters, *expected[label])
    assert not failures, "\n".join(failures)

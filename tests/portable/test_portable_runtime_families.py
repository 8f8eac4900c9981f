"""Every model family of the exporter sweep and the model-family tests, as portable artifacts, trains on stock
onnxruntime under Python 3.13 like torch eager AdamW.

Here (Python 3.11, onnxruntime-training): each case is exported, its portable artifacts are generated
(``generate_artifacts(..., portable=True)``, fused step model included) and torch trains a copy for 20 steps.
There (one call of the 3.13 worker, stock onnxruntime): each case trains 20 steps with ``session.step`` (one
run of the fused step model) and 20 with ``train_step`` + ``optimizer_step`` (training and optimizer models).
Both loss curves must track torch's within 1e-4 relative, or within torch's own float32-vs-float64 distance
(torch trains each copy in float64 too; ``support.numerics``).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from support import hf_families, models, sweep
from support.numerics import check_close
from support.portable_env import run_worker
from support.reference64 import to64

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts

STEPS = 20
LR = 1e-2


def _family(name: str, exporter: str, directory):
    case = models.case(name, exporter)
    generate_artifacts(
        case.onnx_model,
        requires_grad=case.params,
        loss=LossType[models.LOSS_TYPES[case.loss]],
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=True,
    )

    def loss(model, dtype) -> torch.Tensor:
        inputs = [_tensor(v, dtype) for v in case.inputs.values()]
        return models.torch_loss(case.loss)(model(*inputs), _tensor(case.target, dtype))

    return (
        [*case.inputs.values(), case.target],
        _torch_losses(case.torch_model, lambda n: True, loss),
        False,
    )


def _sweep(name: str, exporter: str, directory):
    case = sweep.make_case(name)
    onnx_model = sweep.export(case, exporter)
    names = sweep.onnx_names(case, onnx_model)
    source = onnx_model
    if case.external:
        import onnx

        source = os.path.join(directory, "model", "model.onnx")
        os.makedirs(os.path.dirname(source))
        onnx.save(
            onnx_model,
            source,
            save_as_external_data=True,
            location="model.onnx.data",
            size_threshold=0,
        )
    trained = [t for t in names if t not in case.frozen and sweep.is_trained(case, t)]
    extra = (
        {"loss_input_names": ["out0"], "additional_output_names": ["out1"]} if case.multi else {}
    )
    generate_artifacts(
        source,
        requires_grad=[names[t] for t in trained],
        frozen_params=[names[t] for t in case.frozen],
        loss=LossType[models.LOSS_TYPES[case.loss]],
        optimizer=OptimType.AdamW,
        artifact_directory=os.path.join(directory, "artifacts"),
        portable=True,
        **extra,
    )

    def loss(model, dtype) -> torch.Tensor:
        out = model(*[_tensor(v, dtype) for v in case.inputs.values()])
        return models.torch_loss(case.loss)(
            out[0] if case.multi else out, _tensor(case.target, dtype)
        )

    return (
        [*case.inputs.values(), case.target],
        _torch_losses(case.model, trained.__contains__, loss),
        case.random,
    )


def _tensor(value: np.ndarray, dtype) -> torch.Tensor:
    t = torch.from_numpy(value)
    return t.to(dtype) if t.is_floating_point() else t


@hf_families.one_torch_thread()
def _torch_losses(model, trained, loss_fn) -> tuple[np.ndarray, list[float]]:
    """torch AdamW's losses over STEPS on the ``trained`` parameters: in float32, then in float64."""
    runs = []
    for dtype in (torch.float32, torch.float64):
        copy_ = copy.deepcopy(model).train() if dtype == torch.float32 else to64(model).train()
        optimizer = torch.optim.AdamW([p for n, p in copy_.named_parameters() if trained(n)], lr=LR)
        losses = []
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = loss_fn(copy_, dtype)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        runs.append(losses)
    return np.float32(runs[0]), runs[1]


CASES = [("families", n, e) for n, e in models.FAMILY_CASES] + [
    ("sweep", n, e) for n, e in sweep.CASES
]


def test_every_family_trains_on_stock_onnxruntime_like_torch(portable_python, tmp_path):
    tasks, expected = [], {}
    for suite, name, exporter in CASES:
        label = f"{suite}/{name}-{exporter}"
        directory = tmp_path / label.replace("/", "_")
        build = _family if suite == "families" else _sweep
        batch, losses, random = build(name, exporter, directory)
        artifacts = directory if suite == "families" else directory / "artifacts"
        data = directory.with_suffix(".npz")
        np.savez(data, **{f"x0_{k}": np.asarray(a) for k, a in enumerate(batch)})
        expected[label] = (losses, random)
        for mode in ("step", "train_step"):
            tasks.append(
                {
                    "task": "train",
                    "label": label,
                    "mode": mode,
                    "directory": str(artifacts),
                    "data": str(data),
                    "steps": STEPS,
                    "lr": LR,
                    "threads": 1,
                }
            )
    answer = run_worker(portable_python, {"tasks": tasks, "processes": os.cpu_count() or 1})
    failures = []
    for task, result in zip(tasks, answer["results"], strict=True):
        label = f"{task['label']} ({task['mode']})"
        if "error" in result:
            failures.append(f"{label}: {result['error']}")
            continue
        (torch_losses, torch64), random = expected[task["label"]]
        got = result["losses"]
        if random:  # dropout: torch draws other masks; it must still train
            if not (np.all(np.isfinite(got)) and got[-1] < got[0]):
                failures.append(f"{label}: losses {got[0]:.4f} -> {got[-1]:.4f} do not decrease")
            continue
        report = check_close(
            np.float32(got), torch_losses, torch64, rtol=1e-4, name=f"{label} losses against torch"
        )
        if report is not None:
            failures.append(report)
    assert not failures, f"{len(failures)} of {len(tasks)} runs do not track torch:\n" + "\n".join(
        failures
    )
    assert len(tasks) == 2 * len(CASES) > 100


@pytest.mark.parametrize("kind", ["sweep", "families"])
def test_the_case_lists_are_the_suites(kind):
    """The families and sweep here are exactly those of the two suites (no case silently left out)."""
    source = models.FAMILY_CASES if kind == "families" else sweep.CASES
    assert [(n, e) for s, n, e in CASES if s == kind] == list(source)

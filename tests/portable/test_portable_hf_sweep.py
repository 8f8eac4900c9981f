"""The exporter sweep of issue 19: real architectures, both torch exporters, portable in standard ops, on stock ORT.

For each family of ``support.hf_families`` (LLaMA, Qwen2, Mistral, T5, GPT-2, BERT, ViT,
Whisper, Wav2Vec2, ResNet, MobileNet, EfficientNet, ConvNeXt, Swin, an LSTM; tiny
Hugging Face configs, random init) and each exporter (TorchScript, dynamo):

* here (Python 3.11, the training build): ``generate_artifacts(..., portable=True)`` succeeds,
  and no file of the artifacts holds a ``com.microsoft`` op (or any non-standard op);
  torch's AdamW trains a copy for 5 steps (every parameter with a gradient: those whose gradient is zero in
  exact arithmetic, as MobileNetV2's batch-norm biases before another batch norm, stay as they are on both
  sides, since AdamW would turn each side's rounding noise into full steps);
* there (one call of the Python 3.13 worker, stock onnxruntime): each cell trains 5 steps with
  ``session.train_and_update`` (the fused step model); the losses track torch's within 1e-4
  relative, or within torch's own float32-vs-float64 distance (``support.numerics``); MobileNet's trajectory is chaotic between any two implementations (``hf_families.CHAOTIC``):
  its first loss matches torch's and its losses fall.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from support import hf_families
from support.numerics import check_close, is_close
from support.portable_env import run_worker
from support.reference64 import family64

from onnxblocks._core.contracts import PORTABLE_MODE_METADATA
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.portable import non_portable_ops

STEPS = 5
LR = 1e-3
CELLS = [(f, e) for f in hf_families.FAMILIES for e in hf_families.EXPORTERS]


def _cell(
    name: str, exporter: str, directory, torch_runs: dict
) -> tuple[list[np.ndarray], tuple, list[str]]:
    """Generate the cell's portable artifacts; return its batch, torch's losses (float32, float64) and what is
    wrong with the files.

    ``torch_runs`` holds the torch side of each family already run (its family, and per set of parameters
    with their gradient kept and their losses): torch's model is the same whichever exporter wrote the ONNX
    file, so the two exporters of a family share it whenever their exports keep the same parameters.
    """
    if name not in torch_runs:
        torch_runs[name] = {"family": hf_families.make(name)}
    runs = torch_runs[name]
    family = runs["family"]
    model = hf_families.export(family, exporter)
    every = hf_families.trainable(family, model)
    kept_key = ("kept", tuple(every))
    if kept_key not in runs:
        runs[kept_key] = set(hf_families.with_gradient(family, every))
    params = {n: o for n, o in every.items() if n in runs[kept_key]}
    frozen = [o for n, o in every.items() if n not in params]
    generate_artifacts(
        model,
        requires_grad=list(params.values()),
        frozen_params=frozen or None,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=True,
    )
    problems = []
    files = sorted(p for p in os.listdir(directory) if p.endswith(".onnx"))
    if len(files) != 4:
        problems.append(f"files {files}")
    for file in files:
        proto = onnx.load(os.path.join(directory, file), load_external_data=False)
        contrib = sorted({n.op_type for n in proto.graph.node if n.domain not in ("", "ai.onnx")})
        found = sorted({op for _, op, _ in non_portable_ops(proto)})
        if contrib or found:
            problems.append(f"{file}: {contrib or found}")
        if {p.key: p.value for p in proto.metadata_props}.get(PORTABLE_MODE_METADATA) != "standard":
            problems.append(f"{file}: mode metadata {proto.metadata_props}")
    losses_key = ("losses", tuple(params))
    if losses_key not in runs:
        runs[losses_key] = (
            np.float32(hf_families.torch_losses(family, list(params), STEPS, LR)),
            hf_families.torch_losses(family64(family), list(params), STEPS, LR),
        )
    return [*family.inputs.values(), family.target], runs[losses_key], problems


def test_every_family_and_exporter_trains_on_stock_onnxruntime_in_standard_ops(
    portable_python, tmp_path
):
    tasks, expected, failures, torch_runs = [], {}, [], {}
    for name, exporter in CELLS:
        label = f"{name}-{exporter}"
        directory = tmp_path / label
        try:
            batch, losses, problems = _cell(name, exporter, directory, torch_runs)
        except Exception as exc:  # one cell's failure must not hide the others'
            failures.append(f"{label}: generation: {type(exc).__name__}: {str(exc)[:400]}")
            continue
        failures += [f"{label}: {p}" for p in problems]
        data = tmp_path / f"{label}.npz"
        np.savez(data, **{f"x0_{k}": np.asarray(a) for k, a in enumerate(batch)})
        expected[label] = losses
        task = {
            "task": "train",
            "label": label,
            "mode": "step",
            "directory": str(directory),
            "data": str(data),
        }
        tasks.append(task | {"steps": STEPS, "lr": LR, "threads": 1})
    answer = run_worker(portable_python, {"tasks": tasks, "processes": 1})
    for task, result in zip(tasks, answer["results"], strict=True):
        label = task["label"]
        if "error" in result:
            failures.append(f"{label}: stock onnxruntime: {result['error'][:400]}")
            continue
        got, (torch_losses, torch64) = np.float32(result["losses"]), expected[label]
        if label.split("-")[0] in hf_families.CHAOTIC:
            first = is_close(got[0], torch_losses[0], torch64[0], rtol=1e-4)
            if not (first and np.all(np.isfinite(got)) and got[-1] < got[0]):
                failures.append(
                    f"{label}: losses {got} do not start at torch's {torch_losses[0]!r} and fall"
                )
            continue
        if result["backend"] != "portable":
            failures.append(f"{label}: ran on the {result['backend']} backend")
        report = check_close(
            got, torch_losses, torch64, rtol=1e-4, name=f"{label} losses against torch"
        )
        if report is not None:
            failures.append(report)
    assert not failures, f"{len(failures)} problems in {len(CELLS)} cells:\n" + "\n".join(failures)
    assert len(tasks) == len(CELLS) == 30

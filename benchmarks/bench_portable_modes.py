"""Is ``portable="onnxruntime"`` worth having? The fused step in standard ops against one keeping
ORT's contrib ops.

One run generates, for a BERT-like and a GPT-2-like Hugging Face config (random init,
TorchScript export at opset 17, cross-entropy, AdamW), portable artifacts in both modes:
``portable=True`` (standard ONNX ops only) and ``portable="onnxruntime"`` (ONNX Runtime's
fusions' ``Gelu`` / ``FastGelu`` / ``FusedMatMul``... kept). It then times
``TrainingSession.train_and_update`` (one run of ``step_model.onnx``) of both, alternating
in rounds (median of the per-round means), on stock onnxruntime under Python 3.13 (the
cached venv of ``tests/support/portable_env.py``) and on this Python's onnxruntime (the
training build's inference engine), and prints ms/step and the ratio standard / onnxruntime.

    python benchmarks/bench_portable_modes.py [--steps 10] [--rounds 7] [--threads 0] [--json
    out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MODES = ("standard", "onnxruntime")
BATCH, SEQ, VOCAB, HIDDEN = 8, 64, 1000, 128


def _model(kind: str):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=4 * HIDDEN,
            max_position_embeddings=SEQ,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=4,
        )
        model = transformers.BertForSequenceClassification(config)
        labels = np.random.default_rng(0).integers(0, 4, (BATCH,))
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=4,
            n_positions=SEQ,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
        )
        model = transformers.GPT2LMHeadModel(config)
        labels = np.random.default_rng(1).integers(0, VOCAB, (BATCH, SEQ))
    model.set_attn_implementation("eager")
    return model, labels.astype(np.int64)


def build(directory: Path) -> list[dict]:
    import onnx
    import torch

    from onnxblocks import losses
    from onnxblocks.artifacts import OptimType, generate_artifacts

    class Logits(torch.nn.Module):
        def __init__(self, model, mask: bool) -> None:
            super().__init__()
            self.model, self.mask = model, mask

        def forward(self, input_ids):
            extra = {"attention_mask": torch.ones_like(input_ids)} if self.mask else {}
            return self.model(input_ids=input_ids, return_dict=True, **extra).logits

    jobs = []
    for kind in ("bert", "gpt2"):
        model, labels = _model(kind)
        wrapped = Logits(model, kind == "gpt2").train()
        ids = np.random.default_rng(2).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
        f = io.BytesIO()
        torch.onnx.export(
            wrapped,
            (torch.from_numpy(ids),),
            f,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
        base = onnx.load_from_string(f.getvalue())
        params = [i.name for i in base.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
        loss = losses.CrossEntropyLoss(class_axis=-1 if kind == "gpt2" else 1)
        dirs = {}
        for mode in MODES:
            out = directory / f"{kind}-{mode}"
            generate_artifacts(
                base,
                requires_grad=params,
                loss=loss,
                optimizer=OptimType.AdamW,
                artifact_directory=out,
                portable=True if mode == "standard" else mode,
            )
            step = onnx.load(out / "step_model.onnx", load_external_data=False)
            contrib = sorted(
                {n.op_type for n in step.graph.node if n.domain not in ("", "ai.onnx")}
            )
            dirs[mode] = {"dir": str(out), "nodes": len(step.graph.node), "contrib": contrib}
        data = directory / f"{kind}.npz"
        np.savez(data, ids=ids, labels=labels)
        jobs.append({"model": kind, "data": str(data), "modes": dirs})
    return jobs


def time_modes(jobs: list[dict], steps: int, rounds: int, threads: int) -> dict:
    """Median ms/step of each mode, alternating rounds (run in whichever Python calls it)."""
    import onnxruntime

    from onnxblocks.runtime import TrainingSession

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    out: dict = {
        "onnxruntime": onnxruntime.__version__,
        "python": list(sys.version_info[:2]),
        "models": {},
    }
    for job in jobs:
        with np.load(job["data"]) as d:
            batch = (d["ids"], d["labels"])
        sessions = {
            m: TrainingSession(job["modes"][m]["dir"], session_options=options) for m in MODES
        }
        for s in sessions.values():
            for _ in range(3):
                s.train_and_update(*batch)
        per_round: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                start = time.perf_counter()
                for _ in range(steps):
                    sessions[m].train_and_update(*batch)
                per_round[m].append((time.perf_counter() - start) / steps * 1e3)
        out["models"][job["model"]] = {m: statistics.median(v) for m, v in per_round.items()}
    return out


def _worker() -> int:
    payload = json.load(sys.stdin)
    print(
        json.dumps(
            time_modes(payload["jobs"], payload["steps"], payload["rounds"], payload["threads"])
        )
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)"
    )
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker()
    from support.portable_env import ensure_python313

    with tempfile.TemporaryDirectory() as tmp:
        jobs = build(Path(tmp))
        payload = {
            "jobs": jobs,
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": args.threads,
        }
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
        done = subprocess.run(
            [str(ensure_python313()), __file__, "--worker"],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        stock = json.loads(done.stdout.strip().splitlines()[-1])
        here = time_modes(jobs, args.steps, args.rounds, args.threads)
    report = {
        "jobs": [{k: v for k, v in j.items() if k != "data"} for j in jobs],
        "stock": stock,
        "here": here,
    }
    for job in jobs:
        kind = job["model"]
        modes = job["modes"]
        print(
            f"{kind}: step model nodes {modes['standard']['nodes']} (standard) vs "
            f"{modes['onnxruntime']['nodes']} "
            f"(onnxruntime mode, contrib ops {modes['onnxruntime']['contrib']})"
        )
        for figures in (stock, here):
            t = figures["models"][kind]
            print(
                f"  onnxruntime {figures['onnxruntime']} (Python "
                f"{'.'.join(map(str, figures['python']))}): "
                f"standard {t['standard']:.2f} ms, onnxruntime mode {t['onnxruntime']:.2f} ms, "
                f"standard / onnxruntime = {t['standard'] / t['onnxruntime']:.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``onnxblocks train``: train an artifact directory on arrays from an ``.npz`` file."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError
from onnxblocks.cli.hub_options import add_train_options
from onnxblocks.cli.preflight import check_data, check_export, check_options
from onnxblocks.cli.subcommand import subcommand

EXAMPLES = """\
examples:
  # arrays named after the model inputs: np.savez("train.npz", x=features, labels=labels)
  onnxblocks train artifacts --data train.npz --epochs 10 --batch-size 32 --lr 1e-3 --save ckpt
  # hold out 10%% for evaluation, report accuracy, cosine schedule with warmup, plot the loss
  onnxblocks train artifacts --data train.npz --val-fraction 0.1 --accuracy \\
      --scheduler cosine --warmup-steps 50 --plot loss.png --export model.onnx
  # arrays with other names: map input=array
  onnxblocks train artifacts --data d.npz --inputs x=features labels=y
  # portable artifacts train on stock onnxruntime, e.g. under Python 3.13 (backend chosen by itself)
  onnxblocks train portable-artifacts --data train.npz --epochs 10
  # continue exactly where a saved run stopped (same data, batch size and seed)
  onnxblocks train artifacts --data train.npz --resume ckpt --epochs 20 --save ckpt

The checkpoint written by --save holds parameters, optimizer state, step counter, data order and
schedule, so --resume continues bit for bit."""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``train`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "train",
        help="train artifacts on an .npz dataset",
        description="Train the artifacts of DIR with ONNX Runtime on arrays from an .npz file, "
        "with a progress "
        "bar, optional evaluation, learning-rate schedule, checkpoints and export.",
        examples=EXAMPLES,
    )
    parser.add_argument("directory", metavar="DIR", help="artifact directory")
    parser.add_argument("--prefix", default="", help="file-name prefix of the artifacts")
    parser.add_argument(
        "--backend",
        choices=("auto", "training", "portable"),
        default="auto",
        help="engine: the training build (onnxruntime-training) or the portable backend (any "
        "onnxruntime); "
        "default auto: portable artifacts on the portable backend, others on the training build",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", default=None, metavar="FILE.npz", help="training arrays, one per model input"
    )
    add_train_options(data)
    data.add_argument(
        "--inputs",
        nargs="+",
        default=None,
        metavar="INPUT=ARRAY",
        help="map model inputs to arrays of the .npz file (default: same names, or arr_0, arr_1 "
        "...)",
    )
    data.add_argument(
        "--eval-data", metavar="FILE.npz", help="evaluation arrays (same names as --data)"
    )
    data.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        metavar="F",
        help="hold out the last fraction F of --data for evaluation",
    )
    data.add_argument("--batch-size", type=int, default=32, help="rows per batch (default 32)")
    data.add_argument("--no-shuffle", action="store_true", help="keep the row order")
    data.add_argument("--seed", type=int, default=0, help="seed of the shuffling (default 0)")
    loop = parser.add_argument_group("training")
    loop.add_argument("--epochs", type=int, default=1, help="epoch to train up to (default 1)")
    loop.add_argument(
        "--max-steps", type=int, default=None, help="stop after this many optimizer steps"
    )
    loop.add_argument(
        "--accumulation-steps", type=int, default=1, help="batches summed into one optimizer step"
    )
    loop.add_argument(
        "--lr", type=float, default=None, help="learning rate (default: the optimizer model's)"
    )
    loop.add_argument(
        "--scheduler",
        choices=("constant", "linear", "cosine", "step"),
        default=None,
        help="learning-rate schedule (default: none, constant lr)",
    )
    loop.add_argument(
        "--warmup-steps", type=int, default=0, help="linear warmup steps of the schedule"
    )
    loop.add_argument(
        "--step-size", type=int, default=None, help="steps between decays (step schedule)"
    )
    loop.add_argument(
        "--gamma", type=float, default=0.1, help="decay factor (step schedule, default 0.1)"
    )
    loop.add_argument(
        "--min-lr", type=float, default=0.0, help="final learning rate (cosine schedule)"
    )
    loop.add_argument(
        "--accuracy",
        action="store_true",
        help="report classification accuracy (needs --eval-data/--val-fraction and artifacts "
        "generated with the logits as --additional-output)",
    )
    loop.add_argument("--no-progress", action="store_true", help="no progress bar")
    out = parser.add_argument_group("output")
    out.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint saved by --save")
    out.add_argument(
        "--save", metavar="CKPT", help="save a resumable checkpoint after each epoch and at the end"
    )
    out.add_argument(
        "--save-every",
        type=int,
        default=None,
        metavar="N",
        help="also save every N optimizer steps",
    )
    out.add_argument("--export", metavar="MODEL.onnx", help="export the trained inference model")
    out.add_argument(
        "--export-output",
        nargs="+",
        default=None,
        metavar="NAME",
        help="outputs of the exported model (default: the eval model's outputs after the loss)",
    )
    out.add_argument(
        "--plot", metavar="FILE.svg|FILE.png", help="save the loss curve (.png needs matplotlib)"
    )
    out.add_argument("--history", metavar="FILE.json", help="save losses and metrics as JSON")
    parser.set_defaults(handler=run)


def map_arrays(
    arrays: dict[str, np.ndarray], inputs: list[str], mapping: list[str] | None, source: str
) -> tuple[np.ndarray, ...]:
    """Pick one array per model input from an ``.npz`` archive.

    By ``--inputs INPUT=ARRAY`` pairs if given; else by input name; else, for
    ``arr_0, arr_1, ...`` archives with one array per input, by position.

    Raises:
        CliError: (exit 2) for a malformed pair, (exit 3) when arrays are missing.
    """
    from onnxblocks._core.errors import did_you_mean

    chosen: dict[str, str] = {}
    for pair in mapping or []:
        name, sep, key = pair.partition("=")
        if not sep or not name or not key:
            raise CliError(f"--inputs takes INPUT=ARRAY pairs, got {pair!r}.", EXIT_USAGE)
        if name not in inputs:
            raise CliError(
                f"--inputs names {name!r}, which is not a model input.{did_you_mean(name, inputs)} "
                f"Model inputs: {inputs}.",
                EXIT_INPUT,
            )
        chosen[name] = key
    for name in inputs:
        chosen.setdefault(name, name)
    if any(key not in arrays for key in chosen.values()):
        positional = [f"arr_{i}" for i in range(len(inputs))]
        if not mapping and sorted(arrays) == sorted(positional):
            chosen = dict(zip(inputs, positional, strict=True))
        else:
            missing = [f"{n} (array {k!r})" for n, k in chosen.items() if k not in arrays]
            raise CliError(
                f"{source} has arrays {sorted(arrays)} but no array for model input(s) "
                f"{', '.join(missing)}. "
                "Save the arrays under the input names (np.savez(path, "
                f"{', '.join(f'{n}=...' for n in inputs)})) "
                "or map them with --inputs INPUT=ARRAY.",
                EXIT_INPUT,
            )
    return tuple(arrays[chosen[n]] for n in inputs)


def run(args: argparse.Namespace) -> int:
    """Train, then save, export and plot as asked."""
    from onnxblocks.runtime import (
        Accuracy,
        FitRun,
        SaveCheckpoint,
        TrainingSession,
        fit,
        make_schedule,
        plot_history,
        resume,
    )

    check_options(args)
    session = TrainingSession(args.directory, args.prefix, backend=args.backend)
    if not session.has_optimizer:
        raise CliError(
            f"the artifacts in '{args.directory}' have no optimizer model; regenerate them with "
            "'onnxblocks artifacts ... --optimizer adamw'.",
            EXIT_INPUT,
        )
    if (args.eval_data or args.val_fraction is not None) and not session.has_eval_model:
        raise CliError(
            f"the artifacts in '{args.directory}' have no eval model, so they cannot be evaluated; "
            "drop --eval-data/--val-fraction or regenerate them.",
            EXIT_INPUT,
        )
    if args.text is not None:
        from onnxblocks.cli.hub_options import text_batches

        if args.data or args.eval_data or args.val_fraction is not None:
            raise CliError(
                "--text trains on text alone: drop --data, --eval-data and --val-fraction.",
                EXIT_USAGE,
            )
        check_export(session, args)
        train, evaluation = text_batches(args), None
    elif args.data is None:
        raise CliError(
            "pass --data FILE.npz, or --text FILE.txt with --tokenizer HUB_DIR and --seq-len N.",
            EXIT_USAGE,
        )
    else:
        train, evaluation = _array_batches(args, session)
    if args.resume:
        resume(session, args.resume, train)
    if args.lr is not None:
        session.learning_rate = args.lr
    scheduler = None
    if args.scheduler:
        steps_per_epoch = math.ceil(len(train) / args.accumulation_steps)
        scheduler = make_schedule(
            args.scheduler,
            args.lr if args.lr is not None else session.learning_rate,
            total_steps=max(args.warmup_steps + 1, args.epochs * steps_per_epoch),
            warmup_steps=args.warmup_steps,
            step_size=args.step_size,
            gamma=args.gamma,
            min_lr=args.min_lr,
        )
    callbacks: list[Any] = []
    if args.accuracy:
        callbacks.append(Accuracy(output=1))
    if args.save:
        callbacks.append(SaveCheckpoint(args.save, every_steps=args.save_every))
    start_step = session.step
    history = fit(
        session,
        train,
        epochs=args.epochs,
        eval_data=evaluation,
        callbacks=callbacks,
        accumulation_steps=args.accumulation_steps,
        scheduler=scheduler,
        progress=not args.no_progress,
        max_steps=args.max_steps,
    )
    out = sys.stdout
    if not history.epochs:
        out.write(
            f"nothing to train: the data is already at epoch {train.epoch} of --epochs "
            f"{args.epochs}.\n"
        )
    else:
        last = history.epochs[-1]
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if k != "epoch")
        out.write(
            f"trained {history.steps} steps (steps {start_step + 1}-{session.step}) in "
            f"{history.seconds:.2f} s "
            f"({history.samples / max(history.seconds, 1e-9):,.0f} samples/s): {metrics}\n"
        )
    if args.save:
        if not history.epochs:  # fit saved after each epoch it ran; here it ran none
            FitRun(session, history, train, args.epochs, train.epoch, scheduler).save_checkpoint(
                args.save
            )
        out.write(f"checkpoint: {args.save}\n")
    if args.export:
        _parent(args.export)
        out.write(
            f"inference model: {session.export_inference_model(args.export, args.export_output)}\n"
        )
    if args.plot and history.losses:
        _parent(args.plot)
        out.write(f"loss curve: {plot_history(history, args.plot)}\n")
    if args.history:
        from onnxblocks.io import atomic_file

        _parent(args.history)
        with atomic_file(args.history) as temp:
            temp.write_text(json.dumps(history.to_dict(), indent=1))
        out.write(f"history: {args.history}\n")
    return EXIT_OK


def _array_batches(args: argparse.Namespace, session: Any) -> tuple[Any, Any]:
    """The train and eval batches of ``--data`` (and ``--eval-data`` / ``--val-fraction``)."""
    from onnxblocks.runtime import ArrayBatches, load_npz

    train_arrays = map_arrays(load_npz(args.data), session.input_names, args.inputs, args.data)
    eval_arrays = None
    if args.eval_data:
        eval_arrays = map_arrays(
            load_npz(args.eval_data), session.eval_input_names, args.inputs, args.eval_data
        )
    elif args.val_fraction is not None:
        rows = len(train_arrays[0])
        cut = rows - round(rows * args.val_fraction)
        if not 0 < cut < rows:
            raise CliError(
                f"--val-fraction {args.val_fraction} leaves an empty part of {rows} rows.",
                EXIT_USAGE,
            )
        eval_arrays = tuple(a[cut:] for a in train_arrays)
        train_arrays = tuple(a[:cut] for a in train_arrays)
    check_data(session, train_arrays, eval_arrays, args)  # all of it, before training on any of it
    check_export(session, args)
    try:
        train = ArrayBatches(
            train_arrays, args.batch_size, shuffle=not args.no_shuffle, seed=args.seed
        )
        evaluation = (
            ArrayBatches(eval_arrays, max(args.batch_size, 256), shuffle=False)
            if eval_arrays
            else None
        )
    except ValueError as exc:
        raise CliError(f"{args.data}: {exc}", EXIT_INPUT) from None
    return train, evaluation


def _parent(path: str) -> None:
    """Create the missing directories of an output file (checked writable before training)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)

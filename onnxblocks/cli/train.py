"""``onnxblocks train``: train an artifact directory on arrays from an ``.npz`` file."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError
from onnxblocks.cli.paths import output_file, require

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
    parser = commands.add_parser(
        "train",
        parents=parents,
        help="train artifacts on an .npz dataset",
        description="Train the artifacts of DIR with ONNX Runtime on arrays from an .npz file, "
        "with a progress "
        "bar, optional evaluation, learning-rate schedule, checkpoints and export.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "--data", required=True, metavar="FILE.npz", help="training arrays, one per model input"
    )
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
        ArrayBatches,
        FitRun,
        SaveCheckpoint,
        TrainingSession,
        fit,
        load_npz,
        make_schedule,
        plot_history,
        resume,
    )

    _check(args)
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
    _check_data(session, train_arrays, eval_arrays, args)  # all of it, before training on any of it
    _check_export(session, args)
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


def _parent(path: str) -> None:
    """Create the missing directories of an output file (checked writable before training)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)


def _check(args: argparse.Namespace) -> None:
    if args.eval_data and args.val_fraction is not None:
        raise CliError("use either --eval-data or --val-fraction, not both.", EXIT_USAGE)
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        raise CliError(
            f"--val-fraction must be between 0 and 1, got {args.val_fraction}.", EXIT_USAGE
        )
    for option in ("batch_size", "accumulation_steps"):
        if getattr(args, option) < 1:
            raise CliError(
                f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}.",
                EXIT_USAGE,
            )
    if args.epochs < 0:
        raise CliError(f"--epochs must be >= 0, got {args.epochs}.", EXIT_USAGE)
    if args.accuracy and not (args.eval_data or args.val_fraction is not None):
        raise CliError(
            "--accuracy needs evaluation data: add --eval-data FILE.npz or --val-fraction F.",
            EXIT_USAGE,
        )
    if args.scheduler == "step" and args.step_size is None:
        raise CliError("--scheduler step needs --step-size N.", EXIT_USAGE)
    if args.save_every is not None and not args.save:
        raise CliError("--save-every needs --save CKPT.", EXIT_USAGE)
    for option, value, low in (
        ("--max-steps", args.max_steps, 1),
        ("--save-every", args.save_every, 1),
        ("--warmup-steps", args.warmup_steps, 0),
        ("--step-size", args.step_size, 1),
        ("--seed", args.seed, 0),
    ):
        require(value, option, minimum=low)
    for option, rate in (("--lr", args.lr), ("--min-lr", args.min_lr)):  # the session's own check
        try:
            if rate is not None:
                _hyper.learning_rate(rate, option)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    require(args.gamma, "--gamma", above=0)
    if args.plot:
        from onnxblocks.runtime.plot import check_plot_path

        try:
            check_plot_path(args.plot)  # before training, not after it
        except (ValueError, ImportError) as exc:
            raise CliError(f"--plot: {exc}", EXIT_USAGE) from None
    # output paths: a run must not fail at its end for a file it cannot write (exit 3)
    # missing directories of the outputs are created (when they are written)
    for option, value in (
        ("--save", args.save),
        ("--export", args.export),
        ("--plot", args.plot),
        ("--history", args.history),
    ):
        output_file(value, option, create_parents=True)


def _check_export(session: Any, args: Any) -> None:
    """Refuse, before training, an export the artifacts cannot make (no eval model, unknown output
    names).

    Raises:
        CliError: (exit 3) naming the option and the names the eval model has.
    """
    if not args.export:
        if args.export_output:
            raise CliError("--export-output needs --export MODEL.onnx.", EXIT_USAGE)
        return
    if not session.has_eval_model:
        raise CliError(
            f"--export: the artifacts in '{args.directory}' have no eval model to cut the "
            "inference model from; "
            "regenerate them (generate_artifacts writes eval_model.onnx) or drop --export.",
            EXIT_INPUT,
        )
    if not args.export_output and not session.default_inference_outputs():
        raise CliError(
            f"--export: the artifacts in '{args.directory}' do not say which outputs the "
            "inference model has; "
            "name them with --export-output NAME... (the forward model's outputs), or regenerate "
            "the artifacts "
            "with --additional-output.",
            EXIT_INPUT,
        )
    if not args.export_output or session.files.eval_model.suffix != ".onnx":
        return
    from onnxblocks._core.errors import did_you_mean, preview
    from onnxblocks.io import load_model

    graph = load_model(session.files.eval_model).graph
    values = {o for node in graph.node for o in node.output} | {i.name for i in graph.input}
    for name in args.export_output:
        if name not in values:
            raise CliError(
                f"--export-output {name!r} is not a value of the eval "
                f"model.{did_you_mean(name, values)} Its outputs: "
                f"{preview(o.name for o in graph.output)}.",
                EXIT_INPUT,
            )


def _check_data(
    session: Any,
    train: tuple[np.ndarray, ...],
    evaluation: tuple[np.ndarray, ...] | None,
    args: Any,
) -> None:
    """Refuse data ONNX Runtime would crash on or train wrongly on (labels out of range, no rows),
    before training.

    Raises:
        CliError: (exit 3) naming the file, the input, the offending value and the valid range.
    """
    from onnxblocks.runtime.guards import session_guards
    from onnxblocks.runtime.inputs import read_input_specs

    eval_specs = (
        read_input_specs(session.files.eval_model, session.eval_input_names)
        if session.files.eval_model
        else []
    )
    guards = session_guards(session.files, session.input_specs, eval_specs)
    try:
        guards["train_step"].check(train, f"--data {args.data}")
        if evaluation is not None:
            guards["eval_step"].check(evaluation, f"--eval-data {args.eval_data or args.data}")
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INPUT) from None

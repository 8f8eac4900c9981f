"""What ``onnxblocks train`` refuses before the first step: options that do not fit together,
outputs it could not write, an export the artifacts cannot make, data ONNX Runtime would crash on.

Each check runs before training so that a long run never fails at its end for a reason known at
its start.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks.cli.errors import EXIT_INPUT, EXIT_USAGE, CliError
from onnxblocks.cli.paths import output_file, require


def check_options(args: argparse.Namespace) -> None:
    """Refuse option combinations and values ``onnxblocks train`` cannot honour.

    Raises:
        CliError: (exit 2) naming the option and what it needs.
    """
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


def check_export(session: Any, args: Any) -> None:
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


def check_data(
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

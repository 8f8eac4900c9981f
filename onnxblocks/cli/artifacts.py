"""``onnxblocks artifacts``: generate training artifacts from a model file."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError
from onnxblocks.cli.hub_options import add_artifacts_options, cross_entropy_block, run_hub_artifacts
from onnxblocks.cli.lora_spec import LORA_KEYS as LORA_KEYS
from onnxblocks.cli.lora_spec import lora_config
from onnxblocks.cli.parameter_choice import FLOAT_TYPES, match_all, select_parameters
from onnxblocks.cli.paths import output_dir
from onnxblocks.cli.subcommand import subcommand
from onnxblocks.cli.tables import format_bytes

#: ``--loss`` choices and the LossType member each selects (None: the model's first output is the
#: loss).
LOSSES = {
    "mse": "MSELoss",
    "crossentropy": "CrossEntropyLoss",
    "bcewithlogits": "BCEWithLogitsLoss",
    "l1": "L1Loss",
    "huber": "HuberLoss",
    "smoothl1": "SmoothL1Loss",
    "nll": "NLLLoss",
    "kldiv": "KLDivLoss",
    "none": None,
}
OPTIMIZERS = ("adamw", "sgd", "adam", "adagrad", "rmsprop", "lamb", "none")

EXAMPLES = """\
examples:
  # train every float initializer with cross entropy and AdamW
  onnxblocks artifacts model.onnx --loss crossentropy --all-params -o artifacts
  # train only the classifier head; keep the embeddings in the checkpoint, frozen
  onnxblocks artifacts model.onnx --loss crossentropy --requires-grad 'head.*' \\
      --frozen 'embed.*' -o artifacts
  # MSE with SGD, also returning the model output 'y' from the training and eval models
  onnxblocks artifacts model.onnx --loss mse --optimizer sgd --all-params \\
      --additional-output y -o out
  # portable artifacts: they train on stock onnxruntime (any Python, also 3.13), fused step model
  onnxblocks artifacts model.onnx --loss crossentropy --all-params --portable -o artifacts
  # the same, keeping contrib ops stock onnxruntime runs (Gelu, FusedMatMul...): onnxruntime only
  onnxblocks artifacts model.onnx --loss crossentropy --all-params --portable onnxruntime \\
      -o artifacts
  # train the head only; the rest stays constant, stored once in base_weights.bin, in float16
  onnxblocks artifacts model.onnx --loss crossentropy --requires-grad 'head.*' \\
      --base-dtype float16 -o artifacts
  # LoRA adapters on the attention's q and v projections (docs/lora.md): only the adapters train
  onnxblocks artifacts llama.onnx --loss crossentropy --lora r=8,alpha=16,targets=q_proj,v_proj \\
      -o artifacts
  # a Hugging Face hub folder (config.json, onnx/model.onnx): its task's loss, LoRA adapters
  onnxblocks artifacts ./SmolLM2-135M --task causal-lm --lora r=8,alpha=16,targets=q_proj,v_proj \\
      -o artifacts
  # next-token cross entropy on a plain export: logits [b, t, vocab], labels = input ids
  onnxblocks artifacts lm.onnx --loss crossentropy --shift-labels --all-params -o artifacts

Parameter patterns are shell-style globs matched against initializer names ('fc1.*', '*.bias').
Run 'onnxblocks inspect model.onnx' to list the initializers."""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``artifacts`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "artifacts",
        help="generate training artifacts (training/eval/optimizer models, checkpoint)",
        description="Generate the ONNX Runtime training artifacts of a model: training_model.onnx, "
        "eval_model.onnx, optimizer_model.onnx and checkpoint.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "model", metavar="MODEL.onnx", help="the forward model, or a hub folder (docs/hub.md)"
    )
    parser.add_argument(
        "-o", "--output-dir", required=True, metavar="DIR", help="where to write the artifacts"
    )
    parser.add_argument(
        "--loss",
        default=None,
        choices=list(LOSSES),
        help="loss added after the model's outputs ('none': the model's first output is the loss)",
    )
    parser.add_argument(
        "--optimizer",
        default="adamw",
        choices=OPTIMIZERS,
        help="optimizer model to generate, with torch.optim's semantics and defaults (default: "
        "adamw)",
    )
    parser.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        metavar="WD",
        help="the optimizer's weight_decay (torch's default)",
    )
    parser.add_argument(
        "--momentum",
        type=float,
        default=None,
        help="sgd and rmsprop: momentum (sgd: with --nesterov for Nesterov)",
    )
    parser.add_argument("--nesterov", action="store_true", help="sgd: Nesterov momentum")
    parser.add_argument("--amsgrad", action="store_true", help="adam, adamw: the amsgrad variant")
    parser.add_argument(
        "--no-decay-norm-bias",
        action="store_true",
        help="no weight decay on biases and normalisation weights (tensors of at most one "
        "dimension): "
        "the usual fine-tuning parameter groups",
    )
    parser.add_argument(
        "--requires-grad",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="parameters to train (names or glob patterns)",
    )
    parser.add_argument(
        "--all-params",
        action="store_true",
        help="train every floating-point initializer (minus --frozen)",
    )
    parser.add_argument(
        "--frozen",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="parameters kept in the checkpoint without training (names or glob patterns)",
    )
    parser.add_argument(
        "--additional-output",
        nargs="+",
        default=[],
        metavar="NAME",
        help="values the training and eval models return after the loss (e.g. logits)",
    )
    parser.add_argument(
        "--loss-input",
        nargs="+",
        default=None,
        metavar="NAME",
        help="values passed to the loss (default: the model's outputs)",
    )
    parser.add_argument("--prefix", default="", help="prefix of every artifact file name")
    parser.add_argument(
        "--ort-format", action="store_true", help="also write .ort versions of the models"
    )
    parser.add_argument(
        "--nominal-checkpoint", action="store_true", help="also write a nominal checkpoint"
    )
    parser.add_argument(
        "--portable",
        nargs="?",
        const="standard",
        default=False,
        choices=("standard", "onnxruntime"),
        help="write models that train on stock onnxruntime (see docs/portable.md): standard ONNX "
        "ops only "
        "(--portable, --portable standard), or also the contrib ops stock onnxruntime runs, for "
        "speed "
        "(--portable onnxruntime)",
    )
    parser.add_argument(
        "--no-fused-step",
        dest="fused_step",
        action="store_false",
        help="with --portable: do not write step_model.onnx (forward, backward and update in one "
        "graph)",
    )
    parser.add_argument(
        "--base-dtype",
        choices=("float16", "bfloat16", "int8", "int4"),
        default=None,
        help="store the weights that do not train (the frozen base, in base_weights.bin) in this "
        "type, cast (float16, bfloat16) or dequantized (int8, int4: blockwise, symmetric) to "
        "float32 where they are read (see docs/lora.md)",
    )
    parser.add_argument(
        "--quant-block-size",
        type=int,
        choices=(32, 64, 128),
        default=32,
        help="with --base-dtype int8/int4: elements of a row sharing one scale (default 32)",
    )
    parser.add_argument(
        "--recompute",
        default="none",
        metavar="POLICY",
        help="none (default), layers (recompute each repeated block's forward in the backward, "
        "keeping only the blocks' inputs), auto or BYTES (the fewest blocks that fit the "
        "estimated activations in a byte budget; auto: a third of the weights' bytes), or "
        "comma-separated module paths, each one segment (a path of digits alone ends with a comma: "
        "0,) (docs/training.md, Recomputation)",
    )
    parser.add_argument(
        "--lora",
        default=None,
        metavar="SPEC",
        help="add LoRA adapters and train them (docs/lora.md): r=8,alpha=16,targets=q_proj,v_proj "
        "with optional "
        "dropout=P, fan_in_fan_out=1, exclude=NAME (comma-separated; names after targets= or "
        "exclude= belong to it); "
        "--requires-grad then names parameters to train besides the adapters",
    )
    parser.add_argument(
        "--untie",
        action="store_true",
        help="give each module of a weight the exporter tied (merged identical initializers, "
        "listed by "
        "'onnxblocks inspect') its own copy, named after the module and trained or frozen with it",
    )
    add_artifacts_options(parser)
    parser.set_defaults(handler=run)


def optimizer_block(args: argparse.Namespace) -> Any:
    """The optimizer block the options ask for (None for ``--optimizer none``).

    Raises:
        CliError: for an option the optimizer does not take, or a value out of torch's range.
    """
    from onnxblocks import optim  # imported when used: the CLI starts without the DSL

    if args.optimizer == "none":
        return None
    options: dict[str, Any] = {}
    if args.weight_decay is not None:
        options["weight_decay"] = args.weight_decay
    if args.momentum is not None:
        options["momentum"] = args.momentum
    if args.nesterov:
        options["nesterov"] = True
    if args.amsgrad:
        options["amsgrad"] = True
    if args.no_decay_norm_bias:
        options["param_groups"] = optim.no_decay_norm_bias()
    cls = {
        "adamw": optim.AdamW,
        "sgd": optim.SGD,
        "adam": optim.Adam,
        "adagrad": optim.Adagrad,
        "lamb": optim.Lamb,
    }.get(args.optimizer, optim.RMSprop)
    try:
        return cls(**options)
    except TypeError as exc:  # an option this optimizer does not take
        option = str(exc).rsplit("'", 2)[-2] if "'" in str(exc) else str(exc)
        raise CliError(
            f"--optimizer {args.optimizer} takes no --{option.replace('_', '-')} option; see "
            "`onnxblocks artifacts --help`.",
            EXIT_USAGE,
        ) from None
    except ValueError as exc:
        raise CliError(f"--optimizer {args.optimizer}: {exc}", EXIT_USAGE) from None


def run(args: argparse.Namespace) -> int:
    """Generate the artifacts and print a summary."""
    from onnxblocks import artifacts
    from onnxblocks.io import load_model

    if os.path.isdir(args.model):
        output_dir(args.output_dir, "--output-dir")
        return run_hub_artifacts(args, optimizer_block(args))
    if args.loss is None:
        raise CliError(
            "--loss is required with a model file (a hub folder has its task's loss).", EXIT_USAGE
        )
    if args.task is not None or args.file is not None:
        raise CliError("--task and --file take a hub folder as MODEL, not a file.", EXIT_USAGE)
    if not os.path.isfile(args.model):
        problem = (
            "is not a regular file (a directory?)"
            if os.path.exists(args.model)
            else "does not exist"
        )
        raise CliError(f"model file '{args.model}' {problem}; pass an .onnx file.", EXIT_INPUT)
    output_dir(args.output_dir, "--output-dir")  # before the work, not after it
    model = load_model(args.model)
    initializers = [(i.name, i.data_type) for i in model.graph.initializer]
    lora = lora_config(args.lora) if args.lora is not None else None
    if (
        lora is not None and not args.requires_grad and not args.all_params
    ):  # the adapters alone train
        floats = [n for n, t in initializers if t in FLOAT_TYPES]
        trainable: list[str] = []
        frozen = match_all(args.frozen, [n for n, _ in initializers], floats, "--frozen")
    else:
        trainable, frozen = select_parameters(
            initializers, args.requires_grad, args.frozen, args.all_params
        )
        if not trainable:
            raise CliError(
                "no parameter left to train: every selected parameter is also --frozen.", EXIT_USAGE
            )
    loss_name = LOSSES[args.loss]
    loss = cross_entropy_block(args) or (artifacts.LossType[loss_name] if loss_name else None)
    optimizer = optimizer_block(args)
    result = artifacts.generate_artifacts(
        args.model,
        requires_grad=trainable or None,
        frozen_params=frozen or None,
        loss=loss,
        optimizer=optimizer,
        artifact_directory=args.output_dir,
        prefix=args.prefix,
        ort_format=args.ort_format,
        additional_output_names=args.additional_output or None,
        nominal_checkpoint=args.nominal_checkpoint,
        loss_input_names=args.loss_input,
        portable=args.portable,
        fused_step=args.fused_step,
        base_dtype=args.base_dtype,
        quant_block_size=args.quant_block_size,
        lora=lora,
        untie=args.untie,
        recompute=_recompute_policy(args.recompute),
    )
    sizes = {i.name: _nbytes(i) for i in model.graph.initializer}
    if lora is not None:
        from onnxblocks.peft import lora_info

        info = lora_info(result.training_model)
        for t in info.targets.values() if info is not None else ():
            sizes.update(
                {t.lora_A: 4 * lora.r * t.in_features, t.lora_B: 4 * lora.r * t.out_features}
            )
    out = sys.stdout
    out.write(f"wrote training artifacts to {result.directory}\n")
    for path in result.files:
        out.write(f"  {path.name:<28} {format_bytes(path.stat().st_size):>10}\n")
    if result.base_weights is not None:
        how = (
            "a hard link of the model's data file"
            if result.base_weights.stat().st_nlink > 1
            else "written"
        )
        kind = f", stored as {args.base_dtype}" if args.base_dtype else ""
        out.write(f"frozen base: {result.base_weights.name} ({how}{kind}), shared by every model\n")
    out.write(
        f"trainable: {len(result.requires_grad)} parameters "
        f"({format_bytes(sum(sizes.get(n, 0) for n in result.requires_grad))}); "
        f"frozen: {len(result.frozen_params)} "
        f"({format_bytes(sum(sizes.get(n, 0) for n in result.frozen_params))})\n"
    )
    out.write(
        f"inputs: {', '.join(result.input_names)}; outputs: {', '.join(result.output_names)}\n"
    )
    prefix = f" --prefix {args.prefix}" if args.prefix else ""
    out.write(f"next: onnxblocks train {result.directory}{prefix} --data DATA.npz --epochs 10\n")
    return EXIT_OK


def _nbytes(tensor: Any) -> int:
    from onnxblocks._core.weights import tensor_nbytes

    return tensor_nbytes(tensor)


def _recompute_policy(text: str) -> str | int | list[str]:
    """``--recompute``: a policy name, a byte budget (an integer), or module paths separated by
    commas (a module path of digits alone, as ``torch.nn.Sequential``'s ``0``, with a comma:
    ``0,``).
    """
    if text in ("none", "layers", "auto"):
        return text
    if text.lstrip("-").isdigit():
        return int(text)
    return [p.strip() for p in text.split(",") if p.strip()] or text

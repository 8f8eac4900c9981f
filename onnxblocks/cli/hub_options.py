"""The CLI's road for language models: hub folders to ``artifacts``, text to ``train``.

``onnxblocks artifacts HUB_DIR --task causal-lm [--lora ...]`` runs :func:`onnxblocks.hub.from_hub`;
the cross-entropy options (``--class-axis``, ``--ignore-index``, ``--shift-labels``,
``--chunk-size``) shape the loss of a plain model file too. ``onnxblocks train ARTIFACTS --text
FILE --tokenizer HUB_DIR --seq-len N`` trains on :class:`onnxblocks.hub.TextBatches`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError

TASK_CHOICES = ("auto", "causal-lm", "sequence-classification", "token-classification", "masked-lm")


def add_artifacts_options(parser: argparse.ArgumentParser) -> None:
    """The hub-folder and cross-entropy options of ``onnxblocks artifacts``."""
    group = parser.add_argument_group("language models (docs/hub.md)")
    group.add_argument(
        "--task",
        choices=TASK_CHOICES,
        default=None,
        help="with a hub folder as MODEL (config.json, onnx/model.onnx): the task whose loss "
        "trains it (default auto: from config.json's architectures)",
    )
    group.add_argument(
        "--file",
        default=None,
        metavar="NAME",
        help="with a hub folder: the ONNX file (e.g. model_q4.onnx; default onnx/model.onnx)",
    )
    group.add_argument(
        "--class-axis",
        type=int,
        default=None,
        help="--loss crossentropy: the logits' class axis (-1 for [batch, tokens, vocab])",
    )
    group.add_argument(
        "--ignore-index",
        type=int,
        default=None,
        help="--loss crossentropy: the label that adds nothing (transformers' -100; hub: -100)",
    )
    group.add_argument(
        "--shift-labels",
        action="store_true",
        help="--loss crossentropy: next-token loss, logits[:, :-1] against labels[:, 1:] "
        "(labels = input ids, classes last, ignore index -100 unless given)",
    )
    group.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="--loss crossentropy: tokens per chunk of the log-softmax (a large vocabulary)",
    )


def cross_entropy_block(args: argparse.Namespace) -> Any:
    """The loss block the cross-entropy options ask for, or None when none is given.

    Raises:
        CliError: for a cross-entropy option with another ``--loss``.
    """
    given = (
        args.class_axis is not None
        or args.ignore_index is not None
        or args.shift_labels
        or args.chunk_size is not None
    )
    if not given:
        return None
    if args.loss != "crossentropy":
        raise CliError(
            "--class-axis, --ignore-index, --shift-labels and --chunk-size shape --loss "
            f"crossentropy, not --loss {args.loss}.",
            EXIT_USAGE,
        )
    from onnxblocks.hub.losses import IGNORE_INDEX, ShiftedCrossEntropyLoss
    from onnxblocks.losses import CrossEntropyLoss

    if args.shift_labels:
        ignore = IGNORE_INDEX if args.ignore_index is None else args.ignore_index
        return ShiftedCrossEntropyLoss(ignore, args.chunk_size)
    return CrossEntropyLoss(
        ignore_index=args.ignore_index,
        class_axis=1 if args.class_axis is None else args.class_axis,
        chunk_size=args.chunk_size,
    )


def run_hub_artifacts(args: argparse.Namespace, optimizer: Any) -> int:
    """``onnxblocks artifacts HUB_DIR``: :func:`~onnxblocks.hub.from_hub` and a summary."""
    from onnxblocks.cli.lora_spec import lora_config
    from onnxblocks.hub import from_hub, read_record

    if args.loss not in (None, "crossentropy"):
        raise CliError(
            f"a hub folder trains with its task's cross entropy, not --loss {args.loss}; drop "
            "--loss, or pass an .onnx file.",
            EXIT_USAGE,
        )
    lora = lora_config(args.lora) if args.lora is not None else None
    options: dict[str, Any] = {}
    if args.ignore_index is not None:
        options["ignore_index"] = args.ignore_index
    result = from_hub(
        args.model,
        args.output_dir,
        task=args.task or "auto",
        lora=lora,
        portable=args.portable,
        file=args.file,
        chunk_size=args.chunk_size,
        optimizer=optimizer,
        prefix=args.prefix,
        **options,
    )
    record = read_record(result.directory)
    out = sys.stdout
    out.write(f"wrote training artifacts to {result.directory} from {record.source_file}\n")
    out.write(
        f"task: {record.task}{' (with past key values)' if record.with_past else ''}; "
        f"trainable: {len(result.requires_grad)} parameters\n"
    )
    out.write(f"inputs: {', '.join(result.input_names)}\n")
    out.write(
        f"next: onnxblocks train {result.directory} --text FILE.txt --tokenizer {args.model} "
        "--seq-len 128 --epochs 1\n"
    )
    return EXIT_OK


def add_train_options(group: Any) -> None:
    """``onnxblocks train``'s text options (beside ``--data``)."""
    group.add_argument(
        "--text",
        default=None,
        metavar="FILE.txt",
        help="train a language model on this UTF-8 text (with --tokenizer and --seq-len), "
        "instead of --data",
    )
    group.add_argument(
        "--tokenizer",
        default=None,
        metavar="HUB_DIR",
        help="with --text: the hub folder with tokenizer.json",
    )
    group.add_argument(
        "--seq-len", type=int, default=None, metavar="N", help="with --text: tokens per window"
    )


def text_batches(args: argparse.Namespace) -> Any:
    """The :class:`~onnxblocks.hub.TextBatches` of ``--text``, checked.

    Raises:
        CliError: for a missing ``--tokenizer``/``--seq-len``, or a text the tokenizer refuses.
    """
    from onnxblocks._core.errors import OnnxBlocksError
    from onnxblocks.hub import TextBatches

    if args.tokenizer is None or args.seq_len is None:
        raise CliError("--text needs --tokenizer HUB_DIR and --seq-len N.", EXIT_USAGE)
    if not os.path.isfile(args.text):
        raise CliError(f"--text {args.text!r} is not a file.", EXIT_INPUT)
    try:
        return TextBatches(
            Path(args.text),
            args.tokenizer,
            args.seq_len,
            args.batch_size,
            artifacts=args.directory,
            shuffle=not args.no_shuffle,
            seed=args.seed,
        )
    except OnnxBlocksError as exc:
        raise CliError(f"--text {args.text}: {exc}", EXIT_INPUT) from None

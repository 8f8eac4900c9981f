"""``onnxblocks export-hub``: trained artifacts written as a hub folder for Transformers.js and
transformers (docs/hub.md, "The way back").
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from onnxblocks.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from onnxblocks.cli.subcommand import subcommand

EXAMPLES = """\
examples:
  onnxblocks export-hub artifacts out --checkpoint trained.ckpt
  onnxblocks export-hub artifacts out --checkpoint trained.ckpt --quantize q8,q4
  onnxblocks export-hub artifacts out --quantize none --no-safetensors --into hub-with-past

The artifacts must come from a hub folder (onnxblocks.hub.from_hub writes hub.json beside them),
or name one with --source. OUT_DIR must be new or empty."""

_CHOICES = ("q8", "q4")


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``export-hub`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "export-hub",
        help="write trained artifacts as a hub folder (Transformers.js, transformers)",
        description="Write the trained model of ARTIFACTS as a hub folder: config and tokenizer "
        "files of the source folder, onnx/model.onnx with the trained weights, quantized files, "
        "and model.safetensors under Hugging Face's names.",
        examples=EXAMPLES,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS", help="artifact directory")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the hub folder to write (new or empty)")
    parser.add_argument("--checkpoint", help="the trained checkpoint (default: the artifacts')")
    parser.add_argument(
        "--quantize",
        default="q8",
        help="quantized files to add, comma-separated: q8 (model_quantized.onnx), q4 "
        "(model_q4.onnx), or none (default: q8)",
    )
    parser.add_argument(
        "--no-safetensors", action="store_true", help="do not write model.safetensors"
    )
    parser.add_argument(
        "--keep-adapters",
        action="store_true",
        help="LoRA: keep the adapters apart (adapter_model.safetensors) instead of merging them",
    )
    parser.add_argument("--into", help="another hub folder of the same model to write into")
    parser.add_argument(
        "--source", help="the hub folder the artifacts came from (default: hub.json)"
    )
    parser.set_defaults(handler=run)


def _quantize(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [q for q in chosen if q not in _CHOICES]
    if unknown:
        raise CliError(
            f"--quantize: unknown {', '.join(unknown)}; use q8, q4, q8,q4 or none.", EXIT_USAGE
        )
    return chosen


def run(args: argparse.Namespace) -> int:
    """Open the session and export."""
    from onnxblocks.runtime import TrainingSession

    quantize = _quantize(args.quantize)
    session = TrainingSession(args.artifacts, checkpoint=args.checkpoint)
    out = session.export_hub(
        args.out_dir,
        quantize=quantize,
        safetensors=not args.no_safetensors,
        merge_adapters=not args.keep_adapters,
        into=args.into,
        source=args.source,
    )
    sys.stdout.write(f"wrote {out}\n")
    return EXIT_OK

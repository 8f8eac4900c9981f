"""``onnxblocks demo``: run :func:`onnxblocks.demo.run_demo`."""

from __future__ import annotations

import argparse
from typing import Any

from onnxblocks.cli.errors import EXIT_FAILURE, EXIT_OK, CliError
from onnxblocks.cli.paths import output_dir, require
from onnxblocks.cli.subcommand import subcommand

EXAMPLES = """\
examples:
  onnxblocks demo                          # writes ./onnxblocks-demo/
  onnxblocks demo --output-dir /tmp/demo --no-progress
  onnxblocks demo --portable               # portable artifacts, trained by the portable backend
  onnxblocks demo --web                    # the same classifier trained in your browser
  onnxblocks demo --lora                   # LoRA on a small LLaMA (needs torch, transformers)
  onnxblocks demo --lora --web             # the same in your browser, adapters saved for peft"""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``demo`` subcommand."""
    from onnxblocks.demo import DEFAULT_OUTPUT_DIR, TARGET_ACCURACY

    parser = subcommand(
        commands,
        parents,
        "demo",
        help="train a small classifier end to end (no torch, no downloads)",
        description="Build a small MLP with onnx.helper, compose a custom loss from blocks, "
        "generate artifacts, "
        "train on a built-in 3-class spiral dataset with a progress bar, save the loss curve as "
        "PNG, "
        f"export the inference model and check it with onnxruntime (target accuracy "
        f">= {TARGET_ACCURACY}). Takes seconds on a laptop CPU.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        metavar="DIR",
        help=f"where to write the files (default ./{DEFAULT_OUTPUT_DIR})",
    )
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (default 30)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of data, weights and batch order (default 0)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--plot-backend",
        choices=("auto", "builtin", "matplotlib"),
        default="auto",
        help="renderer of the loss curve (default: matplotlib if installed, else built-in)",
    )
    parser.add_argument(
        "--portable",
        action="store_true",
        help="generate portable artifacts (standard ops, fused step model) and train them on the "
        "portable backend",
    )
    parser.add_argument(
        "--web",
        action="store_true",
        help="instead, write a page that trains the classifier in the browser (onnxruntime-web, "
        "WASM) and serve it "
        "on 127.0.0.1 until Ctrl-C (docs/web.md; the first run npm-installs onnxruntime-web into "
        "a cache)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="instead, pre-train a small LLaMA-architecture LM in torch on a synthetic language, "
        "fine-tune LoRA "
        "adapters on a shifted task with onnxblocks, write them as a PEFT directory, merge them "
        "and generate text "
        "with onnxruntime (docs/lora.md; needs torch and transformers: pip install "
        "'onnxblocks[torch]' transformers)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="with --web: the port (default 8000, another if taken; 0: any free)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 1 if it misses its accuracy target."""
    from onnxblocks.demo import TARGET_ACCURACY, run_demo

    if args.epochs < 1:
        raise CliError(f"--epochs must be >= 1, got {args.epochs}.", 2)
    require(args.seed, "--seed", minimum=0)
    output_dir(args.output_dir, "--output-dir")
    if args.lora:
        return _run_lora(args)
    if args.web:
        from onnxblocks.web.demo import run_web_demo

        require(args.port, "--port", minimum=0)
        run_web_demo(args.output_dir, epochs=args.epochs, seed=args.seed, port=args.port)
        return EXIT_OK
    result = run_demo(
        args.output_dir,
        epochs=args.epochs,
        seed=args.seed,
        progress=not args.no_progress,
        plot_backend=args.plot_backend,
        portable=args.portable,
    )
    if not result.passed:
        raise CliError(
            f"the demo reached validation accuracy {result.eval_accuracy:.3f} (inference model: "
            f"{result.inference_accuracy:.3f}); the target is {TARGET_ACCURACY}. Try more "
            "--epochs.",
            EXIT_FAILURE,
        )
    return EXIT_OK


#: What ``demo --lora`` imports besides onnxblocks, and how to get it.
LORA_NEEDS = {"torch": "torch==2.13.0", "transformers": "transformers"}


def _run_lora(args: argparse.Namespace) -> int:
    """Run the LoRA demo (``onnxblocks.torch.lora_demo`` or ``lora_web``) in a child Python: the
    CLI loads no torch.
    """
    import importlib.util
    import subprocess
    import sys

    from onnxblocks.demo import DEFAULT_OUTPUT_DIR

    missing = [name for name in LORA_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        install = " ".join(LORA_NEEDS[name] for name in missing)
        raise CliError(
            f"demo --lora builds and pre-trains its LLaMA with {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: pip install {install} (torch "
            "pinned in the same "
            "command). The fine-tune itself runs on ONNX Runtime.",
            EXIT_FAILURE,
        )
    directory = args.output_dir if args.output_dir != DEFAULT_OUTPUT_DIR else "onnxblocks-lora-demo"
    module = "onnxblocks.torch.lora_web" if args.web else "onnxblocks.torch.lora_demo"
    command = [sys.executable, "-m", module, "--output-dir", directory, "--seed", str(args.seed)]
    if args.web:
        require(args.port, "--port", minimum=0)
        command += ["--port", str(args.port)]
    elif args.portable:
        command.append("--portable")
    done = subprocess.run(command, check=False)
    return EXIT_OK if done.returncode == 0 else EXIT_FAILURE

"""``onnxblocks federate``: a federation on Flower's deployment engine on localhost, one SuperNode
per data file.

The command writes a Flower app (:mod:`onnxblocks.federated.project`) whose ServerApp starts from
the artifacts' checkpoint, starts a SuperLink and one SuperNode per ``--client-data`` file with
Flower's own commands (:mod:`onnxblocks.federated.deployment`), runs the app with ``flwr run``,
and stops every process it started: on success, on error and on Ctrl-C or SIGTERM (exit 130). Both
signals stop it from its first line on, even when the shell that started it had them ignored
(:mod:`onnxblocks._core.interrupts`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from onnxblocks._core.interrupts import stop_on_signals
from onnxblocks.cli import federate_js
from onnxblocks.cli.errors import EXIT_FAILURE, EXIT_INPUT, EXIT_OK, EXIT_USAGE, CliError
from onnxblocks.cli.paths import output_dir, output_file, require
from onnxblocks.cli.subcommand import subcommand

STRATEGIES = ("fedavg", "fedprox", "fedadam", "fedyogi")

EXAMPLES = """\
examples:
  # two clients, each with its own data, FedAvg for 5 rounds; checkpoint, inference model, history
  onnxblocks federate artifacts --client-data a.npz --client-data b.npz --rounds 5 \\
      --local-epochs 1 --batch-size 32 --lr 0.05 --strategy fedavg --save ckpt \\
      --export model.onnx --history history.json
  # FedProx, batches in file order (reproducible), a client over 60 s is dropped from its round
  onnxblocks federate artifacts --client-data a.npz --client-data b.npz --strategy fedprox \\
      --proximal-mu 0.1 --no-shuffle --round-timeout 60 --save ckpt
  # one client on the training build, one under Python 3.13 (stock onnxruntime, portable artifacts)
  onnxblocks federate artifacts --client-data a.npz --client-data b.npz \\
      --client-artifacts artifacts --client-artifacts portable-artifacts \\
      --client-python python3.11 --client-python /venvs/py313/bin/python --save ckpt

Every process's log is kept in the run directory (--run-dir; by default a temporary one, removed
after a run that succeeded and named in the error of one that failed)."""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``federate`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "federate",
        help="federated training on Flower's deployment engine on localhost",
        description="Train the artifacts of ARTIFACTS federatedly: a Flower SuperLink and one "
        "SuperNode per "
        "--client-data file on 127.0.0.1, started with Flower's own commands and stopped when "
        "the run ends "
        "(also on Ctrl-C). The server starts from the artifacts' checkpoint and aggregates with "
        "one of Flower's "
        'strategies. Needs Flower: pip install "onnxblocks[flower]".',
        examples=EXAMPLES,
    )
    parser.add_argument(
        "directory", metavar="ARTIFACTS", help="artifact directory (the server's global model)"
    )
    clients = parser.add_argument_group("clients (one SuperNode each)")
    clients.add_argument(
        "--client-data",
        action="append",
        default=[],
        metavar="FILE.npz",
        help="a Python client's training data in 'onnxblocks train' format; repeat once per client",
    )
    clients.add_argument(
        "--client-artifacts",
        action="append",
        metavar="DIR",
        help="the artifacts a client trains (default ARTIFACTS): once for all clients or once per "
        "client, "
        "e.g. portable artifacts of the same model for a client on stock onnxruntime",
    )
    clients.add_argument(
        "--client-python",
        action="append",
        metavar="PY",
        help="the interpreter a client's SuperNode runs under (default this one): once for all "
        "clients or once "
        "per client; onnxblocks and flwr must be importable there",
    )
    clients.add_argument(
        "--backend",
        choices=("auto", "training", "portable"),
        default="auto",
        help="the clients' and server's engine (default auto: portable artifacts on the portable "
        "backend)",
    )
    training = parser.add_argument_group("training")
    training.add_argument("--rounds", type=int, default=3, help="federated rounds (default 3)")
    training.add_argument(
        "--local-epochs", type=int, default=1, help="client epochs per round (default 1)"
    )
    training.add_argument(
        "--local-steps",
        type=int,
        default=None,
        help="exact client optimizer steps per round instead of epochs",
    )
    training.add_argument(
        "--batch-size", type=int, default=32, help="client batch size (default 32)"
    )
    training.add_argument(
        "--lr", type=float, default=None, help="client learning rate (default: the artifacts')"
    )
    training.add_argument(
        "--strategy", choices=STRATEGIES, default="fedavg", help="Flower strategy (default fedavg)"
    )
    training.add_argument(
        "--proximal-mu", type=float, default=None, help="FedProx's mu (with --strategy fedprox)"
    )
    training.add_argument(
        "--server-lr", type=float, default=None, help="FedAdam's and FedYogi's server learning rate"
    )
    training.add_argument(
        "--no-shuffle", action="store_true", help="take batches in file order (reproducible runs)"
    )
    training.add_argument(
        "--seed", type=int, default=0, help="seed of the clients' shuffling (default 0)"
    )
    training.add_argument(
        "--round-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for a round's replies; a client later than that is dropped from the "
        "round",
    )
    training.add_argument(
        "--straggler-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a round still waits for missing replies once its first reply came",
    )
    training.add_argument(
        "--min-clients",
        type=int,
        default=None,
        help="clients to wait for and sample each round (default: all of them)",
    )
    training.add_argument(
        "--fraction-evaluate",
        type=float,
        default=None,
        metavar="F",
        help="fraction of the clients that evaluate the global model on their data each round "
        "(default 1; 0: none)",
    )
    training.add_argument(
        "--eval-data", metavar="FILE.npz", help="held-out data the server evaluates on each round"
    )
    federate_js.add_arguments(parser)
    outputs = parser.add_argument_group("outputs")
    outputs.add_argument("--save", required=True, metavar="CKPT", help="the final checkpoint")
    outputs.add_argument("--export", metavar="MODEL.onnx", help="the final inference model")
    outputs.add_argument(
        "--history", metavar="H.json", help="per-round metrics and dropped clients (JSON)"
    )
    outputs.add_argument(
        "--run-dir", metavar="DIR", help="where the Flower app, its config and every log go (kept)"
    )
    outputs.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds the whole run may take (default: no limit, or rounds x 3 x --round-timeout "
        "+ 300)",
    )
    parser.set_defaults(handler=run)


def _per_client(values: list[str] | None, count: int, option: str) -> list[str | None]:
    if not values:
        return [None] * count
    if len(values) == 1:
        return [values[0]] * count
    if len(values) != count:
        raise CliError(
            f"{option} is given {len(values)} times for {count} --client-data files: give it "
            "once (for every client) "
            "or once per client, in the same order.",
            EXIT_USAGE,
        )
    return list(values)


def _check(args: argparse.Namespace) -> None:
    federate_js.check(args)
    if not args.client_data and federate_js.count(args) == 0:
        raise CliError(
            "no clients: give --client-data (Python), --node-client (Node) or --web-clients "
            "(browsers).",
            EXIT_USAGE,
        )
    for option in ("rounds", "local_epochs", "batch_size", "local_steps", "min_clients"):
        require(getattr(args, option), f"--{option.replace('_', '-')}", minimum=1)
    for option in ("lr", "round_timeout", "straggler_timeout", "timeout", "server_lr"):
        require(getattr(args, option), f"--{option.replace('_', '-')}", above=0)
    require(args.proximal_mu, "--proximal-mu", minimum=0)
    require(args.seed, "--seed", minimum=0)
    require(args.fraction_evaluate, "--fraction-evaluate", minimum=0)
    if args.fraction_evaluate is not None and args.fraction_evaluate > 1:
        raise CliError(
            f"--fraction-evaluate must be between 0 and 1, got {args.fraction_evaluate}.",
            EXIT_USAGE,
        )
    if args.proximal_mu is not None and args.strategy != "fedprox":
        raise CliError(
            "--proximal-mu is FedProx's: add --strategy fedprox (or drop --proximal-mu).",
            EXIT_USAGE,
        )
    if args.server_lr is not None and args.strategy not in ("fedadam", "fedyogi"):
        raise CliError(
            "--server-lr is FedAdam's and FedYogi's: add --strategy fedadam or fedyogi.", EXIT_USAGE
        )
    total = len(args.client_data) + federate_js.count(args)
    if args.min_clients is not None and args.min_clients > total:
        raise CliError(
            f"--min-clients {args.min_clients} is more than the {total} clients.",
            EXIT_USAGE,
        )
    from onnxblocks.runtime.layout import ArtifactFiles

    for directory in [args.directory, *(args.client_artifacts or [])]:
        if not Path(directory).is_dir():
            raise CliError(
                f"artifact directory {directory} does not exist (or is not a directory).",
                EXIT_INPUT,
            )
        # checked here, before Flower starts: a server or client failing on it would cost a whole
        # start-up
        try:
            ArtifactFiles.find(directory, "")
        except FileNotFoundError as exc:
            raise CliError(str(exc), EXIT_INPUT) from None
    for data in [*args.client_data, *([args.eval_data] if args.eval_data else [])]:
        if not Path(data).is_file():
            raise CliError(f"data file {data} does not exist (or is not a file).", EXIT_INPUT)
    for python in args.client_python or []:
        if shutil.which(python) is None:
            raise CliError(
                f"--client-python {python}: no such interpreter (give a path or a name on PATH).",
                EXIT_INPUT,
            )
    for value, option in (
        (args.save, "--save"),
        (args.export, "--export"),
        (args.history, "--history"),
    ):
        output_file(value, option, create_parents=True)
    output_dir(args.run_dir, "--run-dir")


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Flower app's run config for ``args`` (keys of
    ``onnxblocks.federated.server.ServerSettings``).
    """
    config: dict[str, Any] = {
        "artifacts": os.path.abspath(args.directory),
        "backend": args.backend,
        "num-server-rounds": args.rounds,
        "strategy": args.strategy,
        "local-epochs": args.local_epochs,
        "batch-size": args.batch_size,
        "shuffle": not args.no_shuffle,
        "seed": args.seed,
        "min-nodes": args.min_clients or len(args.client_data) + federate_js.count(args),
        "save": os.path.abspath(args.save),
    }
    optional = {
        "lr": args.lr,
        "local-steps": args.local_steps,
        "proximal-mu": args.proximal_mu,
        "server-lr": args.server_lr,
        "round-timeout": args.round_timeout,
        "straggler-timeout": args.straggler_timeout,
        "fraction-evaluate": args.fraction_evaluate,
        "eval-data": os.path.abspath(args.eval_data) if args.eval_data else None,
        "export": os.path.abspath(args.export) if args.export else None,
        "history": os.path.abspath(args.history) if args.history else None,
    }
    config.update({key: value for key, value in optional.items() if value is not None})
    return config


def run(args: argparse.Namespace) -> int:
    """Run ``onnxblocks federate``."""
    with (
        stop_on_signals()
    ):  # before Flower's slow import: a signal at any point stops the command with 130
        return _federate(args)


def _federate(args: argparse.Namespace) -> int:
    _check(args)
    count = len(args.client_data)
    artifacts = _per_client(args.client_artifacts, count, "--client-artifacts")
    pythons = _per_client(args.client_python, count, "--client-python")
    try:
        from onnxblocks.federated.deployment import LocalDeployment, NodeSpec
        from onnxblocks.federated.project import write_app
    except (
        ImportError
    ) as exc:  # Flower is an optional extra (MissingDependencyError says how to install it)
        message = (
            str(exc)
            if "onnxblocks[flower]" in str(exc)
            else f'{exc}: pip install "onnxblocks[flower]"'
        )
        raise CliError(f"onnxblocks federate needs Flower. {message}", EXIT_FAILURE) from None

    keep = args.run_dir is not None
    run_dir = Path(args.run_dir) if keep else Path(tempfile.mkdtemp(prefix="onnxblocks-federate-"))
    config = run_config(args)
    if args.history is None:  # the summary below reads it
        config["history"] = os.fspath((run_dir / "history.json").resolve())
    nodes = []
    for i, data in enumerate(args.client_data):
        node_config: dict[str, Any] = {"data-path": os.path.abspath(data), "partition-id": i}
        own = artifacts[i]
        if own is not None:
            node_config["artifacts"] = os.path.abspath(own)
        chosen = pythons[i]
        python = shutil.which(chosen) if chosen is not None else None
        nodes.append(NodeSpec(node_config, python=python))
    timeout = args.timeout
    if timeout is None:
        timeout = (
            args.rounds * 3 * args.round_timeout + 300 if args.round_timeout else 7 * 24 * 3600.0
        )
    app = write_app(run_dir / "app", config)
    total = count + federate_js.count(args)
    print(f"federating {args.directory}: {total} clients, {args.rounds} rounds of {args.strategy}")
    print(f"logs in {run_dir / 'logs'}")
    with federate_js.javascript_clients(args, run_dir, count) as bridges:
        nodes += [NodeSpec(bridge) for bridge in bridges]
        with LocalDeployment(nodes, run_dir) as deployment:
            outcome = deployment.run(app, timeout=timeout)
    if not outcome.ok:
        raise CliError(
            f"the federated run ended with status {outcome.status} ({outcome.details}); the logs "
            "are in "
            f"{run_dir / 'logs'} (the ServerApp's in {outcome.log}).",
            EXIT_FAILURE,
        )
    missing = [
        path for path in (args.save, args.export) if path is not None and not Path(path).exists()
    ]
    if missing:
        raise CliError(
            f"the run completed but did not write {', '.join(missing)}; see {outcome.log}.",
            EXIT_FAILURE,
        )
    _summary(Path(config["history"]), outcome.seconds)
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return EXIT_OK


def _summary(history_path: Path, seconds: float) -> None:
    try:
        history = json.loads(history_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        print(f"done in {seconds:.1f} s")
        return
    for row in history.get("train", []):
        metrics = ", ".join(
            f"{k} {v:.4g}" for k, v in row.items() if k != "round" and isinstance(v, (int, float))
        )
        print(f"round {row.get('round')}: {metrics}")
    for row in history.get("dropped", []):
        print(
            f"round {row.get('round')}: dropped client {row.get('node')} ({row.get('phase')}): "
            f"{row.get('reason')}",
            file=sys.stderr,
        )
    print(f"done in {seconds:.1f} s")

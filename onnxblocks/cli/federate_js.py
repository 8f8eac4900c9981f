"""JavaScript clients of ``onnxblocks federate``: Node processes and browser tabs behind bridges.

Each JavaScript client gets a SuperNode of its own whose node config names a slot of the relay
(:mod:`onnxblocks.federated.relay`, served from this process for the whole run): ``--node-client
FILE.npz`` starts ``onnxblocks-train --federate SLOT --data FILE.npz`` in Node, ``--web-clients N``
serves a page at the relay's address where each open tab claims a slot and trains on its own data.
Both train the portable artifacts ``--web-artifacts`` (default ARTIFACTS), fetched from the relay.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onnxblocks.cli.errors import EXIT_INPUT, EXIT_USAGE, CliError
from onnxblocks.cli.paths import require

#: The artifact files a JavaScript client fetches (``base_weights.bin`` when the models name it).
JS_FILES = ("step_model.onnx", "eval_model.onnx", "params.safetensors", "base_weights.bin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The JavaScript clients' options of ``onnxblocks federate``."""
    group = parser.add_argument_group("JavaScript clients (one bridge SuperNode each)")
    group.add_argument(
        "--node-client",
        action="append",
        metavar="FILE.npz",
        help="a Node client (onnxblocks-train --federate) training on this file; repeat once per "
        "client",
    )
    group.add_argument(
        "--web-clients",
        type=int,
        default=0,
        metavar="N",
        help="browser clients: the page the relay serves, opened in N tabs (each tab one client)",
    )
    group.add_argument(
        "--web-artifacts",
        metavar="DIR",
        help="the portable artifacts the JavaScript clients train (default ARTIFACTS)",
    )
    group.add_argument(
        "--web-port",
        type=int,
        default=0,
        help="the relay's port on 127.0.0.1 (default: a free one)",
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds without a beat after which a JavaScript client is dropped from its round",
    )


def count(args: argparse.Namespace) -> int:
    """How many JavaScript clients ``args`` asks for."""
    return len(args.node_client or []) + int(args.web_clients or 0)


def check(args: argparse.Namespace) -> None:
    """Refuse what cannot work before anything starts."""
    require(args.web_clients, "--web-clients", minimum=0)
    require(args.web_port, "--web-port", minimum=0)
    require(args.heartbeat_timeout, "--heartbeat-timeout", above=0)
    if count(args) == 0:
        return
    if args.strategy == "fedprox":
        raise CliError(
            "JavaScript clients cannot train FedProx's proximal term (their fused step has none): "
            "use --strategy fedavg, fedadam or fedyogi.",
            EXIT_USAGE,
        )
    directory = Path(args.web_artifacts or args.directory)
    if not (directory / "step_model.onnx").is_file():
        raise CliError(
            f"{directory} has no step_model.onnx: JavaScript clients train portable artifacts "
            "(generate_artifacts(..., portable=True)); give them with --web-artifacts.",
            EXIT_INPUT,
        )
    for data in args.node_client or []:
        if not Path(data).is_file():
            raise CliError(f"--node-client {data}: no such file.", EXIT_INPUT)
    if args.node_client and shutil.which("node") is None:
        raise CliError(
            "--node-client needs Node.js 20+ on the PATH (apt-get install nodejs npm).", EXIT_INPUT
        )


def _files(directory: Path, work: Path) -> dict[str, Path]:
    """The files the relay serves; ``params.safetensors`` written from the checkpoint if absent."""
    from onnxblocks.web import write_state

    files = {name: directory / name for name in JS_FILES if (directory / name).is_file()}
    if "params.safetensors" not in files:
        work.mkdir(parents=True, exist_ok=True)
        files["params.safetensors"] = write_state(directory, work / "params.safetensors")
    return files


def _node_workspace(run_dir: Path) -> Path:
    """The client (``bin/``, ``src/``) copied into the run directory, its cached ``node_modules``
    linked beside.
    """
    from onnxblocks.web.npm import install_js_dependencies, js_dir

    target = run_dir / "js"
    for sub in ("bin", "src"):
        shutil.copytree(js_dir() / sub, target / sub, dirs_exist_ok=True)
    shutil.copyfile(js_dir() / "package.json", target / "package.json")
    link = target / "node_modules"
    if not link.exists():
        link.symlink_to(install_js_dependencies(), target_is_directory=True)
    return target


def _site(run_dir: Path) -> Path:
    """The browser page: ``js/demo/federate.html``, the client's modules, onnxruntime-web."""
    from onnxblocks.web.site import copy_client

    site = run_dir / "site"
    site.mkdir(parents=True, exist_ok=True)
    copy_client(site, "demo/federate.html")
    return site


@contextlib.contextmanager
def javascript_clients(
    args: argparse.Namespace, run_dir: Path, first_partition: int
) -> Iterator[list[dict[str, Any]]]:
    """Serve the relay, start the Node clients; yield the bridge nodes' node configs; stop them."""
    if count(args) == 0:
        yield []
        return
    from onnxblocks.federated.relay import Relay

    run_dir = run_dir.resolve()
    kinds = ["node"] * len(args.node_client or []) + ["browser"] * int(args.web_clients)
    directory = Path(args.web_artifacts or args.directory).resolve()
    files = _files(directory, run_dir / "web")
    site = _site(run_dir) if args.web_clients else None
    processes: list[subprocess.Popen[bytes]] = []
    relay = Relay(
        kinds,
        files,
        run_dir / "relay",
        heartbeat_timeout=args.heartbeat_timeout,
        site=site,
        port=args.web_port,
    )
    with relay:
        configs = [
            {"bridge": relay.slot_url(k), "partition-id": first_partition + k, "kind": kind}
            for k, kind in enumerate(kinds)
        ]
        try:
            if args.node_client:
                js = _node_workspace(run_dir)
                (run_dir / "logs").mkdir(parents=True, exist_ok=True)
            for k, data in enumerate(args.node_client or []):
                log = (run_dir / "logs" / f"node-client-{k}.log").open("wb")
                argv = ["node", os.fspath(js / "bin" / "onnxblocks-train.mjs")]
                argv += ["--federate", relay.slot_url(k), "--data", os.path.abspath(data)]
                processes.append(
                    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=js)
                )
                log.close()
            if args.web_clients:
                print(f"browser clients: open {relay.url}/ in {args.web_clients} tab(s)")
            yield configs
        finally:
            relay.finish()  # the clients' next poll says done: they exit by themselves
            for process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

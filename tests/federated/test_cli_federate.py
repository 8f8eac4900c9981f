"""``onnxblocks federate``: a real SuperLink and SuperNodes on localhost, the numbers, the exit codes, Ctrl-C.

The exactness test is the issue's: one round of FedAvg with 3 clients, each taking E SGD steps on
batches in file order from the same global parameters, equals the row-weighted average of what 3
separate :class:`~onnxblocks.runtime.TrainingSession` runs produce (rtol 1e-5).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.federation import flower_processes, kill_flower_processes
from support.flower_apps import client_files, session_steps, spiral_artifacts
from support.numerics import assert_close, is_close

from onnxblocks.cli import main
from onnxblocks.runtime import TrainingSession

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH, LR = 3, 6, 0.1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("federate")
    return spiral_artifacts(root), client_files(root), root


def _separate_sessions(
    art: Path, files: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The row-weighted average of E SGD steps (file order) of one fresh TrainingSession per client, and the
    same average of the |values| (the sum of |terms|: the floor's scale)."""
    total: dict[str, np.ndarray] = {}
    magnitude: dict[str, np.ndarray] = {}
    rows_all = 0
    for path in files:
        params, rows = session_steps(art, path, STEPS, LR, BATCH)
        for name, value in params.items():
            total[name] = total.get(name, 0.0) + rows * value.astype(np.float64)
            magnitude[name] = magnitude.get(name, 0.0) + rows * np.abs(value.astype(np.float64))
        rows_all += rows
    return {n: v / rows_all for n, v in total.items()}, {
        n: v / rows_all for n, v in magnitude.items()
    }


def test_one_round_of_fedavg_is_the_weighted_average_of_separate_sessions(setup, capsys):
    art, files, root = setup
    out = root / "exact"
    argv = [
        "federate",
        str(art),
        *[a for f in files for a in ("--client-data", f)],
        "--rounds=1",
        f"--local-steps={STEPS}",
        f"--batch-size={BATCH}",
        f"--lr={LR}",
        "--no-shuffle",
        "--fraction-evaluate=0",
        "--strategy=fedavg",
        f"--save={out / 'ckpt'}",
        f"--export={out / 'model.onnx'}",
        f"--history={out / 'history.json'}",
        f"--run-dir={out / 'run'}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    final = TrainingSession(art, checkpoint=out / "ckpt").parameters(trainable_only=True)
    expected, terms = _separate_sessions(art, files)
    initial = TrainingSession(art).parameters(trainable_only=True)
    assert sorted(final) == sorted(expected)
    for name, value in expected.items():
        # the sessions are ours too: no float64 truth, the average computed in float64
        assert_close(final[name], value, rtol=1e-5, scale=terms[name], name=name)
        assert not is_close(final[name], initial[name], rtol=1e-5), (
            name
        )  # the round did move every parameter
    history = json.loads((out / "history.json").read_text())
    rows = sorted(
        (c["partition"], c["num-examples"]) for c in history["clients"] if c["phase"] == "train"
    )
    assert rows == [(0, 20), (1, 30), (2, 40)]
    assert history["dropped"] == []
    assert (out / "model.onnx").stat().st_size > 0
    assert flower_processes(out / "run") == []
    printed = capsys.readouterr().out
    assert "round 1: train-loss" in printed and "done in" in printed


#: How soon ``onnxblocks federate`` must exit after SIGINT or SIGTERM, with both cores busy (docs/federated.md).
STOP_LIMIT_S = 10.0

#: The CLI started with SIGINT ignored, as a non-interactive shell starts a command in the background: Python
#: then installs no KeyboardInterrupt handler, and before the command installed its own it slept through SIGINT.
_SIGINT_IGNORED = [
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
]


#: A busy loop that dies with the test process (Linux's parent-death signal), so that a test run killed
#: mid-test leaves no loop burning a core.
_BUSY_LOOP = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit()\n"
    "print(flush=True)\n"
    "while True: pass"
)


class BusyCores:
    """Two busy loops (one per core of a 2-core machine), started stopped and let go by :meth:`go`.

    The loops load the machine from just before the stop signal until the command has exited, which is
    what the limit is about; the federation starts up without them, so they burn no CPU beside the
    suite's other tests while it does.
    """

    def __init__(self) -> None:
        self.loops = []
        for _ in range(2):
            loop = subprocess.Popen(
                [sys.executable, "-c", _BUSY_LOOP, str(os.getpid())], stdout=subprocess.PIPE
            )
            loop.stdout.readline()  # its parent-death signal is set
            loop.send_signal(signal.SIGSTOP)
            self.loops.append(loop)

    def go(self) -> None:
        for loop in self.loops:
            loop.send_signal(signal.SIGCONT)
        time.sleep(0.2)  # both loops running (their interpreters started long before)
        for loop in self.loops:
            state = Path(f"/proc/{loop.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state == "R", f"a busy loop is not running (state {state})"

    def stop(self) -> None:
        for loop in self.loops:
            loop.kill()
            loop.wait()
            loop.stdout.close()


@pytest.fixture
def busy_cores():
    """:class:`BusyCores` for the test, killed after it."""
    busy = BusyCores()
    try:
        yield busy
    finally:
        busy.stop()


def _flower_commands(run_dir: Path) -> list[tuple[str, list[str]]]:
    """``(Flower command, its arguments)`` of each living process of ``run_dir``'s federation."""
    commands = []
    for line in flower_processes(run_dir):
        try:
            argv = (
                Path(f"/proc/{line.split(' ', 1)[0]}/cmdline")
                .read_bytes()
                .decode(errors="replace")
                .split("\0")
            )
        except OSError:
            continue
        # the shims run `python -c <script naming the command> ARGS...`
        named = (
            re.search(r'name="([^"]+)"', argv[2]) if argv[1:2] == ["-c"] and len(argv) > 2 else None
        )
        commands.append((named.group(1), argv[3:]) if named else (Path(argv[0]).name, argv[1:]))
    return commands


def _in_window(window: str, commands: list[tuple[str, list[str]]], clientapp_seen: bool) -> bool:
    if window == "start-up":  # the SuperLink runs, and the command waits for it to listen
        return any(name == "flower-superlink" for name, _ in commands)
    if window == "round":  # a ClientApp lives for one message only: one seen is a round that runs
        return clientapp_seen
    # the status poll: the run is submitted (no `flwr run` left) and its ServerApp lives, so the
    # command polls the SuperLink for the run's status
    submitting = any(name == "flwr" and args[:1] == ["run"] for name, args in commands)
    return not submitting and any(name == "flwr-serverapp" for name, _ in commands)


@pytest.mark.parametrize(
    ("window", "signum", "inherited"),
    [
        ("start-up", signal.SIGTERM, "default"),
        ("round", signal.SIGINT, "SIGINT ignored"),
        ("status poll", signal.SIGINT, "default"),
    ],
    ids=["start-up-SIGTERM", "round-SIGINT-inherited-ignored", "status-poll-SIGINT"],
)
def test_a_stop_signal_stops_every_flower_process_and_exits_130(
    setup, busy_cores, window, signum, inherited
):
    """SIGINT or SIGTERM to the CLI with both cores busy (the loops run from just before the signal until
    the command exited): exit 130 within 10 s, and no Flower process is left.

    The signal comes while the SuperLink starts (the process is not yet the deployment's SuperLink), while a
    ClientApp trains, or while the command polls the run's status; and once to a command started with
    SIGINT ignored, as a non-interactive shell's background job is (it slept in that poll before).
    """
    art, files, root = setup
    run_dir = root / f"stopped-{window.replace(' ', '-')}"
    launcher = _SIGINT_IGNORED if inherited == "SIGINT ignored" else []
    cmd = [
        sys.executable,
        *launcher,
        "-m",
        "onnxblocks",
        "federate",
        str(art),
        *[a for f in files[:2] for a in ("--client-data", f)],
        "--rounds=100",
        f"--save={root / 'never' / 'ckpt'}",
        f"--run-dir={run_dir}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline, reached, clientapp_seen = time.monotonic() + 300, False, False
        while time.monotonic() < deadline and process.poll() is None:
            commands = _flower_commands(run_dir)
            clientapp_seen = clientapp_seen or any(name == "flwr-clientapp" for name, _ in commands)
            reached = _in_window(window, commands, clientapp_seen)
            if reached:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        assert reached, f"the federation did not reach its {window} within 300 s"
        busy_cores.go()
        process.send_signal(signum)
        try:
            _, err = process.communicate(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            stuck = _process_report(process.pid)  # what it was doing, before it is killed
            process.kill()
            _, err = process.communicate()
            raise AssertionError(
                f"the command did not exit within {STOP_LIMIT_S:.0f} s of {signal.Signals(signum).name} "
                f"sent in its {window}: {stuck}\nstderr:\n{err}"
            ) from None
        left = flower_processes(run_dir)  # before the clean-up below, which kills whatever is left
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        kill_flower_processes(run_dir)  # never leave a federation running into the next tests
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert left == [], f"Flower processes left after the command exited: {left}"
    assert not (root / "never" / "ckpt").exists()


def _process_report(pid: int) -> str:
    """The state, threads and living children of process ``pid`` (Linux ``/proc``), for a failure message."""
    proc = Path(f"/proc/{pid}")
    try:
        state = next(
            line for line in (proc / "status").read_text().splitlines() if line.startswith("State:")
        )
        threads = len(list((proc / "task").iterdir()))
        wchan = (proc / "wchan").read_text()
    except (OSError, StopIteration):
        return "(gone)"
    children = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                children.append(
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
        except (OSError, ValueError, IndexError):
            continue
    return f"{state}, {threads} threads, waiting in {wchan!r}, children {children}"


def _args(art, files, *extra):
    return ["federate", str(art), *[a for f in files for a in ("--client-data", f)], *extra]


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--save=X", "--proximal-mu=0.1"], 2, "--strategy fedprox"),
        (["--save=X", "--server-lr=0.1"], 2, "fedadam or fedyogi"),
        (["--save=X", "--rounds=0"], 2, "--rounds must be >= 1"),
        (["--save=X", "--lr=-1"], 2, "--lr must be > 0"),
        (["--save=X", "--fraction-evaluate=2"], 2, "between 0 and 1"),
        (["--save=X", "--min-clients=9"], 2, "more than the 3 clients"),
        (
            ["--save=X", "--client-python", sys.executable, "--client-python", sys.executable],
            2,
            "once per client",
        ),
        (["--save=X", "--client-python=/no/such/python"], 3, "no such interpreter"),
        (["--save=X", "--client-artifacts=/no/such/dir"], 3, "does not exist"),
        (["--save=X", "--eval-data=/no/such.npz"], 3, "does not exist"),
        (["--save=X", "--client-artifacts=."], 3, "not a complete artifact directory"),
        ([], 2, "--save"),
    ],
)
def test_bad_options_exit_with_the_cli_codes_before_anything_starts(
    setup, capsys, extra, code, message, monkeypatch, tmp_path
):
    art, files, _ = setup
    monkeypatch.chdir(tmp_path)
    assert main(_args(art, files, *extra)) == code
    assert message in capsys.readouterr().err
    assert not (tmp_path / "X").exists()


def test_a_missing_data_file_is_an_input_error(setup, capsys, tmp_path):
    art, files, _ = setup
    assert (
        main(_args(art, [files[0], str(tmp_path / "missing.npz")], f"--save={tmp_path / 'c'}")) == 3
    )
    assert "missing.npz does not exist" in capsys.readouterr().err


def test_the_run_config_carries_every_option(setup, tmp_path):
    from onnxblocks.cli.app import build_parser
    from onnxblocks.cli.federate import run_config

    art, files, _ = setup
    args = build_parser().parse_args(
        _args(
            art,
            files,
            "--rounds=4",
            "--local-epochs=2",
            "--batch-size=8",
            "--lr=0.05",
            "--strategy=fedprox",
            "--proximal-mu=0.3",
            "--no-shuffle",
            "--round-timeout=30",
            f"--save={tmp_path / 'c'}",
        )
    )
    config = run_config(args)
    assert (
        config["num-server-rounds"] == 4
        and config["local-epochs"] == 2
        and config["batch-size"] == 8
    )
    assert config["lr"] == 0.05 and config["strategy"] == "fedprox" and config["proximal-mu"] == 0.3
    assert (
        config["shuffle"] is False and config["round-timeout"] == 30.0 and config["min-nodes"] == 3
    )
    assert config["artifacts"] == os.path.abspath(art) and config["save"] == str(tmp_path / "c")
    assert "export" not in config and "local-steps" not in config


def test_without_flower_the_command_says_how_to_install_it(setup, capsys, monkeypatch, tmp_path):
    art, files, _ = setup
    for name in [
        m for m in sys.modules if m == "flwr" or m.startswith(("flwr.", "onnxblocks.federated"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr raises ImportError
    assert main(_args(art, files, f"--save={tmp_path / 'c'}")) == 1
    err = capsys.readouterr().err
    assert 'pip install "onnxblocks[flower]"' in err and "onnxblocks federate needs Flower" in err

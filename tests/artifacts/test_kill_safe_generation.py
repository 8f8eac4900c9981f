"""A killed generate_artifacts leaves the previous complete set, or nothing; its leftovers go at the next call.

``generate_artifacts`` runs in children forked by a small server process (so each
kill costs a fork, not a Python start-up) and is SIGKILLed at random moments: 32
kills, half into a fresh directory and half over an existing set. After each kill
the directory holds the old set or the new one, complete (a fresh one: nothing,
not even an empty directory, or the new set); after the next onnxblocks call that
opens the directory (a reader, ``onnxblocks clean``, or the next writer) no
staging folder is left in it or beside it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest
from support.onnx_models import make_linear_model

from onnxblocks import LossType, OptimType, generate_artifacts
from onnxblocks.artifacts import files
from onnxblocks.cli import main as cli_main
from onnxblocks.runtime.layout import ArtifactFiles

CONFIG = {"requires_grad": ["W", "b"], "loss": LossType.L1Loss, "optimizer": OptimType.AdamW}
OLD = {"requires_grad": ["W"], "loss": LossType.MSELoss}
#: Kills wanted (generations killed before they finished); runs go on until then, up to MAX_RUNS.
KILLS, MAX_RUNS = 32, 200

_SERVER = """
import os, sys
import onnxblocks
model = sys.argv[1]
def generate(directory):
    onnxblocks.generate_artifacts(model, artifact_directory=directory, requires_grad=["W", "b"],
        loss=onnxblocks.LossType.L1Loss, optimizer=onnxblocks.OptimType.AdamW)
generate(sys.argv[2])  # warm: every module generation needs is imported before the forks
print("ready", flush=True)
for line in sys.stdin:
    directory = line.strip()
    pid = os.fork()
    if pid == 0:
        try:
            generate(directory)
        finally:
            os._exit(0)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(status, flush=True)
"""


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _stages(directory: Path) -> list[Path]:
    inside = (
        [p for p in directory.iterdir() if files.STAGE_NAME.match(p.name)]
        if directory.is_dir()
        else []
    )
    beside = [
        p
        for p in directory.parent.iterdir()
        if p.name.startswith(f".{directory.name}.onnxblocks-artifacts-")
    ]
    return inside + beside


class _Server:
    def __init__(self, model: Path, warm: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_SERVER), str(model), str(warm)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout and self.process.stdout.readline().strip() == "ready"

    def run(self, directory: Path, kill_after: float | None) -> bool:
        """Generate into ``directory``; SIGKILL after ``kill_after`` s; True if the kill landed."""
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(f"{directory}\n")
        self.process.stdin.flush()
        pid = int(self.process.stdout.readline())
        if kill_after is not None:
            time.sleep(kill_after)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        status = int(self.process.stdout.readline())
        return os.WIFSIGNALED(status)

    def close(self) -> None:
        assert self.process.stdin
        self.process.stdin.close()
        self.process.wait(timeout=60)


def test_generation_killed_at_random_points_leaves_the_old_set_or_nothing(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(make_linear_model(), model)
    old_dir, new_dir = tmp_path / "ref-old", tmp_path / "ref-new"
    generate_artifacts(str(model), artifact_directory=old_dir, **OLD)
    generate_artifacts(str(model), artifact_directory=new_dir, **CONFIG)
    old, new = _contents(old_dir), _contents(new_dir)
    server = _Server(model, tmp_path / "warm")
    try:
        durations = []
        for k in range(3):
            start = time.monotonic()
            server.run(tmp_path / f"timing{k}", None)
            durations.append(time.monotonic() - start)
        duration = sorted(durations)[1]
        rng = random.Random(20)
        kills, left_behind, outcomes = 0, 0, []
        i = -1
        while (kills < KILLS or left_behind < 5) and i < MAX_RUNS:
            i += 1
            fresh = i % 2 == 0
            directory = tmp_path / f"run{i}"
            if not fresh:
                generate_artifacts(str(model), artifact_directory=directory, **OLD)
            # a third anywhere in the run, two thirds in its second half (staging and commit come last)
            killed = server.run(
                directory,
                duration * (rng.uniform(0.0, 1.0) if i % 3 == 0 else rng.uniform(0.5, 1.0)),
            )
            kills += killed
            # right after the kill, before any cleanup: a complete set or (fresh) no directory at all
            if fresh:
                assert not directory.exists() or _contents(directory) == new, i
            left_behind += bool(_stages(directory))
            # the next call that opens the directory removes the leftovers (and rolls back a commit cut short)
            call = i % 3
            if call == 0:
                if directory.exists():
                    ArtifactFiles.find(
                        directory
                    )  # what TrainingSession and write_state open a directory with
                else:
                    with pytest.raises(FileNotFoundError):
                        ArtifactFiles.find(directory)
            elif call == 1:
                assert cli_main(["clean", str(directory)]) in (0, 3)
            else:
                generate_artifacts(str(model), artifact_directory=directory, **OLD)
                assert _contents(directory) == old
            assert _stages(directory) == [], (i, _stages(directory))
            if directory.exists():
                got = _contents(directory)
                assert got in (old, new), (i, sorted(got))
                outcomes.append("old" if got == old else "new")
            else:
                assert fresh, i
                outcomes.append("nothing")
        assert kills >= KILLS, (
            f"only {kills} of {i + 1} runs were killed before they finished ({duration:.3f} s each)"
        )
        assert left_behind >= 5, (
            f"only {left_behind} kills left a staging folder; the kills land too late"
        )
        assert (
            "nothing" in outcomes
        )  # a fresh directory killed before its rename: not even an empty directory
    finally:
        server.close()


def test_onnxblocks_clean_and_inspect_report_and_remove_leftovers(tmp_path, capsys):
    directory = tmp_path / "artifacts"
    generate_artifacts(make_linear_model(), artifact_directory=directory, **CONFIG)
    before = _contents(directory)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    inside = directory / f".onnxblocks-artifacts-{pid}-0123456789ab@{files.HOST_TAG}"
    inside.mkdir()
    (inside / "checkpoint").write_bytes(b"x" * 4096)
    beside = tmp_path / f".artifacts.onnxblocks-artifacts-{pid}-abcdef012345@{files.HOST_TAG}"
    (beside / "deep").mkdir(parents=True)
    other_host = directory / f".onnxblocks-artifacts-{pid}-fedcba987654@00000000"
    other_host.mkdir()
    live = directory / f".onnxblocks-artifacts-{os.getppid()}-aaaaaaaaaaaa@{files.HOST_TAG}"
    live.mkdir()

    found = {p.path.name: p for p in files.leftovers(directory)}
    assert sorted(found) == sorted(p.name for p in (inside, beside, other_host, live))
    assert (
        found[inside.name].stale and found[inside.name].nbytes == 4096 and found[beside.name].stale
    )
    assert not found[other_host.name].stale and not found[live.name].stale

    assert (
        cli_main(["inspect", str(directory)]) == 0
    )  # inspect opens the directory: it reports and removes
    out = capsys.readouterr().out
    assert f"staging folder {inside} (pid {pid}, 4.0 KiB): removed (its run was killed)" in out
    assert f"{live.name} (pid {os.getppid()}, 0 B): in progress" in out
    assert "another host's (kept)" in out
    assert not inside.exists() and not beside.exists() and other_host.exists() and live.exists()

    inside.mkdir()
    assert cli_main(["clean", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"{inside} (pid {pid}, 0 B): removed" in out and "kept: its run is in progress" in out
    assert "removed 1 leftover(s) of killed runs" in out
    assert not inside.exists() and _contents(directory) == before

    assert cli_main(["clean", str(tmp_path / "nothing-here")]) == 3
    assert "does not exist" in capsys.readouterr().err


def test_a_failed_generation_into_a_fresh_directory_leaves_nothing(tmp_path):
    directory = tmp_path / "a" / "b"
    with pytest.raises(OSError):
        generate_artifacts(
            make_linear_model(),
            artifact_directory=directory,
            **CONFIG,
            custom_op_library="/nope.so",
        )
    assert list(tmp_path.iterdir()) == []

"""Checkpoints under crashes and corruption, in separate processes: byte-flip fuzzing, and saves killed at any point.

* **Corruption**: one child process flips random bytes of small checkpoints 2000 times and loads each with
  ``load_checkpoint``, ``read_parameter_names`` and ``TrainingSession(checkpoint=...)``. It must not crash
  (the exit status says so, a signal included), not hang (a timeout), and raise only onnxblocks' exceptions.
* **Kills**: a save is stopped (``os._exit``, as SIGKILL would) before each file-system operation it makes, for
  every kind of replacement (inline / external data, old / new); then a loop of saves is SIGKILLed at random
  moments, for ``save_checkpoint`` and for the training session's. Afterwards the checkpoint, read by onnxblocks
  and by ONNX Runtime, is entirely the old values or entirely the new ones, and after the next save no stray
  file remains.

Run as a script, this file is the child process (``python tests/checkpoint/test_crash_and_corruption.py ROLE ...``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))  # run as a script, ``support`` comes from tests/

#: Every value of one saved set equals its number: set 1, set 2, ...
PARAMS = {"w": (64,), "b": (16,)}
#: File-system calls a save makes (the child dies just before the k-th).
MUTATIONS = ("replace", "rename", "symlink", "link", "unlink", "remove", "mkdir", "rmdir")


def values(v: float) -> dict[str, np.ndarray]:
    return {name: np.full(shape, v, np.float32) for name, shape in PARAMS.items()}


def save(path: Path, v: float, external: bool) -> None:
    from onnx import numpy_helper

    from onnxblocks.checkpoint import save_checkpoint

    params = [numpy_helper.from_array(a, n) for n, a in values(v).items()]
    save_checkpoint((params, []), path, external_data_threshold=0 if external else 2**30)


# =========================================================================== child roles
def _fuzz(art: str, bases: list[str], count: int, seed: int) -> None:
    """Flip 1-3 random bytes of each base in turn; print the outcome counts as JSON; exit 3 on a foreign error."""
    from onnxblocks.checkpoint import format as ckformat
    from onnxblocks.checkpoint import load_checkpoint, read_parameter_names
    from onnxblocks.errors import OnnxBlocksError
    from onnxblocks.runtime import TrainingSession

    rng = np.random.default_rng(seed)
    originals = []
    for base in bases:
        data = Path(base).read_bytes()
        parsed = ckformat.decode_checkpoint(data)
        payload = np.zeros(len(data), bool)
        for entry in parsed.entries():
            if entry.inline is not None:
                payload[entry.inline[0] : entry.inline[0] + entry.inline[1]] = True
        originals.append((Path(base), data, np.flatnonzero(~payload)))
    counts: dict[str, int] = {}
    target_dir = Path(bases[0]).parent / "fuzzed"
    target_dir.mkdir(exist_ok=True)
    target = target_dir / "ck"
    calls = (
        ("load_checkpoint", load_checkpoint),
        ("read_parameter_names", read_parameter_names),
        ("TrainingSession", lambda path: TrainingSession(art, checkpoint=path)),
    )
    for i in range(count):
        base, data, header = originals[i % len(originals)]
        buf = bytearray(data)
        for _ in range(rng.integers(1, 4)):
            # mostly the header (tensor bytes only change values); sometimes anywhere
            at = int(rng.choice(header)) if rng.random() < 0.85 else int(rng.integers(len(buf)))
            buf[at] = int(rng.integers(256))
        target.write_bytes(bytes(buf))
        if base.with_name(base.name + ".data").exists():
            shutil.copy(base.with_name(base.name + ".data"), target_dir / "ck.data")
        (target_dir / "last").write_bytes(bytes(buf))  # the culprit, should this process die
        for name, call in calls:
            try:
                call(target)
                outcome = "ok"
            except OnnxBlocksError as exc:
                outcome = type(exc).__name__
            except Exception as exc:  # anything else is a failure of the guard
                print(
                    json.dumps({"foreign": f"{name}: {type(exc).__name__}: {exc}", "iteration": i}),
                    flush=True,
                )
                sys.exit(3)
            counts[f"{name}: {outcome}"] = counts.get(f"{name}: {outcome}", 0) + 1
    print(json.dumps(counts), flush=True)


def _kill_points(root: str) -> None:
    """For each scenario and k: copy the scenario's start, fork a child that dies before its k-th mutation."""
    import onnxblocks.checkpoint  # noqa: F401  (imported before forking: the children only save)

    results = []
    for scenario in sorted(os.listdir(os.path.join(root, "start"))):
        old_external, new_external = (part == "ext" for part in scenario.split("-to-"))
        k = 0
        while True:
            work = Path(root, "runs", f"{scenario}-{k:02d}")
            shutil.copytree(Path(root, "start", scenario), work, symlinks=True)
            pid = os.fork()
            if pid == 0:  # the child: die just before the k-th mutation
                calls = [0]

                def dying(original, calls=calls, k=k):
                    def call(*args, **kwargs):
                        if calls[0] == k:
                            os._exit(137)
                        calls[0] += 1
                        return original(*args, **kwargs)

                    return call

                for name in MUTATIONS:
                    setattr(os, name, dying(getattr(os, name)))
                save(work / "ck", 2, new_external)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            finished = os.waitstatus_to_exitcode(status) == 0
            results.append({"dir": str(work), "scenario": scenario, "k": k, "finished": finished})
            if finished:
                break
            k += 1
        del old_external
    print(json.dumps(results), flush=True)


def _save_loop(path: str, kind: str, art: str | None) -> None:
    """Save sets 1 and 2 in turn, forever (the parent kills this process); say "ready" after the first."""
    target = Path(path)
    if kind == "session":
        from onnxblocks.runtime import TrainingSession

        session = TrainingSession(art)
        names = session.parameter_names()
        sets = [
            {n: np.full(session.get_parameter(n).shape, v, np.float32) for n in names}
            for v in (1, 2)
        ]
    i = 0
    while True:
        v = 1 + i % 2
        if kind == "session":
            session.set_parameters(sets[v - 1])
            session.save_checkpoint(target)
        else:
            save(target, v, external=True)
        if i == 0:
            print("ready", flush=True)  # a checkpoint exists: from now on each save replaces one
        i += 1


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "fuzz":
        _fuzz(rest[0], rest[1].split(","), int(rest[2]), int(rest[3]))
    elif role == "kill-points":
        _kill_points(rest[0])
    elif role == "save-loop":
        _save_loop(rest[0], rest[1], rest[2] if len(rest) > 2 else None)
    sys.exit(0)


# =========================================================================== the tests
from support.runtime_support import classification_data, generate  # noqa: E402

from onnxblocks._core.ort import capi  # noqa: E402
from onnxblocks.checkpoint import load_checkpoint  # noqa: E402
from onnxblocks.runtime import TrainingSession  # noqa: E402


def child(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS.parent,
    )


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("art"))


def test_flipping_bytes_of_checkpoints_never_crashes_or_hangs(art, tmp_path):
    session = TrainingSession(art)
    session.train_step(*classification_data())
    session.optimizer_step()
    trained = session.save_checkpoint(
        tmp_path / "trained", properties={"epoch": 1, "note": "x", "lr": 0.5}
    )
    external = tmp_path / "external"
    from onnxblocks.checkpoint import save_checkpoint

    ck = load_checkpoint(art / "checkpoint")
    save_checkpoint((dict(ck.trainable), {}), external, external_data_threshold=0)
    done = child("fuzz", str(art), f"{trained},{external}", "2000", "12", timeout=240)
    assert done.returncode == 0, (
        f"the fuzzing process ended with {done.returncode} (a negative value is the signal that killed it; the "
        f"checkpoint is in {tmp_path / 'fuzzed' / 'last'}): {done.stdout[-2000:]} {done.stderr[-2000:]}"
    )
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(counts) <= {
        f"{call}: {outcome}"
        for call in ("load_checkpoint", "read_parameter_names", "TrainingSession")
        for outcome in ("ok", "CheckpointFormatError", "CheckpointMismatchError")
    }, counts
    refused = sum(
        v for k, v in counts.items() if k.startswith("TrainingSession") and not k.endswith("ok")
    )
    opened = counts.get("TrainingSession: ok", 0)
    assert refused > 1000 and opened > 30 and refused + opened == 2000, (
        counts
    )  # both ways, every time


# --------------------------------------------------------------------------- kills
def _read_both(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The checkpoint's values read by onnxblocks and by ONNX Runtime (which reads ``<path>.data`` by name)."""
    ours = {n: np.array(a) for n, a in dict(load_checkpoint(path).trainable).items()}
    state = capi().load_checkpoint(os.fspath(path))  # (kept alive while its parameters are read)
    theirs = {
        n: np.array(state.get_parameter(n).data.numpy(), copy=True) for n in state.parameter_names()
    }
    return ours, theirs


def _one_set(
    read: dict[str, np.ndarray], expected: set[float], shapes: dict[str, tuple[int, ...]]
) -> float:
    """The one value every parameter holds entirely (old or new set), else a failure."""
    assert {n: a.shape for n, a in read.items()} == shapes, read
    held = {float(v) for a in read.values() for v in np.unique(a)}
    assert len(held) == 1 and held <= expected, f"a mixed or foreign checkpoint: {held}"
    return held.pop()


def _clean(directory: Path, name: str) -> None:
    """Only the checkpoint's own files remain: the header, its data file, and one version when versioned."""
    entries = sorted(os.listdir(directory))
    assert set(entries) <= {name, f"{name}.data", f".{name}.versions"}, entries
    versions = directory / f".{name}.versions"
    if versions.exists():
        inside = sorted(os.listdir(versions))
        assert len(inside) == 2 and "current" in inside, inside
        assert os.readlink(directory / name) == os.path.join(versions.name, "current", name)


def test_a_save_killed_before_any_of_its_steps_leaves_the_old_or_the_new_checkpoint(tmp_path):
    start = tmp_path / "start"
    for old in ("inline", "ext"):
        for new in ("inline", "ext"):
            scenario = start / f"{old}-to-{new}"
            scenario.mkdir(parents=True)
            save(scenario / "ck", 1, old == "ext")
            if old == "ext":  # the versioned layout too: a second external save
                versioned = start / f"versioned-to-{new}"
                versioned.mkdir()
                save(versioned / "ck", 0, True)
                save(versioned / "ck", 1, True)
    done = child("kill-points", str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    by_scenario: dict[str, list[dict]] = {}
    for run in runs:
        by_scenario.setdefault(run["scenario"], []).append(run)
    assert len(by_scenario) == 6 and all(runs[-1]["finished"] for runs in by_scenario.values())
    assert (
        len(by_scenario["ext-to-ext"]) >= 10
    )  # hard links, links, the version switch: a point before each
    shapes = dict(PARAMS)
    seen = set()
    for run in runs:
        path = Path(run["dir"]) / "ck"
        ours, theirs = _read_both(path)
        value = _one_set(ours, {1.0, 2.0}, shapes)
        assert _one_set(theirs, {value}, shapes) == value  # ONNX Runtime reads the same checkpoint
        if run["finished"]:
            assert value == 2.0
        seen.add((run["scenario"], value))
        save(
            path, 3, run["scenario"].endswith("ext")
        )  # the next run cleans what the killed one left
        _clean(path.parent, "ck")
        assert _one_set(_read_both(path)[1], {3.0}, shapes) == 3.0
    assert {v for s, v in seen if s == "ext-to-ext"} == {
        1.0,
        2.0,
    }  # kills left the old one, then the new one


@pytest.mark.parametrize("kind", ["save_checkpoint", "session"])
def test_saves_sigkilled_at_random_moments(art, tmp_path, kind):
    rng = np.random.default_rng(3)
    path = tmp_path / "ck"
    shapes = {n: a.shape for n, a in load_checkpoint(art / "checkpoint").trainable.items()}
    if kind == "save_checkpoint":
        shapes = dict(PARAMS)
    for attempt in range(3):
        args = [
            sys.executable,
            __file__,
            "save-loop",
            str(path),
            "ours" if kind == "save_checkpoint" else "session",
        ]
        process = subprocess.Popen(
            [*args, str(art)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            time.sleep(float(rng.uniform(0.05, 0.4)))
        finally:
            process.send_signal(signal.SIGKILL)
            process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL
        ours, theirs = _read_both(path)
        value = _one_set(ours, {1.0, 2.0}, shapes)
        assert _one_set(theirs, {value}, shapes) == value
        if kind == "save_checkpoint":
            save(path, 3, True)
        else:
            TrainingSession(art).save_checkpoint(path)
        _clean(tmp_path, "ck")
        del attempt

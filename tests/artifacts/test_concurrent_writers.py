"""Concurrent writers of artifact directories, in threads and in processes.

The family: ``generate_artifacts`` (portable and not) into one new or existing directory,
or into sibling directories under a parent not created yet, from many threads or several
processes at random start offsets, with shared and own prefixes and two configs whose sets
differ in files and bytes, while other threads and processes remove leftovers. Each call
succeeds; each set in a directory is, byte for byte, the whole set of one writer (never a
mix); nothing else is left (no staging folder, lock or temporary file). The cleaner's rule is
tested on its own: a folder is a leftover only if its owner's pid is dead *and* nobody holds
its owner record's lock, and this process's folders are known by name, however the
directory is spelled. The two-file writers that do not stage (the web state, PEFT adapters)
end with one writer's pair.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.onnx_models import make_linear_model

from onnxblocks import LossType, OptimType, generate_artifacts
from onnxblocks._core import dirlock
from onnxblocks._core.leftovers import claim, release
from onnxblocks.artifacts import files
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.cli import main as cli_main
from onnxblocks.errors import OnnxBlocksError
from onnxblocks.peft import LoraConfig, LoraInfo, LoraTarget
from onnxblocks.peft.files import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, write_adapters
from onnxblocks.safetensors import read_safetensors
from onnxblocks.web import read_state, write_state

#: Two configs whose sets differ in files (optimizer, nominal checkpoint) and in bytes.
CONFIGS = {
    "old": {"requires_grad": ["W"], "loss": LossType.MSELoss},
    "new": {
        "requires_grad": ["W", "b"],
        "loss": LossType.L1Loss,
        "optimizer": OptimType.AdamW,
        "nominal_checkpoint": True,
    },
}
#: Writers at once: the reported case (40 threads into one new directory), fewer for the
#: portable lowering, which is slower.
THREADS = {False: 40, True: 12}
JITTER_S = 0.02


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "linear.onnx"
    onnx.save(make_linear_model(), path)
    return path


@pytest.fixture(scope="module")
def references(tmp_path_factory, model_path) -> dict[tuple[str, bool], dict[str, bytes]]:
    """The bytes of each set, by (config, portable), generated one at a time (the prefix is not in them)."""
    out = {}
    for config in CONFIGS:
        for portable in (False, True):
            directory = tmp_path_factory.mktemp(f"{config}-{portable}")
            generate_artifacts(
                model_path, artifact_directory=directory, portable=portable, **CONFIGS[config]
            )
            out[config, portable] = {p.name: p.read_bytes() for p in directory.iterdir()}
    return out


def _jobs(root: Path, count: int, layout: str, seed: int) -> list[dict]:
    """``count`` writers: pairs share a prefix (the two configs compete for it), at random offsets."""
    rng = random.Random(seed)
    if layout == "same":
        directories = [root / "out"]
    else:  # siblings under one parent, which the first writer to finish creates
        directories = [root / "parent" / name for name in ("a", "b", "c")]
    return [
        {
            "directory": str(directories[i // 2 % len(directories)]),
            "prefix": f"p{i // 2}_",
            "config": ("old", "new")[i % 2],
            "delay": rng.uniform(0.0, JITTER_S),
        }
        for i in range(count)
    ]


def _run(model_path: Path, job: dict, portable: bool) -> str:
    time.sleep(job["delay"])
    try:
        generate_artifacts(
            model_path,
            artifact_directory=job["directory"],
            prefix=job["prefix"],
            portable=portable,
            **CONFIGS[job["config"]],
        )
    except OnnxBlocksError as exc:  # a clear refusal would be allowed; none is expected here
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _check(root: Path, jobs: list[dict], outcomes: list[str], references, portable: bool) -> None:
    """Each call succeeded; each set is one writer's whole set; nothing else is anywhere in ``root``."""
    failed = [(job, out) for job, out in zip(jobs, outcomes, strict=True) if out != "ok"]
    assert not failed, failed
    strays = list(root.rglob(".*"))  # staging folders, lock files, temporary files
    assert not strays, strays
    wrote: dict[tuple[str, str], set[str]] = {}
    for job in jobs:
        wrote.setdefault((job["directory"], job["prefix"]), set()).add(job["config"])
    seen: set[Path] = set()
    for (directory, prefix), configs in sorted(wrote.items()):
        names = [p for p in Path(directory).iterdir() if p.name.startswith(prefix)]
        got = {p.name[len(prefix) :]: p.read_bytes() for p in names}
        matches = [c for c in sorted(configs) if got == references[c, portable]]
        assert matches, f"{directory}/{prefix}*: {sorted(got)} is no writer's whole set"
        checkpoint = load_checkpoint(Path(directory) / f"{prefix}checkpoint")
        assert list(checkpoint.trainable) == CONFIGS[matches[0]]["requires_grad"]
        seen.update(names)
    every = {p for d in {j["directory"] for j in jobs} for p in Path(d).iterdir()}
    assert every == seen, sorted(every - seen)


def _keep_cleaning(directories: list[Path], stop: threading.Event) -> None:
    """A reader that removes leftovers while the writers write, as TrainingSession and the CLI do."""
    while not stop.is_set():
        for directory in directories:
            files.clean(directory)
            files.leftovers(directory)
        time.sleep(0.001)


# ------------------------------------------------------------------ threads
@pytest.mark.parametrize("layout", ["same", "siblings"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("portable", [False, True], ids=["ort", "portable"])
def test_threads_write_complete_sets_and_leave_nothing(
    tmp_path, model_path, references, portable, existing, layout
):
    jobs = _jobs(
        tmp_path, THREADS[portable], layout, seed=4 * portable + 2 * existing + (layout == "same")
    )
    directories = sorted({Path(j["directory"]) for j in jobs})
    if existing:  # an earlier set of each prefix, to be replaced
        for job in jobs[::2]:
            generate_artifacts(
                model_path,
                artifact_directory=job["directory"],
                prefix=job["prefix"],
                portable=portable,
                **CONFIGS["new"],
            )
    outcomes = [""] * len(jobs)

    def write(i: int) -> None:
        outcomes[i] = _run(model_path, jobs[i], portable)

    stop = threading.Event()
    cleaner = threading.Thread(target=_keep_cleaning, args=(directories, stop))
    writers = [threading.Thread(target=write, args=(i,)) for i in range(len(jobs))]
    cleaner.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    cleaner.join()
    _check(tmp_path, jobs, outcomes, references, portable)


# ------------------------------------------------------------------ processes
_WRITER = """
import json, sys, threading, time
import onnxblocks
from onnxblocks import LossType, OptimType
from onnxblocks.errors import OnnxBlocksError
model, portable, jobs = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
configs = {
    "old": {"requires_grad": ["W"], "loss": LossType.MSELoss},
    "new": {"requires_grad": ["W", "b"], "loss": LossType.L1Loss, "optimizer": OptimType.AdamW,
            "nominal_checkpoint": True},
}
outcomes = [""] * len(jobs)
def write(i):
    job = jobs[i]
    time.sleep(job["delay"])
    try:
        onnxblocks.generate_artifacts(model, artifact_directory=job["directory"], prefix=job["prefix"],
                                      portable=portable, **configs[job["config"]])
        outcomes[i] = "ok"
    except OnnxBlocksError as exc:
        outcomes[i] = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        outcomes[i] = f"UNCLEAR {type(exc).__name__}: {exc}"
print("ready", flush=True)
sys.stdin.readline()  # all processes start together; onnxruntime is first imported by the threads
threads = [threading.Thread(target=write, args=(i,)) for i in range(len(jobs))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(outcomes), flush=True)
"""
#: Writer processes, and jobs for each of the new directory, the existing one and the siblings.
PROCESSES, JOBS = 3, 6


@pytest.mark.parametrize("portable", [False, True], ids=["ort", "portable"])
def test_processes_write_complete_sets_and_leave_nothing(
    tmp_path, model_path, references, portable
):
    """Writers in three processes (threads in each) into a new directory, an existing one and
    siblings under a new parent, while this process and ``onnxblocks clean`` remove leftovers."""
    rng = random.Random(7 + portable)
    groups = ((tmp_path / "new", "same"), (tmp_path / "existing", "same"), (tmp_path, "siblings"))
    jobs = [
        job for root, layout in groups for job in _jobs(root, JOBS, layout, rng.randrange(1 << 30))
    ]
    rng.shuffle(jobs)
    existing = tmp_path / "existing" / "out"
    generate_artifacts(model_path, artifact_directory=existing, prefix="p0_", **CONFIGS["new"])
    shares = [jobs[k::PROCESSES] for k in range(PROCESSES)]
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(_WRITER),
                str(model_path),
                str(int(portable)),
                json.dumps(share),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    for w in writers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    directories = sorted({Path(j["directory"]) for j in jobs})
    stop = threading.Event()
    cleaner = threading.Thread(target=_keep_cleaning, args=(directories, stop))
    cleaner.start()
    for w in writers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    for directory in directories * 3:  # the command line's cleaner, at the same time
        assert cli_main(["clean", str(directory)]) in (0, 3)  # 3: not created yet
    outcomes = [""] * len(jobs)
    for k, w in enumerate(writers):
        out, _ = w.communicate(timeout=300)
        assert w.returncode == 0
        for i, outcome in zip(
            range(k, len(jobs), PROCESSES), json.loads(out.splitlines()[-1]), strict=True
        ):
            outcomes[i] = outcome
    stop.set()
    cleaner.join()
    _check(tmp_path, jobs, outcomes, references, portable)


# ------------------------------------------------------------------ the cleaner's rule
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_folder_whose_owner_record_is_locked_is_no_leftover(tmp_path):
    """A dead-looking pid is not enough (a pid namespace, a recycled id): the record's lock is held."""
    stage = tmp_path / f".onnxblocks-artifacts-{_dead_pid()}-0123456789ab@{files.HOST_TAG}"
    stage.mkdir()
    held = dirlock.hold(stage / files.OWNER_FILE)
    try:
        assert [found.stale for found in files.leftovers(tmp_path)] == [False]
        assert files.clean(tmp_path) == [] and stage.is_dir()
    finally:
        os.close(held)
    assert [found.stale for found in files.leftovers(tmp_path)] == [True]
    assert files.clean(tmp_path) == [stage] and list(tmp_path.iterdir()) == []


def test_a_live_writers_folder_without_its_record_yet_is_no_leftover(tmp_path):
    """Between mkdir and the owner record, the live pid in the name keeps the folder, for any cleaner."""
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    stage = tmp_path / f".onnxblocks-artifacts-{writer.pid}-0123456789ab@{files.HOST_TAG}"
    beside = (
        tmp_path.parent
        / f".{tmp_path.name}.onnxblocks-artifacts-{writer.pid}-abcdef012345@{files.HOST_TAG}"
    )
    try:
        stage.mkdir()
        beside.mkdir()
        assert files.clean(tmp_path) == []
        assert cli_main(["clean", str(tmp_path)]) == 0
        assert stage.is_dir() and beside.is_dir()
    finally:
        writer.communicate("")
    assert sorted(files.clean(tmp_path)) == sorted([stage, beside])


def test_this_processs_folders_are_known_by_name_however_the_directory_is_spelled(
    tmp_path, monkeypatch
):
    stage = tmp_path / "out" / f".onnxblocks-artifacts-{os.getpid()}-0123456789ab@{files.HOST_TAG}"
    stage.parent.mkdir()
    record = claim(stage)
    try:
        monkeypatch.chdir(tmp_path)
        for spelling in (Path("out"), Path("./out/"), tmp_path / "x" / ".." / "out"):
            assert files.clean(spelling) == [], spelling
        assert stage.is_dir()
    finally:
        release(stage, record)
    assert files.clean(Path("out")) == [Path("out") / stage.name]


# ------------------------------------------------------------------ writers that do not stage
def test_web_state_written_while_the_set_is_replaced_is_one_checkpoints(tmp_path, model_path):
    generate_artifacts(model_path, artifact_directory=tmp_path, **CONFIGS["old"])
    errors: list[BaseException] = []

    def work(i: int) -> None:
        time.sleep(random.Random(i).uniform(0.0, JITTER_S))
        try:
            if i % 2:
                write_state(tmp_path)
            else:
                generate_artifacts(
                    model_path, artifact_directory=tmp_path, **CONFIGS[("old", "new")[i % 4 // 2]]
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    state = read_state(tmp_path / "params.safetensors")
    assert sorted(state.trainable) in (["W"], ["W", "b"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_web_state_of_a_set_caught_between_old_and_new_waits_for_the_new_one(
    tmp_path, model_path, monkeypatch
):
    """The writer is held after moving the old set aside and before moving the new one in: a
    ``write_state`` of the directory then waits for the new set instead of finding no checkpoint."""
    generate_artifacts(model_path, artifact_directory=tmp_path, **CONFIGS["old"])
    aside, resume = threading.Event(), threading.Event()

    def held_swap(directory, stage, new, old):
        (stage / ".old").mkdir()
        for name in old:
            os.replace(directory / name, stage / ".old" / name)
        aside.set()
        resume.wait()
        for name in new:
            os.replace(stage / name, directory / name)

    monkeypatch.setattr(files, "_swap", held_swap)
    errors: list[BaseException] = []

    def run(call) -> None:
        try:
            call()
        except BaseException as exc:  # reported below
            errors.append(exc)

    writer = threading.Thread(
        target=run,
        args=(
            lambda: generate_artifacts(model_path, artifact_directory=tmp_path, **CONFIGS["new"]),
        ),
    )
    writer.start()
    assert aside.wait(timeout=600)
    reader = threading.Thread(target=run, args=(lambda: write_state(tmp_path),))
    reader.start()
    reader.join(timeout=1.0)  # without the lock it fails at once; with it, it waits for `resume`
    resume.set()
    writer.join()
    reader.join()
    assert errors == []
    assert sorted(read_state(tmp_path / "params.safetensors").trainable) == ["W", "b"]


def _lora(r: int) -> tuple[LoraInfo, dict[str, np.ndarray]]:
    target = LoraTarget(
        module="fc",
        weight="fc.weight",
        weight_layout="out_in",
        node="fc_matmul",
        in_features=8,
        out_features=4,
        lora_A="fc.lora_A",
        lora_B="fc.lora_B",
        scale_value=2.0,
    )
    info = LoraInfo(LoraConfig(r=r, lora_alpha=2 * r, target_modules=["fc"]), {"fc": target})
    return info, {
        "fc.lora_A": np.full((r, 8), r, np.float32),
        "fc.lora_B": np.full((4, r), r, np.float32),
    }


def test_adapters_written_at_once_are_one_writers_pair(tmp_path, monkeypatch):
    """Weights and config are two files: one writer's weights never end beside another's config.

    The rank-2 writer pauses between its two renames; the rank-4 writer starts during the pause.
    """
    directory = tmp_path / "adapters"
    directory.mkdir()
    replace = os.replace
    paused = threading.Event()

    def slow_replace(src, dst, *args, **kwargs):
        replace(src, dst, *args, **kwargs)
        if threading.current_thread().name == "rank-2" and str(dst).endswith(ADAPTER_WEIGHTS_FILE):
            paused.set()
            time.sleep(0.3)

    monkeypatch.setattr(os, "replace", slow_replace)
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            if r == 4:
                assert paused.wait(10)
            write_adapters(directory, *_lora(r))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,), name=f"rank-{r}") for r in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    r = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())["r"]
    tensors, _ = read_safetensors(directory / ADAPTER_WEIGHTS_FILE)
    assert {a.shape[0 if "lora_A" in k else 1] for k, a in tensors.items()} == {r} == {4}
    assert sorted(p.name for p in directory.iterdir()) == [
        ADAPTER_CONFIG_FILE,
        ADAPTER_WEIGHTS_FILE,
    ]

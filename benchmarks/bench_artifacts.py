"""Benchmark onnxblocks.artifacts.generate_artifacts against the reference, on models up to 830 M
parameters.

Usage::

    python benchmarks/bench_artifacts.py                      # every case, with the reference when
    installed
    python benchmarks/bench_artifacts.py --cases gpt162m-proto,import --repeat 3
    python benchmarks/bench_artifacts.py --quick --skip-reference --json out.json

The models are exported once with torch (random weights, no downloads) into
``--cache-dir`` (default ``~/.cache/onnxblocks-bench``): an MLP, a 162 M-parameter
GPT-style model in one 650 MB file, and an 834 M-parameter one whose 3.3 GB of
weights sit in one external data file. See ``bench_models.py``.

Each measurement runs in its own subprocess (``bench_worker.py``), in a fresh
empty working directory, so that peak RSS is per case and stray files are seen.
Wall time is the ``generate_artifacts`` call as a user sees it in a fresh process
whose tool module is already imported: onnxblocks imports onnxruntime lazily
inside the call, and that import is counted. Peak RSS is the process's
high-water mark (``VmHWM``), imports and the caller's model included.

Columns: wall s (median over ``--repeat`` runs), cpu s (process CPU time during
the call, all threads), peak RSS GB (the worker process's high-water mark: imports,
the caller's ``onnx.load`` and the call), import s (importing the tool's module
in the worker, before the timed call: ``onnxblocks.artifacts`` or
``onnxruntime.training.artifacts``), in-call peak GB (the high-water mark
during the call alone, the caller's model included: the kernel's mark is reset
just before the call), ratio (reference wall / onnxblocks wall), note. With
``--json FILE`` every raw measurement is written too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_models  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One benchmark case: a model, how it is handed over, and the loss."""

    id: str
    model: str | None
    input: str = "path"  # path | proto | proto-noext
    loss: str = "ce"
    reference: bool = True
    description: str = ""
    extra: tuple[str, ...] = ()


CASES: list[Case] = [
    Case("import", None, description="`import onnxblocks` (torch installed)", reference=False),
    Case("mlp", "mlp", "proto", description="MLP 1.3 M params, ModelProto"),
    Case("gpt162m-proto", "gpt162m", "proto", description="GPT 162 M, 650 MB, ModelProto"),
    Case("gpt162m-path", "gpt162m", "path", description="GPT 162 M, 650 MB, path"),
    Case(
        "gpt162m-warm",
        "gpt162m",
        "proto",
        reference=False,
        extra=("--warm-ort",),
        description="GPT 162 M, ModelProto, onnxruntime imported before the call",
    ),
    Case("gpt830m-path", "gpt830m", "path", description="GPT 834 M, 3.3 GB external data, path"),
    Case(
        "gpt830m-noext",
        "gpt830m",
        "proto-noext",
        description="GPT 834 M, ModelProto loaded with load_external_data=False + model_path",
    ),
    Case(
        "loss1", "gpt162m", "proto", loss="chain1", description="GPT 162 M, custom loss of 1 block"
    ),
    Case(
        "loss20",
        "gpt162m",
        "proto",
        loss="chain20",
        description="GPT 162 M, custom loss of 20 blocks",
    ),
    Case(
        "loss-ab",
        "gpt162m",
        "proto",
        loss="pair:chain1,chain20",
        extra=("--pair-repeat", "3"),
        description="GPT 162 M, 20-block vs 1-block loss alternated in one process (wall: "
        "20-block)",
    ),
]
QUICK = ["import", "mlp"]


@dataclass
class Row:
    """One measured (or failed) run."""

    case: str
    tool: str
    description: str
    runs: list[dict] = field(default_factory=list)
    ratio: float | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.get("ok") for r in self.runs)

    @property
    def wall(self) -> float | None:
        walls = [r["wall_s"] for r in self.runs if r.get("ok")]
        return statistics.median(walls) if walls else None

    @property
    def wall_failed(self) -> float | None:
        walls = [r.get("elapsed_s") for r in self.runs if not r.get("ok") and r.get("elapsed_s")]
        return walls[0] if walls else None

    @property
    def peak(self) -> float | None:
        peaks = [r["peak_rss_gb"] for r in self.runs if r.get("peak_rss_gb")]
        return max(peaks) if peaks else None

    @property
    def call_peak(self) -> float | None:
        peaks = [r["call_peak_rss_gb"] for r in self.runs if r.get("call_peak_rss_gb")]
        return max(peaks) if peaks else None

    @property
    def import_s(self) -> float | None:
        values = [r["import_s"] for r in self.runs if r.get("ok") and "import_s" in r]
        return statistics.median(values) if values else None

    @property
    def cpu(self) -> float | None:
        cpus = [r["cpu_s"] for r in self.runs if r.get("ok") and "cpu_s" in r]
        return statistics.median(cpus) if cpus else None


def run_worker(args: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run bench_worker.py in a fresh empty directory; report its JSON plus files it left there."""
    cwd = Path(tempfile.mkdtemp(prefix="onnxblocks-bench-cwd-"))
    cmd = [sys.executable, "-W", "ignore", str(HERE / "bench_worker.py"), *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
        )
        elapsed = time.perf_counter() - start
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if lines:
            result = json.loads(lines[-1])
        else:
            tail = proc.stderr.strip().splitlines()[-3:]
            result = {"ok": False, "error": f"worker exited {proc.returncode}: {' | '.join(tail)}"}
        if not result.get("ok"):
            result["stderr_tail"] = proc.stderr[-3000:]
    except subprocess.TimeoutExpired:
        elapsed = time.perf_counter() - start
        result = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    result["elapsed_s"] = elapsed
    left = sorted(p.name for p in cwd.iterdir())
    if left:
        sizes = sum(p.stat().st_size for p in cwd.rglob("*") if p.is_file())
        result["cwd_files"] = left
        result["cwd_bytes"] = sizes
    shutil.rmtree(cwd, ignore_errors=True)
    return result


def reference_available() -> bool:
    """Whether onnxruntime.training.artifacts can be imported (checked in a subprocess: it
    imports torch).
    """
    probe = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import onnxruntime.training.artifacts"],
        capture_output=True,
    )
    return probe.returncode == 0


def _dir_listing(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


def run_case(
    case: Case,
    tool: str,
    built: bench_models.BuiltModel | None,
    work: Path,
    repeat: int,
    timeout: float,
    profile_dir: Path | None,
    rss_trace: bool,
) -> Row:
    """Measure one case with one tool, ``repeat`` times."""
    row = Row(case.id, tool, case.description)
    for i in range(repeat):
        if case.model is None:
            result = run_worker(["--case", "import", *case.extra], timeout)
        else:
            assert built is not None
            out_dir = work / f"{case.id}-{tool}-{i}"
            extra = list(case.extra)
            if (
                tool == "reference" and "--pair-repeat" in extra
            ):  # one alternation: the reference takes minutes
                extra[extra.index("--pair-repeat") + 1] = "1"
            args = [
                "--tool",
                tool,
                "--model",
                built.path,
                "--params",
                str(Path(built.path).parent / "meta.json"),
                "--input",
                case.input,
                "--loss",
                case.loss,
                "--out-dir",
                str(out_dir),
                *extra,
            ]
            if profile_dir is not None and tool == "onnxblocks" and i == 0:
                args += ["--profile", str(profile_dir / f"{case.id}.prof")]
            if rss_trace and i == 0:
                args.append("--rss-trace")
            model_dir = Path(built.path).parent
            before = _dir_listing(model_dir)
            result = run_worker(args, timeout)
            stray = sorted(_dir_listing(model_dir) - before)
            if stray:
                result["model_dir_files"] = stray
                for name in stray:  # keep the cache clean for the next case
                    p = model_dir / name
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            shutil.rmtree(out_dir, ignore_errors=True)
        row.runs.append(result)
        if not result.get("ok"):
            break
    return row


def _note(row: Row) -> str:
    notes = []
    first = row.runs[0] if row.runs else {}
    if not row.ok:
        err = next((r.get("error", "") for r in row.runs if not r.get("ok")), "")
        notes.append(
            f"FAILED after {row.wall_failed or 0:.0f} s: {err.splitlines()[0][:120] if err else ''}"
        )
    if first.get("note"):
        notes.append(first["note"])
    if first.get("cwd_files"):
        files = ", ".join(first["cwd_files"])
        notes.append(f"left {first.get('cwd_bytes', 0) / 1e6:.0f} MB in the working dir ({files})")
    if first.get("model_dir_files"):
        notes.append(f"left files beside the model ({', '.join(first['model_dir_files'])})")
    if first.get("caller_model_unchanged") is False:
        notes.append("MUTATED the caller's model")
    if len(row.runs) > 1 and row.ok:
        walls = sorted(r["wall_s"] for r in row.runs)
        notes.append(f"median of {len(walls)} ({walls[0]:.2f}-{walls[-1]:.2f} s)")
    if row.note:
        notes.append(row.note)
    return "; ".join(notes)


def markdown(rows: list[Row], header: str) -> str:
    """The rows as a markdown table."""
    lines = [
        header,
        "",
        "| case | tool | wall s | cpu s | import s | peak RSS GB | in-call peak GB | ratio | "
        "note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]

    def fmt(x: float | None) -> str:
        return f"{x:.2f}" if x is not None else "-"

    for r in rows:
        ratio = "" if not r.ratio else f"{r.ratio:.1f}x" if r.ratio >= 1 else f"{r.ratio:.2f}x"
        lines.append(
            f"| {r.case}: {r.description} | {r.tool} | {fmt(r.wall)} | {fmt(r.cpu)} | "
            f"{fmt(r.import_s)} | "
            f"{fmt(r.peak)} | {fmt(r.call_peak)} | {ratio} | {_note(r)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", help=f"comma-separated case ids (default: all): {', '.join(c.id for c in CASES)}"
    )
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (for tests)")
    parser.add_argument(
        "--skip-reference", action="store_true", help="do not run onnxruntime.training.artifacts"
    )
    parser.add_argument(
        "--cache-dir", default=str(bench_models.DEFAULT_CACHE_DIR), help="where models are cached"
    )
    parser.add_argument(
        "--work-dir", help="where artifacts are written (default: a temp dir, removed)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per onnxblocks case (median reported)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds per run before it is killed"
    )
    parser.add_argument("--json", help="write every measurement to this JSON file")
    parser.add_argument("--profile-dir", help="write a cProfile per onnxblocks case here")
    parser.add_argument(
        "--rss-trace", action="store_true", help="sample RSS and record the stack at its peak"
    )
    args = parser.parse_args(argv)

    by_id = {c.id: c for c in CASES}
    wanted = (
        QUICK if args.quick else (args.cases.split(",") if args.cases else [c.id for c in CASES])
    )
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(by_id)}")
    cases = [by_id[w] for w in wanted]

    with_reference = not args.skip_reference and reference_available()
    if not args.skip_reference and not with_reference:
        print(
            "[bench] onnxruntime.training.artifacts is not importable: skipping the reference.",
            file=sys.stderr,
        )
    profile_dir = Path(args.profile_dir) if args.profile_dir else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    work = (
        Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="onnxblocks-bench-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    try:
        for case in cases:
            built = bench_models.ensure_model(case.model, args.cache_dir) if case.model else None
            tools = ["onnxblocks"] + (["reference"] if with_reference and case.reference else [])
            case_rows = []
            for tool in tools:
                repeat = (
                    args.repeat if tool == "onnxblocks" and not case.loss.startswith("pair:") else 1
                )
                print(f"[bench] {case.id} / {tool} ...", file=sys.stderr, flush=True)
                row = run_case(
                    case, tool, built, work, repeat, args.timeout, profile_dir, args.rss_trace
                )
                print(
                    f"[bench]   wall {row.wall} s, peak {row.peak} GB "
                    f"{'' if row.ok else row.runs[-1].get('error')}",
                    file=sys.stderr,
                    flush=True,
                )
                case_rows.append(row)
            ours = case_rows[0]
            for other in case_rows[1:]:
                if ours.wall and other.wall:
                    other.ratio = other.wall / ours.wall
                    other.note = (
                        f"onnxblocks is {other.ratio:.1f}x faster"
                        if other.ratio >= 1
                        else f"the reference is {1 / other.ratio:.1f}x faster"
                    )
                elif ours.wall and other.wall_failed:
                    other.note = f"onnxblocks succeeded in {ours.wall:.1f} s"
            rows.extend(case_rows)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    by = {(r.case, r.tool): r for r in rows}
    one, twenty = by.get(("loss1", "onnxblocks")), by.get(("loss20", "onnxblocks"))
    if one and twenty and one.wall and twenty.wall:
        twenty.note = f"{twenty.wall - one.wall:+.2f} s vs the 1-block loss"
    one_r, twenty_r = by.get(("loss1", "reference")), by.get(("loss20", "reference"))
    if one_r and twenty_r and one_r.wall and twenty_r.wall:
        twenty_r.note = (
            twenty_r.note + "; " if twenty_r.note else ""
        ) + f"{twenty_r.wall - one_r.wall:+.2f} s vs the 1-block loss"

    import onnx

    versions = f"onnx {onnx.__version__}"
    try:
        from importlib.metadata import version

        versions += f", onnxruntime-training {version('onnxruntime-training-cpu')}"
    except Exception:
        pass
    header = (
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} / {os.cpu_count()} cores / "
        f"{_mem_gb():.0f} GB RAM, Python {platform.python_version()}, {versions}.\n"
        "Command: `python benchmarks/bench_artifacts.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`"
    )
    print(markdown(rows, header))
    if args.json:
        records = [
            {
                "case": r.case,
                "tool": r.tool,
                "description": r.description,
                "ok": r.ok,
                "wall_s": r.wall,
                "cpu_s": r.cpu,
                "peak_rss_gb": r.peak,
                "call_peak_rss_gb": r.call_peak,
                "ratio": r.ratio,
                "note": _note(r),
                "runs": r.runs,
            }
            for r in rows
        ]
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0 if all(r.ok for r in rows if r.tool == "onnxblocks") else 1


def _mem_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) / 1024**2
    except OSError:
        return 0.0


if __name__ == "__main__":
    sys.exit(main())

"""What each of ragexp's direct SQLite paths buys: every tracking command through the direct path
and through MLflow, side by side in one run.

    make bench-tracking
    .venv/bin/python tests/benchmarks/bench_tracking.py [--cases 10000] [--small 35] [--repeat 3] \
        [--python /work/venv-mlflow318/bin/python]

Each command is the real CLI as a fresh process on a SQLite store in a temp folder, timed wall
clock and in CPU time, the fastest of ``--repeat``, with its peak RSS (the process's own, from ``wait4``):

- ``run`` of ``--small`` and of ``--cases`` replayed cases (every case traced: ``tracking.
  traces_max_cases`` is raised to the case count), and the large run again with
  ``tracking.traces=false``; "traces per case" is the difference of the two large runs over the
  case count;
- ``runs`` over the store (the runs this benchmark logged into it), ``diff`` of two large runs and
  ``gate gates=release_stat`` of the same pair.

"direct" is the default; "MLflow" is the same command with ``RAGEXP_SQLITE_DIRECT=0``
(:data:`SWITCH_LEAVES` says what that switch leaves to ragexp). The two sides alternate within
each repetition, each on its own store, whose first run (MLflow creates the store) is not timed.
``--python`` runs the same against another interpreter (e.g. a virtualenv with a newer MLflow and
this checkout on ``PYTHONPATH``): its stores are created by its own MLflow, and its columns are
printed beside the first. Every side must give the same diff figures, or it exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import generate

ROOT = Path(__file__).resolve().parents[2]

SWITCH_LEAVES = (
    "RAGEXP_SQLITE_DIRECT=0 sends run rows, metrics, tags, dataset inputs, artifacts and every read "
    "through MlflowClient; it does not send traces through MLflow's tracing API: ragexp still builds "
    "the trace rows itself and inserts them through MLflow's SQLAlchemy session (MLflow's public "
    "tracing path is what `make bench-traces` compares with)."
)
"""What the switch covers in ragexp/tracking/ today (store.Store._direct and TraceWriter.write)."""
MODES = {"direct": {}, "MLflow": {"RAGEXP_SQLITE_DIRECT": "0"}}
ROWS = ("run small", "run large", "runs", "diff", "gate", "traces per case")


@dataclass
class Timing:
    """The fastest wall time and CPU time (user + system) of a command's repetitions, and the
    largest peak RSS among them."""

    seconds: float = float("inf")
    cpu: float = float("inf")
    rss_mb: float = 0.0

    def add(self, seconds: float, cpu: float, rss_mb: float) -> None:
        self.seconds = min(self.seconds, seconds)
        self.cpu = min(self.cpu, cpu)
        self.rss_mb = max(self.rss_mb, rss_mb)


@dataclass
class Side:
    """One interpreter in one mode, with its own store."""

    python: str
    mode: str
    folder: Path
    times: dict[str, Timing] = field(default_factory=dict)
    pair: list[str] = field(default_factory=list)
    """Run ids of the large base and candidate runs that diff and gate compare."""
    answers: dict[str, object] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        drop = ("RAGEXP_SQLITE_DIRECT", "MLFLOW_TRACKING_URI", "PYTHONDONTWRITEBYTECODE")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        # Bytecode of every interpreter goes to one fresh folder, written by the untimed first
        # run: a virtualenv installed without it would otherwise compile MLflow in every process.
        env["PYTHONPYCACHEPREFIX"] = str(self.folder.parent / "pycache")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{self.folder}/mlruns/mlflow.db"
        return {**env, **MODES[self.mode]}

    def cli(self, *args: str, ok: tuple[int, ...] = (0,), timed: str | None = None) -> str:
        """Run ``ragexp ARGS`` as a fresh process; record it under ``timed``; return its stdout."""
        out, err = self.folder / "stdout", self.folder / "stderr"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            started = time.perf_counter()
            proc = subprocess.Popen(
                [self.python, "-m", "ragexp.cli.app", *args],
                stdout=stdout,
                stderr=stderr,
                env=self.env,
                cwd=self.folder,
            )
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in ok:
            raise SystemExit(
                f"ragexp {' '.join(args)} ({self.mode}, {self.python}): exit {proc.returncode}\n{err.read_text()}"
            )
        if timed is not None:
            cpu = usage.ru_utime + usage.ru_stime
            self.times.setdefault(timed, Timing()).add(seconds, cpu, usage.ru_maxrss / 1024)
        return out.read_text()


def mlflow_version(python: str) -> str:
    code = "from importlib.metadata import version; print(version('mlflow'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="cases of the large runs")
    parser.add_argument("--small", type=int, default=35, help="cases of the small run")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per command (the fastest counts)")
    parser.add_argument("--python", action="append", default=[], help="another interpreter to compare (repeatable)")
    args = parser.parse_args()
    pythons = [sys.executable, *args.python]
    versions = {python: mlflow_version(python) for python in pythons}
    print("Wall times are the fastest of each command's repetitions; ratios come from this one run.")
    print("This machine is shared and noisy: compare columns of the same run, not runs of different days.")
    print(f"load before: {load()}")
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-tracking-") as tmp:
        data = Path(tmp, "data")
        data.mkdir()
        small, base, cand = data / "small.jsonl", data / "base.jsonl", data / "cand.jsonl"
        generate(small, args.small, shift=0.0, seed=1)
        generate(base, args.cases, shift=0.0, seed=1)
        generate(cand, args.cases, shift=0.02, seed=2)
        sides = []
        for number, python in enumerate(pythons):
            for mode in MODES:
                folder = Path(tmp, f"{number}-{mode}")
                folder.mkdir()
                sides.append(Side(python, mode, folder))
        replay = ["provider=replay", "k=5", "--json"]
        traced = f"tracking.traces_max_cases={args.cases}"
        for side in sides:
            side.cli("run", f"dataset.path={small}", *replay)  # MLflow creates the store: not timed
        for _ in range(args.repeat):
            for side in sides:
                side.cli("run", f"dataset.path={small}", *replay, timed="run small")
                done = json.loads(side.cli("run", f"dataset.path={base}", traced, *replay, timed="run large"))
                side.pair = side.pair or [done["run_id"]]
                side.cli("run", f"dataset.path={base}", "tracking.traces=false", *replay, timed="run untraced")
        for side in sides:
            side.pair.append(json.loads(side.cli("run", f"dataset.path={cand}", traced, *replay))["run_id"])
        gate = ["gate", "--baseline", "", "--candidate", "", "gates=release_stat", "--json"]
        for _ in range(args.repeat):
            for side in sides:
                side.cli("runs", timed="runs")
                side.answers["diff"] = json.loads(side.cli("diff", *side.pair, "--json", timed="diff"))["metrics"]
                gate[2], gate[4] = side.pair
                side.cli(*gate, ok=(0, 2), timed="gate")
        runs_listed = len(json.loads(sides[0].cli("runs", "--json", "--limit", "1000"))["runs"])
    report(sides, pythons, versions, args, runs_listed)
    print(f"load after: {load()}")
    answers = [json.dumps(side.answers["diff"], sort_keys=True) for side in sides]
    if len(set(answers)) != 1:
        raise SystemExit("the sides gave different diff figures")
    print("(every side gave the same diff figures, checked)")


def report(
    sides: list[Side], pythons: list[str], versions: dict[str, str], args: argparse.Namespace, runs: int
) -> None:
    for side in sides:
        traced, untraced = side.times["run large"], side.times["run untraced"]
        per_case = 1000 / args.cases
        side.times["traces per case"] = Timing(
            (traced.seconds - untraced.seconds) * per_case, (traced.cpu - untraced.cpu) * per_case, traced.rss_mb
        )
    names = {
        "run small": f"run {args.small:,} cases",
        "run large": f"run {args.cases:,} cases",
        "runs": f"runs ({runs} runs in the store)",
        "diff": f"diff {args.cases:,} x 2",
        "gate": "gate release_stat",
        "traces per case": "traces per case (ms)",
    }
    by = {(side.python, side.mode): side for side in sides}
    print(f"\nrepeat {args.repeat} (the fastest counts); every case of the large runs traced; peak RSS in MB")
    for title, value in (("wall seconds", "seconds"), ("CPU seconds (user + system)", "cpu")):
        header = f"{title:30}"
        for python in pythons:
            header += f" | mlflow {versions[python]:8}  direct   MLflow   ratio"
            header += "  RSS direct / MLflow" if value == "seconds" else ""
        if len(pythons) > 1:
            header += f" | {versions[pythons[-1]]} vs {versions[pythons[0]]}, direct"
        print(header)
        for row in ROWS:
            line = f"{names[row]:30}"
            for python in pythons:
                direct, through = by[python, "direct"].times[row], by[python, "MLflow"].times[row]
                mine, theirs = getattr(direct, value), getattr(through, value)
                line += f" | {'':15}  {mine:6.2f}  {theirs:7.2f}  {ratio(theirs, mine):>6}"
                line += f"  {direct.rss_mb:6.0f} / {through.rss_mb:<6.0f}" if value == "seconds" else ""
            if len(pythons) > 1:
                first = getattr(by[pythons[0], "direct"].times[row], value)
                last = getattr(by[pythons[-1], "direct"].times[row], value)
                line += f" | {ratio(last, first):>6}"
            print(line)
        print()
    print("ratio: the MLflow side over the direct side (above 1: the direct path is faster); n/a where a")
    print("difference came out at or below zero (noise larger than the cost).")
    if len(pythons) > 1:
        print("the last column: the last interpreter's direct side over the first's (1.00x: as fast).")
    print(SWITCH_LEAVES)


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if numerator > 0 and denominator > 0 else "n/a"


if __name__ == "__main__":
    main()

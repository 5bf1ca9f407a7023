"""Benchmark: `ragexp diff` and `ragexp gate` on two logged 100,000-case runs, `ragexp runs`
over a store with 1,000 runs, and `ragexp --help`.

    .venv/bin/python tests/benchmarks/bench_compare.py [--cases 100000] [--runs 1000] [--repeat 3]

Both runs replay generated outputs (random ranks, citations, answers and latencies) for the same
cases, so every metric has a real paired difference. Each command is timed end to end as a
fresh process (interpreter start, imports, store, artifacts, 10,000 sign-flip draws per metric,
from which both the p-value and the inverted interval come), the median of ``--repeat`` runs.
Targets (issue 14): diff and gate <= 3 s each, runs <= 1.5 s, --help < 0.5 s. Side by side, in
the same run: the same diff and gate read through MLflow (ragexp's SQLite reader switched off,
as for a store it does not know), and a bare `python -c "import numpy"` as the floor.

``--against REF`` adds an A/B on the same store: the same diff and gate run by the source tree of
git commit REF (``git archive`` into the temporary folder; the same interpreter and packages,
that tree first on ``PYTHONPATH``) and by this tree, alternating which goes first in each
repetition, with each command's median ratio (this tree / REF) of wall time and of CPU time.
The Makefile passes the commit before issue 45's pairing (``make bench-compare BENCH_AGAINST=``
leaves the A/B out); ``--ab-only`` times nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runs import fill_store, time_runs

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
HERE = Path(__file__).resolve().parents[2]
TARGETS = {"diff": 3.0, "gate": 3.0, "runs": 1.5, "help": 0.5}


def generate(path: Path, count: int, *, shift: float, seed: int) -> None:
    rng = random.Random(seed)
    labels = random.Random(0)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            relevant = [f"d{i}-{j}" for j in range(labels.randint(1, 3))]
            ranked = [f"n{i}-{j}" for j in range(10)]
            for doc in relevant:
                if rng.random() < 0.85 - shift:
                    ranked.insert(rng.randrange(0, 6), doc)
            cited = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
            correct = rng.random() < 0.8 - shift
            row = {
                "id": f"c{i}",
                "question": f"q{i}",
                "relevant_ids": relevant,
                "expected_facts": [f"f{i}"],
                "response": f"f{i}" if correct else "no",
                "retrieved_ids": ranked,
                "citations": cited,
                "latency_seconds": round(rng.lognormvariate(0, 0.5 + shift), 4),
            }
            out.write(json.dumps(row) + "\n")


def run(cmd: list[str], env: dict[str, str], cwd: Path = HERE) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    return time.perf_counter() - started, done


def timed(cmd: list[str], env: dict[str, str], repeat: int, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    """Median wall time of ``repeat`` fresh processes, and the last one's stdout."""
    walls, out = [], ""
    for _ in range(repeat):
        wall, done = run(cmd, env)
        if done.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr}")
        walls.append(wall)
        out = done.stdout
    return statistics.median(walls), out


def verdict(name: str, seconds: float) -> str:
    target = TARGETS[name]
    met = seconds < target if name == "help" else seconds <= target
    sign = "<" if name == "help" else "<="
    return f"target {sign} {target:g} s: {'met' if met else 'NOT MET'}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1_000, help="runs in the store `ragexp runs` lists")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per command (median)")
    parser.add_argument("--against", metavar="REF", help="also time diff and gate of commit REF's tree (A/B)")
    parser.add_argument("--ab-only", action="store_true", help="time only the A/B of --against")
    args = parser.parse_args()
    if args.ab_only and not args.against:
        parser.error("--ab-only needs --against REF")
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db"}
        ids = []
        for name, shift in (("base", 0.0), ("cand", 0.02)):
            path = Path(tmp, f"{name}.jsonl")
            generate(path, args.cases, shift=shift, seed=len(ids) + 1)
            _, done = run([*RAGEXP, "run", f"dataset.path={path}", "provider=replay", "k=5", "--json"], env)
            if done.returncode:
                raise SystemExit(done.stderr)
            ids.append(json.loads(done.stdout)["run_id"])
        gate_args = ["gate", "--baseline", ids[0], "--candidate", ids[1], "gates=release_stat", "--json"]
        if args.against:
            a_b(args.against, Path(tmp), env, ids, gate_args, args.repeat)
            if args.ab_only:
                print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
                return
        diff_wall, diff_out = timed([*RAGEXP, "diff", *ids, "--json"], env, args.repeat)
        gate_wall, gate_out = timed([*RAGEXP, *gate_args], env, args.repeat, ok=(0, 2))
        # The same CLI with every call sent through MlflowClient: what diff and gate cost through MLflow.
        through = {**env, "RAGEXP_SQLITE_DIRECT": "0"}
        old_diff_wall, old_diff_out = timed([*RAGEXP, "diff", *ids, "--json"], through, args.repeat)
        old_gate_wall, old_gate_out = timed([*RAGEXP, *gate_args], through, args.repeat, ok=(0, 2))
        floor_wall, _ = timed([sys.executable, "-c", "import numpy"], env, args.repeat)
        help_wall, _ = timed([*RAGEXP, "--help"], env, args.repeat)
        runs_env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/many/mlflow.db"}
        fill_store(runs_env["MLFLOW_TRACKING_URI"], args.runs)
        runs_wall, runs_all_wall = time_runs(runs_env, args.runs, args.repeat)
    if json.loads(diff_out) != json.loads(old_diff_out) or json.loads(gate_out) != json.loads(old_gate_out):
        raise SystemExit("the SQLite reader and MLflow gave different results")
    metrics = json.loads(diff_out)["metrics"]
    print(f"cases: {args.cases:,} per run, {len(metrics)} metrics, 10,000 sign-flip draws each;")
    print(f"median of {args.repeat} fresh processes each")
    print(f"ragexp diff            : {diff_wall:5.2f} s  {verdict('diff', diff_wall)}")
    print(f"ragexp gate            : {gate_wall:5.2f} s  {verdict('gate', gate_wall)}  (gates=release_stat)")
    print(
        f"ragexp runs            : {runs_wall:5.2f} s  {verdict('runs', runs_wall)}  ({args.runs:,} runs in the store)"
    )
    print(f"ragexp --help          : {help_wall:5.2f} s  {verdict('help', help_wall)}")
    print("side by side:")
    print(
        f"  diff through MLflow  : {old_diff_wall:5.2f} s  (ragexp's reader is {old_diff_wall / diff_wall:.1f}x faster)"
    )
    print(
        f"  gate through MLflow  : {old_gate_wall:5.2f} s  (ragexp's reader is {old_gate_wall / gate_wall:.1f}x faster)"
    )
    print(f"  runs --limit {args.runs:<7,}: {runs_all_wall:5.2f} s  (every run listed)")
    print(f"  python -c 'import numpy': {floor_wall:5.2f} s  (the floor of any such process)")
    print("  (the same JSON from both readers, checked)")
    for m in metrics:
        ci = f"[{m['ci_low']:+.4f}, {m['ci_high']:+.4f}]" if m["ci_low"] is not None else "—"
        print(f"  {m['name']:20} delta {m['delta']:+.4f}  CI {ci}  p {m['p_value']}")
    statistics_alone(args.cases)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)")


def a_b(ref: str, tmp: Path, env: dict[str, str], ids: list[str], gate_args: list[str], repeat: int) -> None:
    """diff and gate of the same two runs by commit ``ref``'s tree (A) and this tree (B), in
    fresh processes, alternating A-B and B-A by repetition so a load that drifts falls on both."""
    tree = tmp / "against"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(HERE), "archive", ref], capture_output=True, check=False)
    if archive.returncode:
        raise SystemExit(f"--against {ref}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    sides = {"A": (tree, {**env, "PYTHONPATH": str(tree)}), "B": (HERE, {**env, "PYTHONPATH": str(HERE)})}
    commands = {"diff": ([*RAGEXP, "diff", *ids, "--json"], (0,)), "gate": ([*RAGEXP, *gate_args], (0, 2))}
    walls: dict[tuple[str, str], list[float]] = {(c, s): [] for c in commands for s in sides}
    cpus: dict[tuple[str, str], list[float]] = {(c, s): [] for c in commands for s in sides}
    outs: dict[tuple[str, str], str] = {}
    for rep in range(repeat):
        for command, (cmd, ok) in commands.items():
            for side in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                cwd, side_env = sides[side]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                wall, done = run(cmd, side_env, cwd)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if done.returncode not in ok:
                    raise SystemExit(f"{side} {' '.join(cmd)}: exit {done.returncode}\n{done.stderr}")
                walls[command, side].append(wall)
                cpus[command, side].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                outs[command, side] = done.stdout
    deltas = {side: {m["name"]: m["delta"] for m in json.loads(outs["diff", side])["metrics"]} for side in sides}
    same = all(abs(deltas["A"][name] - deltas["B"][name]) < 1e-9 for name in deltas["A"].keys() & deltas["B"].keys())
    print(f"A/B on one store, {repeat} alternating repetitions: A = {ref}, B = this tree")
    # CPU seconds (user + system of the process) move less with the machine's load than wall time.
    for command in commands:
        for kind, times in (("wall", walls), ("CPU", cpus)):
            a, b = statistics.median(times[command, "A"]), statistics.median(times[command, "B"])
            each = " ".join(f"{side} " + "/".join(f"{t:.2f}" for t in times[command, side]) for side in sides)
            print(f"  {command} {kind:4}: A {a:5.2f} s  B {b:5.2f} s  B/A {b / a:.2f}  ({each})")
    print(f"  the same delta of each metric both sides compute: {'yes' if same else 'NO'}")


def statistics_alone(count: int) -> None:
    """The paired statistics in this process, per kind of metric (no start-up, no store)."""
    import numpy as np

    from ragexp.stats.paired import paired

    rng = np.random.default_rng(0)
    kinds = {
        "binary (accuracy)": (rng.random(count) < 0.8, rng.random(count) < 0.78),
        "reciprocal rank": (1 / rng.integers(1, 8, count), 1 / rng.integers(1, 8, count)),
        "continuous (judge)": (rng.random(count), rng.random(count)),
    }
    print("paired statistics alone, in process (10,000 draws):")
    for name, (base, cand) in kinds.items():
        started = time.perf_counter()
        paired(base.astype(float), cand.astype(float), resamples=10_000, confidence=0.95, seed=0)
        print(f"  {name:20} {time.perf_counter() - started:.3f} s")


if __name__ == "__main__":
    main()

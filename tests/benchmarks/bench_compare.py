"""Benchmark: `ragexp diff` and `ragexp gate` on two logged 100,000-case runs.

    .venv/bin/python tests/benchmarks/bench_compare.py [--cases 100000]

Both runs replay generated outputs (random ranks, citations, answers and latencies) for the same
cases, so every metric has a real paired difference. Each command is timed end to end as a
fresh process (import, store, artifact download, 10,000 sign-flip draws per metric, from
which both the p-value and the inverted interval come). Target: under 5 s each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


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


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - started, done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    args = parser.parse_args()
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
        diff_wall, diff = run([*RAGEXP, "diff", *ids, "--json"], env)
        gate_wall, gate = run(
            [*RAGEXP, "gate", "--baseline", ids[0], "--candidate", ids[1], "gates=release_stat", "--json"], env
        )
        help_wall, _ = run([*RAGEXP, "--help"], env)
    metrics = json.loads(diff.stdout)["metrics"]
    print(f"cases: {args.cases:,} per run, {len(metrics)} metrics, 10,000 sign-flip draws each")
    print(f"ragexp diff : {diff_wall:5.2f} s  (exit {diff.returncode})")
    print(f"ragexp gate : {gate_wall:5.2f} s  (exit {gate.returncode}, gates=release_stat)")
    print(f"process start-up alone (ragexp --help): {help_wall:.2f} s")
    for m in metrics:
        ci = f"[{m['ci_low']:+.4f}, {m['ci_high']:+.4f}]" if m["ci_low"] is not None else "—"
        print(f"  {m['name']:20} delta {m['delta']:+.4f}  CI {ci}  p {m['p_value']}")
    statistics_alone(args.cases)


def statistics_alone(count: int) -> None:
    """The paired statistics in this process, per kind of metric (no start-up, no store)."""
    import numpy as np

    from ragexp.compare.stats import paired

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

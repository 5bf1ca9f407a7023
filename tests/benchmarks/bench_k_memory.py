"""Benchmark: peak memory of `ragexp run` at K=10 and at K=10,000 over the same retrieved lists.

Memory must follow what the system retrieved, not K: a replay dataset whose rankings hold ten ids
each is run at both K, and the peak RSS of each process is compared (target: within 1.5x).

    .venv/bin/python tests/benchmarks/bench_k_memory.py [--cases 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def write_cases(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            ranked = [f"noise-{i}-{j}" for j in range(9)] + [f"doc-{i}"]
            row = {
                "id": f"c{i}",
                "question": f"question {i}?",
                "relevant_ids": [f"doc-{i}"],
                "expected_facts": [f"fact {i}"],
                "response": f"fact {i}. [10]",
                "retrieved_ids": ranked,
                "citations": [10],
                "latency_seconds": 0.01,
            }
            out.write(json.dumps(row) + "\n")


def peak_of(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """Peak RSS (MB) of one child process, and its --json summary."""
    code = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(done.stderr)\n"
        "print(done.stdout.strip())\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    lines = out.stdout.strip().splitlines()
    return int(lines[-1]) / 1024, json.loads(lines[-2])["summary"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragexp-kmem-") as tmp:
        data = Path(tmp) / "cases.jsonl"
        write_cases(data, args.cases)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db"}
        base = [*RAGEXP, "run", "provider=replay", f"dataset.path={data}", "--json"]
        peak_of([*base, "k=10"], env)  # a first run creates the store: not measured
        small, small_summary = peak_of([*base, "k=10"], env)
        large, large_summary = peak_of([*base, "k=10000"], env)
    same = {k: v for k, v in small_summary.items() if k != "p95_seconds"} == {
        k: v for k, v in large_summary.items() if k != "p95_seconds"
    }
    print(f"cases {args.cases:,}, ten retrieved ids each")
    print(f"K=10      peak {small:7.1f} MB")
    print(f"K=10,000  peak {large:7.1f} MB   ratio {large / small:.2f}x (target <= 1.5x)")
    print(f"same scores at both K (the lists are shorter than 10): {same}")


if __name__ == "__main__":
    main()

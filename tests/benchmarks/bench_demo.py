"""Benchmark: `ragexp demo` end to end as a fresh process, against its 30 s budget.

    .venv/bin/python tests/benchmarks/bench_demo.py [--repeats 3]

Each repeat starts `ragexp demo --store DIR` in a new process with a new folder (so it pays
MLflow's import and the new SQLite store's migrations, as a newcomer does) and times the whole
process. For scale it also times one `ragexp run` of the embedded default into a new store.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
BUDGET_SECONDS = 30.0


def timed(command: list[str], expect: int = 0) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != expect:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    demo: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-demo-") as tmp:
        for repeat in range(args.repeats):
            demo.append(timed([*RAGEXP, "demo", "--store", str(Path(tmp, f"demo{repeat}"))]))
        single = timed([*RAGEXP, "run", f"tracking.uri=sqlite:///{tmp}/run/mlflow.db", "--json"])
    print(f"ragexp demo, fresh process and store ({args.repeats} runs): " + ", ".join(f"{t:.2f} s" for t in demo))
    print(f"  median {statistics.median(demo):.2f} s, worst {max(demo):.2f} s; budget {BUDGET_SECONDS:.0f} s")
    print(f"ragexp run (embedded default, fresh store): {single:.2f} s")
    if max(demo) > BUDGET_SECONDS:
        sys.exit(f"over budget: {max(demo):.2f} s > {BUDGET_SECONDS:.0f} s")


if __name__ == "__main__":
    main()

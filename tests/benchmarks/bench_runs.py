"""Benchmark: `ragexp runs` over a store with 1,000 runs, as a fresh process.

    .venv/bin/python tests/benchmarks/bench_runs.py [--runs 1000] [--repeat 3]

One real `ragexp run` (the packaged sample, fake provider) is logged, then copied through
MlflowClient into ``--runs`` runs with its tags, params and metrics (so every listed run has what a
ragexp run has). Timed: `ragexp runs` (the 20 newest, the default) and `ragexp runs --limit N`
(every run), the median of ``--repeat`` fresh processes. Target (issue 14): `ragexp runs` <= 1.5 s.
`make bench-compare` runs this too, beside diff and gate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
TARGET_S = 1.5


def fill_store(uri: str, count: int) -> None:
    """``count`` finished runs in experiment ``ragexp`` of ``uri``, each a copy of one real run."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run([*RAGEXP, "run", "provider=fake", "--json"], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr)
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    model = client.get_run(json.loads(done.stdout)["run_id"])
    tags = {k: v for k, v in model.data.tags.items() if not k.startswith("mlflow.")}
    params = [Param(k, v) for k, v in model.data.params.items()]
    for i in range(count - 1):
        run = client.create_run(model.info.experiment_id, run_name=f"copy-{i}", tags=tags)
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in model.data.metrics.items()]
        for start in range(0, len(params), 100):
            client.log_batch(run.info.run_id, params=params[start : start + 100])
        client.log_batch(run.info.run_id, metrics=metrics)
        client.set_terminated(run.info.run_id, "FINISHED")


def time_runs(env: dict[str, str], count: int, repeat: int) -> tuple[float, float]:
    """Median wall time of `ragexp runs` and of `ragexp runs --limit count` (every run listed)."""
    found: dict[str, list[float]] = {"default": [], "all": []}
    for _ in range(repeat):
        for key, extra in (("default", []), ("all", ["--limit", str(count), "--json"])):
            started = time.perf_counter()
            done = subprocess.run([*RAGEXP, "runs", *extra], capture_output=True, text=True, env=env)
            found[key].append(time.perf_counter() - started)
            if done.returncode:
                raise SystemExit(done.stderr)
            if key == "all" and len(json.loads(done.stdout)["runs"]) != count:
                raise SystemExit(f"ragexp runs --limit {count} listed {len(json.loads(done.stdout)['runs'])} runs")
    return statistics.median(found["default"]), statistics.median(found["all"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp:
        uri = f"sqlite:///{tmp}/mlruns/mlflow.db"
        fill_store(uri, args.runs)
        default, every = time_runs({**os.environ, "MLFLOW_TRACKING_URI": uri}, args.runs, args.repeat)
    met = "met" if default <= TARGET_S else "NOT MET"
    print(f"ragexp runs ({args.runs:,} runs in the store, 20 listed): {default:.2f} s  target <= {TARGET_S} s: {met}")
    print(f"ragexp runs --limit {args.runs} (every run): {every:.2f} s")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min)")


if __name__ == "__main__":
    main()

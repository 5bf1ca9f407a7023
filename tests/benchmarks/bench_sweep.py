"""Benchmark: a 12-point sweep on 1,000 cases each, serial versus the joblib launcher (2 workers)
versus Ray (a 2-CPU ``ray start --head`` on 127.0.0.1 the sweep attaches to, one point per CPU).

    .venv/bin/python tests/benchmarks/bench_sweep.py [--cases 1000]

Points: k=1..12 over a generated replay dataset (real rankings, so every point differs). Every
sweep is a fresh process against one SQLite store; wall time is end to end. The Ray cluster is
started before the sweeps (its start-up is printed apart): a sweep attaches to a running cluster.
``--cases 1`` leaves little but each launcher's own cost per point.

    .venv/bin/python tests/benchmarks/bench_sweep.py --http --cases 100

runs the same 12 points against a loopback service answering after 50 ms, one request at a time
(concurrency=1): points that wait on a service, where parallel processes pay off.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.servers
from tests.servers.ray_head import QUIET_RAY, ray_head

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def generate(path: Path, count: int) -> None:
    rng = random.Random(3)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            relevant = [f"d{i}-{j}" for j in range(rng.randint(1, 3))]
            ranked = [f"n{i}-{j}" for j in range(12)]
            for doc in relevant:
                ranked.insert(rng.randrange(0, 12), doc)
            out.write(
                json.dumps(
                    {
                        "id": f"c{i}",
                        "question": f"q{i}",
                        "relevant_ids": relevant,
                        "expected_facts": [f"f{i}"],
                        "response": f"f{i}",
                        "retrieved_ids": ranked,
                        "citations": [1],
                        "latency_seconds": 0.3,
                    }
                )
                + "\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--http", action="store_true", help="points call a 50 ms loopback service")
    args = parser.parse_args()
    server = None
    provider = ["provider=replay"]
    if args.http:
        root = Path(__file__).resolve().parents[2]
        server = subprocess.Popen(
            [sys.executable, str(root / "tests/servers/fixed_delay.py"), "--port", "0", "--delay-ms", "50"],
            stdout=subprocess.PIPE,
            text=True,
        )
        url = server.stdout.readline().split()[-1] if server.stdout else ""
        provider = ["provider=http", f"provider.system.url={url}", "concurrency=1"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp, ray_head(num_cpus=2) as cluster:
        ray_start = time.perf_counter() - started
        data = Path(tmp, "cases.jsonl")
        generate(data, args.cases)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db", **QUIET_RAY}
        sweep = [*RAGEXP, "run", "-m", *provider, f"dataset.path={data}", "k=range(1,13)", "--json"]
        subprocess.run([*RAGEXP, "run", "--json"], env=env, capture_output=True, check=True)  # store migrations
        walls = {}
        for name, extra in (
            ("serial", []),
            ("joblib, 2 workers", ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]),
            ("Ray, 2 CPUs", ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={cluster.address}"]),
        ):
            started = time.perf_counter()
            done = subprocess.run([*sweep, *extra], env=env, capture_output=True, text=True)
            walls[name] = time.perf_counter() - started
            result = json.loads(done.stdout)
            assert done.returncode == 0 and len(result["runs"]) == 12, done.stderr
    if server is not None:
        server.terminate()
    kind = "http service, 50 ms per request, concurrency 1" if args.http else "replay"
    print(f"12-point sweep (k=1..12), {args.cases:,} cases per point, {kind}; Ray head start-up {ray_start:.1f} s")
    print(f"{'':18}  {'wall':>8}  {'per point':>9}  {'vs serial':>9}")
    for name, wall in walls.items():
        print(f"{name:18}: {wall:6.2f} s  {wall / 12:7.2f} s  {walls['serial'] / wall:8.2f}x")


if __name__ == "__main__":
    main()

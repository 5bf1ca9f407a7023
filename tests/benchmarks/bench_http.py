"""Benchmark: provider=http against a loopback server that answers every request after 50 ms.

    .venv/bin/python tests/benchmarks/bench_http.py [--cases 2000] [--delay-ms 50]

Times the evaluation phase (the `evaluation_seconds` metric every run logs: all HTTP calls,
retries and checkpointing, not process start-up or logging) at concurrency 32 and 1, and
compares it with the ideal cases x delay / concurrency. Targets: within 1.25x the ideal at 32,
at least 15x faster than at 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/servers/fixed_delay.py"), "--port", "0", "--delay-ms", str(args.delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split()[-1] if server.stdout else ""
        with tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp:
            data = Path(tmp, "cases.jsonl")
            data.write_text(
                "".join(
                    json.dumps(
                        {"id": f"c{i}", "question": f"q{i}", "relevant_ids": ["d0"], "expected_facts": ["answer"]}
                    )
                    + "\n"
                    for i in range(args.cases)
                )
            )
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db"}
            timings = {}
            for concurrency in (32, 1):
                done = subprocess.run(
                    [
                        *RAGEXP,
                        "run",
                        "provider=http",
                        f"provider.system.url={url}",
                        f"dataset.path={data}",
                        f"concurrency={concurrency}",
                        "k=3",
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                run_id = json.loads(done.stdout)["run_id"]
                from mlflow.tracking import MlflowClient

                metrics = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(run_id).data.metrics
                timings[concurrency] = metrics["evaluation_seconds"]
                assert metrics["error_count"] == 0, metrics
    finally:
        server.terminate()
    ideal = args.cases * args.delay_ms / 1000 / 32
    print(f"{args.cases} cases, server delay {args.delay_ms:g} ms")
    ratio = timings[32] / ideal
    print(f"concurrency 32: {timings[32]:6.2f} s   ideal {ideal:.2f} s   ratio {ratio:.2f}x (target <= 1.25x)")
    print(f"concurrency  1: {timings[1]:6.2f} s   speed-up at 32: {timings[1] / timings[32]:.1f}x (target >= 15x)")


if __name__ == "__main__":
    main()

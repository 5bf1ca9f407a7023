"""Benchmark: what describing a system in config costs, side by side in one run.

    .venv/bin/python tests/benchmarks/bench_systems.py [--cases 2000] [--delay-ms 50] [--concurrency 32]

Each row is a 2,000-case `ragexp run` against a loopback service whose every reply takes 50 ms,
at concurrency 32: ragexp's own contract (native), the same service behind a request template and
JMESPath response mapping (mapped), and the mapped reply streamed as server-sent events over the
50 ms (sse). Each is timed by the `evaluation_seconds` metric the run logs (every call, retry and
checkpoint; not start-up or logging), the fastest of `--repeat` alternating rounds, and compared
with the ideal cases x delay / concurrency. Target: every row within 1.1x of its ideal. The
table also shows each row against the native row of the same run and the CPU seconds of its
process, which a loaded machine disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
TARGET = 1.1


@dataclass
class Setup:
    cases: int
    delay_ms: float
    concurrency: int
    url: str
    """The loopback HTTP service (tests/servers/bench_service.py)."""
    data: Path
    env: dict[str, str]


@dataclass
class Row:
    name: str
    seconds: float
    ideal: float
    target: float
    cpu: float
    """CPU seconds of the run's process, start-up and logging included: what the row costs the
    machine, steadier than wall time when other work shares the cores."""


MAPPED = [
    "system=http",
    "+provider.system.request={input: {text: '{question}'}, top_k: '{k}'}",
    "provider.system.response.answer=data.reply",
    "provider.system.response.ranked_ids='data.hits[].id'",
    "provider.system.response.contexts='data.hits[].text'",
    "provider.system.response.citation_pattern='\\[(\\d+)\\]'",
]


def evaluate(setup: Setup, overrides: list[str]) -> tuple[float, float]:
    """(evaluation seconds, CPU seconds of the whole ``ragexp run`` process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*RAGEXP, "run", *overrides, f"dataset.path={setup.data}", f"concurrency={setup.concurrency}", "k=3", "--json"],
        capture_output=True,
        text=True,
        env=setup.env,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"ragexp run failed: {done.stderr.strip()}")
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(setup.env["MLFLOW_TRACKING_URI"]).get_run(json.loads(done.stdout)["run_id"]).data.metrics
    if metrics["error_count"]:
        raise SystemExit(f"{metrics['error_count']:g} cases errored")
    return float(metrics["evaluation_seconds"]), cpu


def ideal(setup: Setup) -> float:
    return setup.cases * setup.delay_ms / 1000 / setup.concurrency


def native(setup: Setup) -> Row:
    seconds, cpu = evaluate(setup, ["system=http", f"provider.system.url={setup.url}/query"])
    return Row("http native", seconds, ideal(setup), TARGET, cpu)


def mapped(setup: Setup) -> Row:
    seconds, cpu = evaluate(setup, [*MAPPED, f"provider.system.url={setup.url}/mapped"])
    return Row("http mapped", seconds, ideal(setup), TARGET, cpu)


def sse(setup: Setup) -> Row:
    streamed = [
        *MAPPED[:2],
        "provider.system.stream.format=sse",
        "provider.system.stream.delta=delta",
        "provider.system.response.ranked_ids='hits[].id'",
        "provider.system.response.contexts='hits[].text'",
        "provider.system.response.citation_pattern='\\[(\\d+)\\]'",
    ]
    seconds, cpu = evaluate(setup, [*streamed, f"provider.system.url={setup.url}/sse"])
    return Row("http sse-streamed", seconds, ideal(setup), TARGET, cpu)


ROWS: list[Callable[[Setup], Row]] = [
    native,
    mapped,
    sse,
]
"""Every HTTP row of the table, run in this order against one service and one dataset; the Python
systems' rows (bench_python_systems.py) follow in the same run."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="rounds over every row; each row keeps its fastest")
    parser.add_argument("--no-python", dest="python", action="store_false", help="leave out the Python rows")
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/servers/bench_service.py"), "--port", "0", "--delay-ms", str(args.delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: list[Row] = []
    load = os.getloadavg()
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
            # The first run into a new store pays MLflow's import and schema set-up: not any row's.
            warm = Path(tmp, "warm.jsonl")
            warm.write_text(data.read_text().split("\n", 1)[0] + "\n")
            evaluate(Setup(1, args.delay_ms, 1, url, warm, env), ["system=http", f"provider.system.url={url}/query"])
            setup = Setup(args.cases, args.delay_ms, args.concurrency, url, data, env)
            # Rounds alternate the rows, so a burst of load from elsewhere does not land on one row.
            for _ in range(args.repeat):
                for index, row in enumerate(ROWS):
                    measured = row(setup)
                    if index == len(rows):
                        rows.append(measured)
                    elif measured.seconds < rows[index].seconds:
                        rows[index] = measured
    finally:
        server.terminate()
    print(
        f"{args.cases} cases, every reply {args.delay_ms:g} ms, concurrency {args.concurrency}, "
        f"fastest of {args.repeat} alternating rounds"
    )
    # The last column isolates what a row adds over the native path measured in the same run
    # (on a loaded machine every row, native included, is further from its ideal).
    print(f"load average before and after: {load[0]:.1f}, {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print(f"{'system':<22}{'seconds':>9}{'ideal':>9}{'ratio':>8}  {'target':<14}{'vs native':>9}{'cpu s':>8}")
    for row in rows:
        ratio = row.seconds / row.ideal
        verdict = "ok" if ratio <= row.target else "MISSED"
        versus = row.seconds / rows[0].seconds
        print(
            f"{row.name:<22}{row.seconds:>9.2f}{row.ideal:>9.2f}{ratio:>7.2f}x  <= {row.target:g}x {verdict:<7}"
            f"{versus:>8.2f}x{row.cpu:>8.2f}"
        )
    if args.python:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_python_systems import print_rows

        print("python systems (system=python):")
        print_rows(args.cases)


if __name__ == "__main__":
    main()

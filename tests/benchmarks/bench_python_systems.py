"""Benchmark: ``system=python``, a pipeline called in-process.

    .venv/bin/python tests/benchmarks/bench_python_systems.py [--cases 2000] [--instant 100000]

Three rows, each from fresh ``ragexp run`` processes on a generated JSONL set:

- a sync function that sleeps 10 ms, at concurrency 8, and an async one that awaits 10 ms, at
  concurrency 32: the evaluation phase (the ``evaluation_seconds`` metric every run logs) against
  the ideal cases x 10 ms / concurrency. Target: within 1.15x.
- a function that returns at once (a perfect answer, as the fake provider's in bench_run.py, so
  no case is traced past ``tracking.traces_max_cases``): ragexp's cost per case (CPU time, user + system, of the whole
  run at ``--instant`` cases less that of a 10-case run) against a plain loop over the same
  file that calls the function, builds each output and scores it with ragexp's offline kernels
  (``build_inputs`` + ``score_cases``), its cost per case taken the same way, as written (the
  cyclic collector on, like bench_run.py's loop) and with the collector off. Target: within 2x.

:func:`rows` returns the figures (for ``make bench-systems`` to print beside the HTTP rows);
running the file prints them with a verdict each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
DELAY_S = 0.01
SMALL = 10

PIPELINE = """
import asyncio, time

def sleepy(question, case_id):
    time.sleep(0.01)
    return {"answer": "fact " + case_id, "ranked_ids": ["d0", "d1"], "contexts": ["a", "b"], "citations": [1]}

async def sleepy_async(question, case_id):
    await asyncio.sleep(0.01)
    return {"answer": "fact " + case_id, "ranked_ids": ["d0", "d1"], "contexts": ["a", "b"], "citations": [1]}

def instant(question, case_id):
    return {"answer": "fact " + case_id, "ranked_ids": ["d0", "d1"], "contexts": ["a", "b"], "citations": [1]}
"""

LOOP = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from bench_pipeline import instant
from ragexp.datasets.loader import load_dataset
from ragexp.metrics.offline import build_inputs
from ragexp.metrics.registry import parse_metric_names
from ragexp.metrics.summary import score_cases
from ragexp.records import CaseResult, SystemOutput
from pathlib import Path

dataset = load_dataset(Path(sys.argv[1]), "jsonl")
results = []
for case in dataset.cases:
    reply = instant(case.question, case.id)
    output = SystemOutput(reply["ranked_ids"], reply["contexts"], reply["answer"], reply["citations"], 0.0, None)
    results.append(CaseResult(case.id, output))
inputs = build_inputs(dataset.cases, results, 2, [])
names = ["recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy", "p95_seconds", "error_rate"]
scores = score_cases(parse_metric_names(names), inputs)
print(json.dumps({name: float(values.mean()) for name, values in scores.items()}))
"""


def generate(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            row = {"id": f"c{i}", "question": f"q{i}", "relevant_ids": ["d0"], "expected_facts": [f"fact c{i}"]}
            out.write(json.dumps(row) + "\n")
    return path


def cpu_of(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """CPU seconds (user + system) of one child process, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed:\n{done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def ragexp_run(data: Path, code: Path, target: str, concurrency: int, env: dict[str, str]) -> tuple[float, Any]:
    cmd = [
        *RAGEXP,
        "run",
        "system=python",
        f"provider.system.target=bench_pipeline:{target}",
        f"provider.system.path={code}",
        f"dataset.path={data}",
        f"concurrency={concurrency}",
        "k=2",
        "metrics=offline",
        "--json",
    ]
    cpu, stdout = cpu_of(cmd, env)
    return cpu, json.loads(stdout)


FLOOR = r"""
import asyncio, sys, time

async def one(gate):
    async with gate:
        await asyncio.sleep(0.01)

async def main(count, concurrency):
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    await asyncio.gather(*(one(gate) for _ in range(count)))
    print(time.perf_counter() - started)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""
"""The same awaits on a bare event loop: asyncio.sleep overshoots each 10 ms by its timer
granularity and the machine's scheduling, which no caller can beat."""


def rows(cases: int = 2000, instant: int = 100_000) -> list[dict[str, Any]]:
    """One dict per benchmark row: name, measured, ideal (or baseline), ratio, target."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-python-") as tmp:
        folder = Path(tmp)
        code = folder / "code"
        code.mkdir()
        (code / "bench_pipeline.py").write_text(PIPELINE)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlruns/mlflow.db"}
        small = generate(folder / "small.jsonl", SMALL)
        ragexp_run(small, code, "instant", 8, env)  # lets MLflow create the store, untimed
        from mlflow.tracking import MlflowClient

        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        data = generate(folder / "cases.jsonl", cases)
        for target, concurrency in (("sleepy", 8), ("sleepy_async", 32)):
            _, payload = ragexp_run(data, code, target, concurrency, env)
            metrics = client.get_run(payload["run_id"]).data.metrics
            if metrics["error_count"]:
                raise SystemExit(f"{target}: {metrics['error_count']:.0f} cases errored")
            ideal = cases * DELAY_S / concurrency
            seconds = metrics["evaluation_seconds"]
            kind = "async" if target.endswith("async") else "sync"
            row = {
                "name": f"python {kind} 10 ms x {cases}, concurrency {concurrency}",
                "measured": seconds,
                "reference": ideal,
                "reference_name": "ideal N*L/C",
                "ratio": seconds / ideal,
                "target": 1.15,
            }
            if kind == "async":
                _, floor = cpu_of([sys.executable, "-c", FLOOR, str(cases), str(concurrency)], env)
                row["floor"] = float(floor)
            out.append(row)
        big = generate(folder / "big.jsonl", instant)
        ours_small, _ = ragexp_run(small, code, "instant", 8, env)
        started = time.perf_counter()
        ours_big, payload = ragexp_run(big, code, "instant", 8, env)
        wall = time.perf_counter() - started
        if payload["error_count"]:
            raise SystemExit(f"instant: {payload['error_count']} cases errored")
        loop_small, _ = cpu_of([sys.executable, "-c", LOOP, str(small), str(code)], env)
        loop_big, _ = cpu_of([sys.executable, "-c", LOOP, str(big), str(code)], env)
        ours = (ours_big - ours_small) / (instant - SMALL)
        loop = (loop_big - loop_small) / (instant - SMALL)
        # The same loop with the cyclic collector off (as ragexp's CLI runs): what is left is
        # the work itself, without the collector's rescans of the growing result list.
        strict = "import gc\ngc.disable()\n" + LOOP
        strict_small, _ = cpu_of([sys.executable, "-c", strict, str(small), str(code)], env)
        strict_big, _ = cpu_of([sys.executable, "-c", strict, str(big), str(code)], env)
        loop_no_gc = (strict_big - strict_small) / (instant - SMALL)
        out.append(
            {
                "name": f"python instant x {instant}: CPU per case (run wall {wall:.1f} s)",
                "measured": ours,
                "reference": loop,
                "reference_name": "plain loop + offline kernels",
                "ratio": ours / loop,
                "target": 2.0,
                "loop_no_gc": loop_no_gc,
            }
        )
    return out


def print_rows(cases: int = 2000, instant: int = 100_000) -> None:
    """The Python rows, one line each (``make bench-systems`` prints them after the HTTP table)."""
    for row in rows(cases, instant):
        verdict = "met" if row["ratio"] <= row["target"] else "NOT MET"
        unit = "s" if row["measured"] > 0.01 else "us"
        scale = 1.0 if unit == "s" else 1e6
        floor = (
            f"; a bare asyncio loop: {row['floor']:.2f} s, {row['floor'] / row['reference']:.2f}x"
            if "floor" in row
            else ""
        )
        if "loop_no_gc" in row:
            no_gc = row["loop_no_gc"]
            floor = f"; the loop with gc off: {no_gc * 1e6:.2f} us, {row['measured'] / no_gc:.2f}x"
        print(
            f"{row['name']}: {row['measured'] * scale:.2f} {unit} vs {row['reference_name']} "
            f"{row['reference'] * scale:.2f} {unit}: {row['ratio']:.2f}x "
            f"(target <= {row['target']:g}x, {verdict}){floor}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--instant", type=int, default=100_000)
    args = parser.parse_args()
    print_rows(args.cases, args.instant)


if __name__ == "__main__":
    main()

"""Benchmark: conversations, each turn asked after the ones before it, conversations side by side.

    .venv/bin/python tests/benchmarks/bench_conversations.py [--conversations 200] [--turns 3]
        [--delay-ms 50] [--concurrency 32]

A ``system=python`` target that sleeps the delay per call (a sync function, on ragexp's worker
threads) answers a generated set of conversations; the evaluation phase (the
``evaluation_seconds`` metric every run logs) is set against the ideal: the sum of every
conversation's turn latencies divided by the concurrency. Target: within 1.15x. The target also
checks, on every call, that it received the history of the turns before (a turn asked out of
order would be an error, and the benchmark refuses a run with any). The same questions as single
cases, in the same run, show what the calls alone cost on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
TARGET = 1.15

PIPELINE = """
import os, time

DELAY = float(os.environ["BENCH_DELAY_S"])

def chat(question, case_id, history):
    turn = int(case_id.rsplit("#", 1)[1]) if "#" in case_id else 1
    if len(history) != 2 * (turn - 1):
        raise RuntimeError(f"{case_id} asked with {len(history)} messages of history")
    time.sleep(DELAY)
    return {"answer": "fact " + question, "ranked_ids": ["d0", "d1"], "contexts": ["a", "b"], "citations": [1]}
"""


def generate(path: Path, conversations: int, turns: int, *, flat: bool = False) -> Path:
    """``conversations`` of ``turns`` each; ``flat``: the same questions as single cases."""
    with path.open("w", encoding="utf-8") as out:
        for c in range(conversations):
            steps = [{"question": f"q{c}-{t}", "relevant_ids": ["d0"]} for t in range(turns)]
            if flat:
                for t, step in enumerate(steps):
                    out.write(json.dumps({"id": f"single-{c}-{t}", **step}) + "\n")
            else:
                out.write(json.dumps({"id": f"conv-{c}", "turns": steps}) + "\n")
    return path


def run(data: Path, code: Path, concurrency: int, env: dict[str, str]) -> dict[str, Any]:
    cmd = [
        *RAGEXP,
        "run",
        "system=python",
        "provider.system.target=bench_chat:chat",
        f"provider.system.path={code}",
        f"dataset.path={data}",
        f"concurrency={concurrency}",
        "k=2",
        "metrics.names=[recall_at_k]",
        "tracking.traces=false",
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ragexp run failed: {done.stderr.strip()}")
    payload: dict[str, Any] = json.loads(done.stdout)
    return payload


def measure(conversations: int, turns: int, delay_s: float, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-chat-") as tmp:
        folder = Path(tmp)
        (folder / "bench_chat.py").write_text(PIPELINE, encoding="utf-8")
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlruns/mlflow.db",
            "BENCH_DELAY_S": str(delay_s),
        }
        run(generate(folder / "small.jsonl", 2, 2), folder, concurrency, env)  # the store is created, untimed
        payload = run(generate(folder / "chats.jsonl", conversations, turns), folder, concurrency, env)
        flat = run(generate(folder / "flat.jsonl", conversations, turns, flat=True), folder, concurrency, env)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        metrics = client.get_run(payload["run_id"]).data.metrics
        alone = client.get_run(flat["run_id"]).data.metrics
    if metrics["error_count"] or alone["error_count"]:
        raise SystemExit(f"{metrics['error_count'] + alone['error_count']:.0f} turns errored")
    ideal = conversations * turns * delay_s / concurrency
    seconds = metrics["evaluation_seconds"]
    return {
        "name": (
            f"{conversations} conversations x {turns} turns, {delay_s * 1000:g} ms a turn, concurrency {concurrency}"
        ),
        "measured": seconds,
        "ideal": ideal,
        "ratio": seconds / ideal,
        "target": TARGET,
        "flat": alone["evaluation_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    row = measure(args.conversations, args.turns, args.delay_ms / 1000, args.concurrency)
    verdict = "ok" if row["ratio"] <= row["target"] else "OVER TARGET"
    print(
        f"{row['name']}: {row['measured']:.3f} s, ideal {row['ideal']:.3f} s, "
        f"{row['ratio']:.3f}x (target <= {row['target']}x): {verdict}"
    )
    print(
        f"the same {args.conversations * args.turns} questions as single cases: {row['flat']:.3f} s, "
        f"{row['flat'] / row['ideal']:.3f}x the ideal (what the system's calls alone cost on this machine)"
    )


if __name__ == "__main__":
    main()

"""Benchmark: metrics=core with a loopback judge that answers every call after 100 ms.

    .venv/bin/python tests/benchmarks/bench_judge.py [--cases 200] [--concurrency 32]

First run: the judging phase (`judge.seconds`, all calls through ragas) against the ideal
calls x 0.1 s / concurrency, counting every chat and embeddings call the judge served.
Second, identical run: it must make no judge call; its wall time (a fresh process) is compared
with an offline run of the same dataset. Targets: within 1.5x the ideal; under 1.2x offline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]

from tests.servers.procs import serve, stats  # noqa: E402


def dataset(path: Path, count: int) -> None:
    topics = ["退款", "发票", "物流", "会员", "保修", "积分", "优惠券", "支付"]
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            topic = topics[i % len(topics)]
            fact = f"{topic}规则第{i}条：处理时间为{i % 7 + 1}个工作日。"
            out.write(
                json.dumps(
                    {
                        "id": f"c{i}",
                        "question": f"{topic}第{i}条规则的处理时间是多久？",
                        "relevant_ids": [f"d{i}"],
                        "expected_facts": [f"{i % 7 + 1}个工作日"],
                        "reference": fact,
                        "response": f"根据{topic}规则，处理时间为{i % 7 + 1}个工作日。",
                        "retrieved_ids": [f"d{i}", f"n{i}"],
                        "retrieved_contexts": [fact, f"{topics[(i + 1) % len(topics)]}的其他说明。"],
                        "citations": [1],
                        "latency_seconds": 0.5,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr)
    return time.perf_counter() - started, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=100.0)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp,
        serve(ROOT / "tests/servers/judge.py", "--delay-ms", str(args.delay_ms)) as url,
    ):
        data = Path(tmp, "cases.jsonl")
        dataset(data, args.cases)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db"}
        common = [f"dataset.path={data}", "dataset.name=bench"]
        judge = [
            *RAGEXP,
            "run",
            *common,
            "provider=replay_judge",
            "metrics=core",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=null",
            f"provider.judge.concurrency={args.concurrency}",
            "--json",
        ]
        timed([*RAGEXP, "run", *common, "provider=replay", "--json"], env)  # store migrations, once
        _, first = timed(judge, env)
        served = stats(url)
        calls = served["chat"] + served["embeddings"]
        from mlflow.tracking import MlflowClient

        metrics = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(str(first["run_id"])).data.metrics
        again_wall, _ = timed(judge, env)
        again_calls = stats(url)["chat"] + stats(url)["embeddings"] - calls
        offline_wall, _ = timed([*RAGEXP, "run", *common, "provider=replay", "--json"], env)
    ideal = calls * args.delay_ms / 1000 / args.concurrency
    print(f"{args.cases} cases, metrics=core, judge delay {args.delay_ms:g} ms, concurrency {args.concurrency}")
    print(
        f"first run : {served['chat']} chat + {served['embeddings']} embedding calls, judging "
        f"{metrics['judge.seconds']:.2f} s, ideal {ideal:.2f} s, ratio {metrics['judge.seconds'] / ideal:.2f}x "
        "(target <= 1.5x)"
    )
    print(
        f"second run: {again_calls} judge calls, {again_wall:.2f} s; offline run of the same dataset "
        f"{offline_wall:.2f} s; ratio {again_wall / offline_wall:.2f}x (target < 1.2x)"
    )


if __name__ == "__main__":
    main()

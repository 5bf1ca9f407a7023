"""Benchmark: `ragexp run` on 100,000 cases against a plain per-case Python loop.

Both sides read the same generated JSONL, build the fake provider's outputs from the labels,
compute the same offline metrics and write every case out. The loop is the first seed's chain
(per-case functions, a JSON report written with indent=2); ragexp also validates the dataset and
logs the run, every case and the table to a SQLite MLflow store.

    .venv/bin/python tests/benchmarks/bench_run.py [--cases 100000]

Prints wall times, peak memory (RSS of each child process) and the ratio, plus `ragexp --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]

LOOP = r"""
import json, math, sys, time
from statistics import fmean
from math import ceil

def recall_at_k(ranked, relevant, k):
    return len(set(ranked[:k]) & relevant) / len(relevant) if relevant else 0.0

def rr(ranked, relevant):
    for rank, item in enumerate(ranked, start=1):
        if item in relevant:
            return 1.0 / rank
    return 0.0

def ndcg(ranked, relevant, k):
    if not relevant:
        return 0.0
    dcg = sum(1.0 / math.log2(r + 1) for r, i in enumerate(ranked[:k], start=1) if i in relevant)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(relevant), k) + 1))
    return dcg / ideal if ideal else 0.0

def citation_precision(cited, supported):
    return sum(n in supported for n in cited) / len(cited) if cited else 0.0

path, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
cases = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
results = []
for case in cases:
    started = time.perf_counter()
    unanswerable = case.get("unanswerable", False)
    if unanswerable:
        ranked, answer, cited = [], "没有足够证据", []
    else:
        ranked = case["relevant_ids"][:k]
        answer = "，".join(case["expected_facts"]) + "。[1]"
        cited = [1]
    latency = time.perf_counter() - started
    relevant = set(case.get("relevant_ids", []))
    supported = {i + 1 for i, d in enumerate(ranked) if d in relevant}
    if unanswerable and not ranked:
        r = m = n = 1.0
    else:
        r, m, n = recall_at_k(ranked, relevant, k), rr(ranked, relevant), ndcg(ranked, relevant, k)
    if unanswerable:
        correct = any(t in answer for t in ("没有足够证据", "无法回答", "证据不足"))
    else:
        correct = all(f in answer for f in case["expected_facts"])
    precision = citation_precision(cited, supported) if cited else (1.0 if unanswerable else 0.0)
    results.append({"id": case["id"], "question": case["question"], "ranked_ids": ranked, "answer": answer,
                    "recall_at_k": r, "mrr": m, "ndcg_at_k": n, "citation_precision": precision,
                    "answer_correct": correct, "latency_seconds": latency})
answerable = [x for x, c in zip(results, cases) if not c.get("unanswerable")] or results
lat = sorted(x["latency_seconds"] for x in results)
summary = {"recall_at_k": fmean(x["recall_at_k"] for x in answerable), "mrr": fmean(x["mrr"] for x in answerable),
           "ndcg_at_k": fmean(x["ndcg_at_k"] for x in answerable),
           "citation_precision": fmean(x["citation_precision"] for x in results),
           "answer_accuracy": fmean(x["answer_correct"] for x in results),
           "p95_seconds": lat[max(0, ceil(len(lat) * 0.95) - 1)]}
with open(out, "w", encoding="utf-8") as f:
    f.write(json.dumps({"summary": summary, "cases": results}, ensure_ascii=False, indent=2))
print(json.dumps(summary))
"""


def generate(path: Path, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            if i % 10 == 9:
                row = {"id": f"c{i}", "question": f"问题 {i}：这个问题知识库答不了？", "unanswerable": True}
            else:
                rel = [f"doc-{rng.randrange(1_000_000)}" for _ in range(rng.randint(1, 3))]
                row = {
                    "id": f"c{i}",
                    "question": f"问题 {i}：关于 {rel[0]} 的政策是什么？",
                    "relevant_ids": rel,
                    "expected_facts": [f"事实{rng.randrange(1000)}", f"条款{rng.randrange(100)}"],
                    "reference": f"参考答案 {i}。",
                }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds and peak RSS (MB) of one child process."""
    script = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter(); p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "w = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'wall': w, 'rss': rss, 'rc': p.returncode, 'out': p.stdout, 'err': p.stderr}))"
    )
    done = subprocess.run([sys.executable, "-c", script, *cmd], capture_output=True, text=True, env=env, check=True)
    data = json.loads(done.stdout)
    proc = subprocess.CompletedProcess(cmd, data["rc"], data["out"], data["err"])
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return data["wall"], data["rss"], proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-") as tmp:
        big, small = Path(tmp, "cases.jsonl"), Path(tmp, "small.jsonl")
        generate(big, args.cases)
        generate(small, 10)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlruns/mlflow.db"}

        def ours(path: Path) -> tuple[float, float, subprocess.CompletedProcess[str]]:
            return timed([*RAGEXP, "run", f"dataset.path={path}", "provider=fake", f"k={args.k}", "--json"], env)

        def loop(path: Path) -> tuple[float, float, subprocess.CompletedProcess[str]]:
            return timed([sys.executable, "-c", LOOP, str(path), f"{tmp}/report.json", str(args.k)], env)

        # The first run on a new store pays MLflow's schema migrations once; time it apart.
        first, _, _ = ours(small)
        ours_small, _, _ = ours(small)
        loop_small, _, _ = loop(small)
        loop_wall, loop_rss, _ = loop(big)
        ours_wall, ours_rss, proc = ours(big)
        summary = json.loads(proc.stdout)
        help_wall, _, _ = timed([str(Path(sys.executable).parent / "ragexp"), "--help"], env)
    ours_marginal, loop_marginal = ours_wall - ours_small, loop_wall - loop_small
    print(f"cases: {args.cases:,}  k={args.k}  ({summary['case_count']:,} evaluated, {summary['error_count']} errors)")
    print(f"                       {'10 cases':>10} {f'{args.cases:,} cases':>14} {'marginal':>10} {'peak RSS':>10}")
    print(f"plain loop + JSON    : {loop_small:9.2f}s {loop_wall:13.2f}s {loop_marginal:9.2f}s {loop_rss:7.0f} MB")
    print(f"ragexp run (logged)  : {ours_small:9.2f}s {ours_wall:13.2f}s {ours_marginal:9.2f}s {ours_rss:7.0f} MB")
    print(f"ratio, whole runs    : {ours_wall / loop_wall:.2f}x")
    print(f"ratio, per-case cost : {ours_marginal / loop_marginal:.2f}x  (target <= 0.5x; peak < 600 MB)")
    print(f"first run, new store : {first:.2f}s (one-time MLflow schema migrations)")
    print(f"ragexp --help        : {help_wall:.2f}s (target < 0.5 s)")


if __name__ == "__main__":
    main()
